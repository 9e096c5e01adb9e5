"""response_query: DuckDB SQL over one offloaded result, read-only and confined to it.

Each result is converted once to a DuckDB file beside it (`.<name>.duckdb`, removed with the result by
the TTL and `clean`). Each shape has a loader of its own (`loaders.py`): `table_json` (arrays of records
and maps, the largest `items`, and `doc`), `table_csv` (typed columns, missing values NULL),
`table_jsonl`, and `table_lines` (`lines(n, text)` for every text result). A query then opens that file
read-only, with DuckDB's own controls: no file or network access (`enable_external_access = false`), the
configuration locked, bounded threads, memory and time.

Every conversion and every query runs in a process of its own (`sql_worker.py`) with its address space
capped: what one caller's SQL does to memory ends that process, never the shared gateway, and the
gateway reads back at most ANSWER_BYTES of rows. A process past its time is killed, and so is every
running one when the gateway stops. Queries on one result run side by side (each process opens the
file read-only); conversions of different results never wait for each other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import anyio.from_thread
import anyio.lowlevel
from anyio import NoEventLoopError

import plugins.offload.table_json as table_json
from gateway.args import ToolInputError
from gateway.services import shares
from gateway.services.files import VersionedCache, atomic_write, process_alive, temp_beside
from plugins.offload.json_file import BrokenJSON
from plugins.offload.paths import PathError
from plugins.offload.sql_worker import LINE_BYTES, PARENT_ENV, TIME_EXIT
from plugins.offload.tables import Table

log = logging.getLogger("plugins.offload")
QUERY_SECONDS = 20.0  # a query's computation (its process's own clock: the gateway's reading is not counted)
QUERY_WALL = 120.0  # ...and its process's life, reading and saving its rows included
MEMORY_LIMIT = "256MB"  # a query's working memory; beyond it DuckDB spills to disk...
TEMP_LIMIT = "1GB"  # ...at most this much, into a folder of the query's own, removed when it ends
ADDRESS_SPACE = 2 * 1024**3  # what a worker process may map in all (DuckDB's chunks of rows included)
BUILD_SECONDS = 120.0  # a conversion taking longer is stopped (slices and search still answer)
BUILD_MEMORY_LIMIT = "48MB"  # a conversion's working memory (its worker peaks near 90 MB for 68 MB of JSON)...
BUILD_MEMORY_CEILING = "256MB"  # ...raised once to this for a statement needing more (long records, wide rows)
SLICE_SECONDS = 20.0  # a JSONPath over a large result
KILL_GRACE = 5.0  # past its wall time and this, the parent kills a worker that did not end itself
THREADS = 2
ANSWER_BYTES = 64 * 1024 * 1024  # what one answer may read back, as JSON
_TABLES: VersionedCache[list[Table]] = VersionedCache(max_items=32)
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding `plugins`
_TEMP_PREFIX = "ctx-sql-"
_SWEPT = threading.Event()


class QueryError(ValueError):
    """A query DuckDB refused or could not run; the message says what is allowed."""


def db_path(result: Path) -> Path:
    return result.with_name(f".{result.name}.duckdb")


def profile_path(result: Path) -> Path:
    """The tables' profile, saved beside the DuckDB file: a cache miss reads it instead of converting."""
    return result.with_name(f".{result.name}.duckdb.json")


@contextmanager
def _slot(namespace: str, token: Any = None) -> Iterator[None]:
    """One of the caller's places for worker processes (`shares.worker_pool`), held for the block.
    Outside a running gateway (a command, a test calling these functions) there is no loop and one user."""
    try:
        held = shares.worker_pool().slot_in_thread(namespace, token)
        held.__enter__()
    except NoEventLoopError:
        yield
        return
    try:
        yield
    finally:
        held.__exit__(None, None, None)


