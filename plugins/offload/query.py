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
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

import plugins.offload.table_json as table_json
from gateway.services.files import VersionedCache, temp_beside
from plugins.offload.json_file import BrokenJSON
from plugins.offload.tables import Table

log = logging.getLogger("plugins.offload")
QUERY_SECONDS = 20.0
MEMORY_LIMIT = "256MB"  # a query's working memory; beyond it DuckDB spills to disk...
TEMP_LIMIT = "1GB"  # ...at most this much
ADDRESS_SPACE = 2 * 1024**3  # what a worker process may map in all (DuckDB's chunks of rows included)
BUILD_SECONDS = 120.0  # a conversion taking longer is stopped (slices and search still answer)
BUILD_MEMORY_LIMIT = "48MB"  # a conversion's working memory (its worker peaks near 90 MB for 68 MB of JSON)...
BUILD_MEMORY_CEILING = "256MB"  # ...raised once to this for a statement needing more (long records, wide rows)
THREADS = 2
ANSWER_BYTES = 64 * 1024 * 1024  # what one answer may read back, as JSON
_TABLES: VersionedCache[list[Table]] = VersionedCache(max_items=32)
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding `plugins`


class QueryError(ValueError):
    """A query DuckDB refused or could not run; the message says what is allowed."""


def db_path(result: Path) -> Path:
    return result.with_name(f".{result.name}.duckdb")


class _Worker:
    """One `sql_worker` process: started with its request, read line by line, killed when its time is up
    (or the gateway stops, or the reader has read all it will)."""

    def __init__(self, request: dict[str, Any], seconds: float):
        path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "plugins.offload.sql_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            cwd=_ROOT,
        )
        self.seconds = seconds
        self.size = 0
        self.timed_out = False
        self.timer = threading.Timer(seconds, self._time_up)
        with _RUNNING_LOCK:
            _RUNNING.add(self.proc)
        self.timer.start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = self.proc.stdout
        try:
            self.proc.stdin.write((json.dumps({**request, "address_space": ADDRESS_SPACE}) + "\n").encode())
            self.proc.stdin.close()
        except OSError:  # it died at once: its missing answer says so
            pass

    def _time_up(self) -> None:
        self.timed_out = True
        self.proc.kill()

    def message(self) -> dict[str, Any] | None:
        """The next message, or None when the process is gone (`size`: its bytes)."""
        line = self.out.readline()
        self.size = len(line)
        return json.loads(line) if line.strip() else None

    def failure(self, message: dict[str, Any] | None, what: str) -> QueryError:
        """What went wrong, as the model should read it."""
        if self.timed_out:
            return QueryError(f"{what} ran longer than {self.seconds:.0f} s and was stopped; narrow it")
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


def build(result: Path, kind: str) -> list[Table]:
    """The DuckDB file for a result (built once per file version); its tables, profiled."""

    def make() -> list[Table]:
        target = db_path(result)
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
        worker = _Worker(request, BUILD_SECONDS)
        try:
            message = worker.message()
            if message is None or "tables" not in message:
                raise worker.failure(message, "turning this result into tables")
            tmp.replace(target)
        finally:
            worker.end()
            scratch.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
            tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
        known = {f.name for f in fields(Table)}
        return [Table(**{k: v for k, v in t.items() if k in known}) for t in message["tables"]]

    return _TABLES.get(result, make)


def stop_all() -> None:
    """End every running conversion and query (the gateway is stopping: its exit must not wait for one)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        proc.kill()


def warm(result: Path, kind: str) -> threading.Thread:
    """Convert a result in the background right after the offload, so the first query finds it ready
    (a query that comes meanwhile waits for this conversion instead of starting another)."""

    def convert() -> None:
        try:
            build(result, kind)
        except Exception as exc:  # a result that cannot be converted: the first query will say why
            log.debug("background conversion of %s failed: %s", result.name, exc)

    thread = threading.Thread(target=convert, name=f"duckdb:{result.name}", daemon=True)
    thread.start()
    return thread


@contextmanager
def execute(result: Path, kind: str, sql: str) -> Iterator[tuple[list[str], Rows]]:
    """(columns, every row as JSON values, read in batches as they come) of one query, run in a process of
    its own, ended when the block ends. A damaged sidecar (derived data) is built again, once."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("`sql` is empty; e.g. SELECT count(*) FROM items")
    for attempt in (1, 2):
        try:
            build(result, kind)
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
        worker = _Worker(request, QUERY_SECONDS)
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