def _private_temp() -> Path:
    """A fresh folder for one query's spill files, outside the responses folder (nothing a later query or
    a restart reads); those left by a gateway that was killed are removed at the first query."""
    base = Path(tempfile.gettempdir())
    if not _SWEPT.is_set():
        _SWEPT.set()
        for old in base.glob(f"{_TEMP_PREFIX}*-*"):
            pid = old.name.removeprefix(_TEMP_PREFIX).partition("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=base))


class _Worker:
    """One `sql_worker` process: started with its request, read line by line (no line longer than a
    worker sends), ended when the block that started it ends. It keeps its own time and dies with the
    gateway; the parent kills it only past its wall time (a worker that could not end itself)."""

    def __init__(self, request: dict[str, Any], seconds: float, wall: float):
        path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        self.temp = _private_temp() if request["op"] == "query" else None
        if self.temp is not None:
            request = {**request, "temp_directory": str(self.temp)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plugins.offload.sql_worker", str(wall)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path, PARENT_ENV: str(os.getpid())},
            cwd=_ROOT,
        )
        self.seconds, self.wall = seconds, wall
        self.size = 0
        self.timed_out = False
        self.broken = ""  # why the last line was not a message (cut, too long, not JSON)
        self.timer = threading.Timer(wall + KILL_GRACE, self._time_up)
        with _RUNNING_LOCK:
            _RUNNING.add(self.proc)
        self.timer.start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = self.proc.stdout
        message = {**request, "address_space": ADDRESS_SPACE, "seconds": seconds}
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.close()
        except OSError:  # it died at once: its missing answer says so
            pass

    def _time_up(self) -> None:
        self.timed_out = True
        self.proc.kill()

    def message(self) -> dict[str, Any] | None:
        """The next message, or None when the process is gone or sent a line that is not one (`broken`
        says which; `size`: the line's bytes)."""
        line = self.out.readline(LINE_BYTES)
        self.size = len(line)
        if not line:
            return None
        if not line.endswith(b"\n"):
            self.broken = "too long" if len(line) >= LINE_BYTES else "cut"
            return None
        try:
            return json.loads(line)
        except ValueError:
            self.broken = "not JSON"
            return None

    def failure(self, message: dict[str, Any] | None, what: str) -> QueryError:
        """What went wrong, as the model should read it."""
        if message is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)  # why it ended: its own wall time, a kill, memory
        own_end = (TIME_EXIT, -getattr(signal, "SIGALRM", TIME_EXIT))  # it stopped itself at its time
        if (message or {}).get("kind") == "time" or self.timed_out or self.proc.returncode in own_end:
            return QueryError(f"{what} ran longer than {self.seconds:.0f} s and was stopped; narrow it")
        if message is None and self.broken == "too long":
            return QueryError(f"{what} sent more at once than one answer may hold and was stopped; narrow it")
        if message is None and self.broken and self.proc.returncode not in (None, 0, -signal.SIGKILL):
            return QueryError(f"{what} ended in the middle of its answer and was stopped; narrow it")
        if message is None or message.get("kind") == "memory":
            return QueryError(f"{what} needed more memory than one may use and was stopped; narrow it")
        if message.get("kind") == "permission":
            return QueryError(
                "that reads or writes outside this result, which response_query does not allow "
                f"(only this result's tables can be queried): {message['error']}"
            )
        if message.get("kind") == "sql":
            return QueryError(message["error"])
        if message.get("kind") == "duckdb":
            return QueryError(f"DuckDB: {message['error']}")
        return QueryError(f"this result could not be turned into tables ({message.get('error')})")

    def end(self) -> None:
        self.timer.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.out.close()
        with _RUNNING_LOCK:
            _RUNNING.discard(self.proc)
        if self.temp is not None:  # what the query wrote is gone with it
            shutil.rmtree(self.temp, ignore_errors=True)


def build(result: Path, kind: str, namespace: str = "") -> list[Table]:
    """The DuckDB file for a result (built once per file version, in a worker process within
    `namespace`'s share); its tables, profiled. A process that has not seen the result yet reads the
    file and the profile saved beside it instead of converting again."""

    def make() -> list[Table]:
        if (saved := _saved_tables(result)) is not None:
            return saved
        tmp, scratch = temp_beside(result, "duckdb"), temp_beside(result, "scratch")
        tmp.unlink(missing_ok=True)
        request: dict[str, Any] = {
            "op": "convert",
            "result": str(result),
            "kind": kind,
            "target": str(tmp),
            "scratch": str(scratch),
            "memory": BUILD_MEMORY_LIMIT,
            "memory_ceiling": BUILD_MEMORY_CEILING,
        }
        if kind == "json":  # the parts that are tables, from the outline this process keeps anyway
            with contextlib.suppress(BrokenJSON):  # JSON Lines saved as .json: the worker finds out
                request["candidates"] = [[list(s), a, n] for s, a, n in table_json.candidates(result)]
        with _slot(namespace, _token.get()):
            worker = _Worker(request, BUILD_SECONDS, BUILD_SECONDS + 60)
            try:
                message = worker.message()
                if message is None or "tables" not in message:
                    raise worker.failure(message, "turning this result into tables")
                _save_tables(result, tmp, message["tables"])
            finally:
                worker.end()
                scratch.unlink(missing_ok=True)
                tmp.unlink(missing_ok=True)
                tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
        return _tables_of(message["tables"])

    return _TABLES.get(result, make)


def _tables_of(profiled: list[dict[str, Any]]) -> list[Table]:
    known = {f.name for f in fields(Table)}
    return [Table(**{k: v for k, v in t.items() if k in known}) for t in profiled]


def _version(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _save_tables(result: Path, built: Path, profiled: list[dict[str, Any]]) -> None:
    """The built file moved into place and its profile beside it, naming the versions of both: a profile
    that does not match them (a crash between the two renames, a result written again) is not used."""
    target = db_path(result)
    built.replace(target)
    record = {"result": _version(result), "db": _version(target), "tables": profiled}
    atomic_write(profile_path(result), json.dumps(record, ensure_ascii=False, default=str), sync=False)


def _saved_tables(result: Path) -> list[Table] | None:
    """The tables from the DuckDB file and profile beside the result, when both match it."""
    try:
        record = json.loads(profile_path(result).read_bytes())
        if record["result"] == _version(result) and record["db"] == _version(db_path(result)):
            return _tables_of(record["tables"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def stop_all() -> None:
    """End every running conversion and query (the gateway is stopping: its exit must not wait for one)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        proc.kill()


class _Token(threading.local):
    """The event loop a background thread reaches its share through (it is not a thread anyio started)."""

    value: Any = None

    def get(self) -> Any:
        return self.value


_token = _Token()


def warm(result: Path, kind: str, namespace: str = "") -> threading.Thread:
    """Convert a result in the background right after the offload, so the first query finds it ready
    (a query that comes meanwhile waits for this conversion instead of starting another). It runs
    within the share of the namespace that owns the result: a caller busy with its own queries gets its
    tables at the first query instead."""
    try:
        token = anyio.from_thread.run_sync(anyio.lowlevel.current_token)
    except NoEventLoopError:
        token = None

    def convert() -> None:
        _token.value = token
        try:
            build(result, kind, namespace)
        except Exception as exc:  # a result that cannot be converted: the first query will say why
            log.debug("background conversion of %s failed: %s", result.name, exc)

    thread = threading.Thread(target=convert, name=f"duckdb:{result.name}", daemon=True)
    thread.start()
    return thread


@contextmanager
def execute(result: Path, kind: str, sql: str, namespace: str = "") -> Iterator[tuple[list[str], Rows]]:
    """(columns, every row as JSON values, read in batches as they come) of one query, run in a process of
    its own within `namespace`'s share, ended when the block ends. A damaged sidecar (derived data) is
    built again, once."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("`sql` is empty; e.g. SELECT count(*) FROM items")
    for attempt in (1, 2):
        try:
            build(result, kind, namespace)
        except (BrokenJSON, OSError) as exc:
            raise QueryError(f"this result could not be turned into tables ({str(exc).splitlines()[0]})") from None
        request = {
            "op": "query",
            "db": str(db_path(result)),
            "sql": sql,
            "threads": THREADS,
            "memory": MEMORY_LIMIT,
            "temp": TEMP_LIMIT,
        }
        with _slot(namespace):
            worker = _Worker(request, QUERY_SECONDS, QUERY_WALL)
            try:
                first = worker.message()
                if first is not None and "columns" in first:
                    yield first["columns"], Rows(worker)
                    return
                error = worker.failure(first, "the query")
            finally:
                worker.end()
        if attempt == 1 and first is not None and _damaged(first.get("error", "")):
            log.warning("the tables of %s were unreadable (%s); building them again", result.name, first["error"])
            db_path(result).unlink(missing_ok=True)
            _TABLES.forget(result)
            continue
        raise error


def json_path_in_worker(path: Path, json_path: str, budget: int, namespace: str = "") -> dict[str, Any]:
    """`json_slice` in a worker process, with its memory and time limits, within the caller's share
    (a recursive path over a large result builds far more than the file's size in Python objects)."""
    with _slot(namespace):
        worker = _Worker(
            {"op": "slice", "path": str(path), "json_path": json_path, "budget": budget},
            SLICE_SECONDS,
            SLICE_SECONDS + 10,
        )
        try:
            message = worker.message()
        finally:
            worker.end()
    if message is not None and "answer" in message:
        return message["answer"]
    if message is not None and message.get("kind") == "input":
        if message.get("type") == "PathError":
            raise PathError(message["error"])
        if message.get("type") == "UnicodeDecodeError":
            raise ToolInputError("the file is not UTF-8 text; open it with its openCmd instead")
        raise ToolInputError(message["error"])
    raise ToolInputError(f"response_slice: {worker.failure(message, 'that json_path')}")


def _damaged(error: str) -> bool:
    """A sidecar DuckDB cannot open (cut, overwritten): derived data, to build again."""
    return any(s in error for s in ("not a valid DuckDB database", "Cannot open database", "orrupt"))


class Rows:
    """The rows of a query as JSON values, read batch by batch from its process and no more than
    ANSWER_BYTES in all: a query whose rows are huge stops at the cap (its process is ended) instead of
    filling the memory. `capped` tells that rows were left unread."""

    def __init__(self, worker: _Worker):
        self.worker = worker
        self.capped = False

    def __iter__(self) -> Iterator[list[Any]]:
        read = 0
        while (message := self.worker.message()) is not None:
            if message.get("end"):
                return
            if "rows" not in message:
                raise self.worker.failure(message, "the query")
            read += self.worker.size
            yield from message["rows"]
            if read >= ANSWER_BYTES:
                self.capped = not (self.worker.message() or {}).get("end", False)
                return
        raise self.worker.failure(None, "the query")
