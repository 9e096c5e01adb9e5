"""response_query: DuckDB SQL over one offloaded result, read-only and confined to it.

Each result is converted once to a DuckDB file beside it (`.<name>.duckdb`, removed with the result by
the TTL and `clean`); a result holding the bytes of an earlier one in the same folder (the same
caller's) shares that file, hard-linked, instead of being converted again. Each shape has a loader of
its own (`loaders.py`): `table_json` (arrays of records and maps, the largest `items`, and `doc`),
`table_csv` (typed columns, missing values NULL), `table_jsonl`, and `table_lines` (`lines(n, text)` for
every text result). A query then opens that file read-only, with DuckDB's own controls: no file or
network access (`enable_external_access = false`), the configuration locked, bounded threads, memory
and time.

Every conversion and every query runs in a worker process (`sql_worker.py`) with its address space
capped: what one caller's SQL does to memory ends that process, never the shared gateway, and the
gateway reads back at most ANSWER_BYTES of rows. A worker serves one namespace only, one request at a
time, each with its own limits; between requests it stays warm for the next (IDLE_SECONDS). A process
past its time, or one whose answer was not read to its end, is killed, and so is every one when the
gateway stops. Queries on one result run side by side (each opens the file read-only); conversions of
different results never wait for each other. A conversion makes the tables first (queries may start)
and their column profiles after (the outline shows them).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import anyio.from_thread
import anyio.lowlevel
from anyio import NoEventLoopError

import plugins.offload.table_json as table_json
from gateway.args import ToolInputError
from gateway.services import activity, shares
from gateway.services.files import (
    VersionedCache,
    atomic_write,
    known_digest,
    process_alive,
    same_bytes,
    temp_beside,
    written_as,
)
from plugins.offload.json_file import BrokenJSON
from plugins.offload.paths import PathError
from plugins.offload.sql_worker import LINE_BYTES, NICE, NICED_ENV, PARENT_ENV, STARTED, TIME_EXIT
from plugins.offload.tables import Table

log = logging.getLogger("plugins.offload")
QUERY_SECONDS = 20.0  # a query's computation (its process's own clock: the gateway's reading is not counted)
QUERY_WALL = 120.0  # ...and its process's life, reading and saving its rows included
MEMORY_LIMIT = "256MB"  # a query's working memory; beyond it DuckDB spills to disk...
TEMP_LIMIT = "1GB"  # ...at most this much, into a folder of the query's own, removed when it ends
ADDRESS_SPACE = 2 * 1024**3  # what a worker process may map in all (DuckDB's chunks of rows included)
BUILD_SECONDS = 120.0  # a conversion taking longer is stopped (slices and search still answer)
PROFILE_AFTER = 0.3  # seconds at least between a background conversion's tables and its column profiles...
PROFILE_PAUSE_AT_MOST = 30.0  # ...which then wait for a pause between the host's calls at most this long
BUILD_MEMORY_LIMIT = "48MB"  # a conversion's working memory (its worker peaks near 90 MB for 68 MB of JSON)...
BUILD_MEMORY_CEILING = "256MB"  # ...raised once to this for a statement needing more (long records, wide rows)
SLICE_SECONDS = 20.0  # a JSONPath over a large result
KILL_GRACE = 5.0  # past its wall time and this, the parent kills a worker that did not end itself
THREADS = 2
ANSWER_BYTES = 64 * 1024 * 1024  # what one answer may read back, as JSON
IDLE_SECONDS = 120.0  # a warm worker waiting this long for its next request ends itself...
IDLE_KEPT = IDLE_SECONDS / 2  # ...and the gateway stops using it sooner, so a request never meets its end
_TABLES: VersionedCache[list[Table]] = VersionedCache(max_items=32)  # profiled
_LOADED: VersionedCache[list[Table]] = VersionedCache(max_items=32)  # in the DuckDB file; profiles may follow
_FAILED: VersionedCache[str] = VersionedCache(max_items=64)  # why a background conversion failed
_PREPARING: dict[str, float] = {}  # results converting in the background: since when (monotonic)
_PROFILES_WANTED: dict[str, threading.Event] = {}  # set when an outline asks: their profiles start at once
_RUNNING: set[_Process] = set()
_IDLE: dict[str, list[tuple[float, _Process]]] = {}  # warm workers per namespace, newest last
_AHEAD: list[tuple[float, _Process]] = []  # a worker started before anyone needed it (`start_ahead`)
_STOPS = [0]  # how many times `stop_all` ran
_AHEAD_RUN = [-1]  # `_STOPS` when a worker was last started ahead: one per run of the gateway
_RUNNING_LOCK = threading.Lock()
_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding `plugins`
_TEMP_PREFIX = "ctx-sql-"
_SWEPT = threading.Event()
TWINS_COMPARED = 4  # earlier results of the same size whose bytes are compared with a new one, newest first
_NO_TWIN: set[str] = set()  # results whose twin's tables were unreadable: converted on their own
_NO_LINK: set[str] = set()  # folders whose file system made no hard link: no twin is looked for there


class QueryError(ValueError):
    """A query DuckDB refused or could not run; the message says what is allowed."""


def db_path(result: Path) -> Path:
    return result.with_name(f".{result.name}.duckdb")


def profile_path(result: Path) -> Path:
    """The tables' profile, saved beside the DuckDB file: a cache miss reads it instead of converting."""
    return result.with_name(f".{result.name}.duckdb.json")


@contextmanager
def _slot(namespace: str, token: Any = None, pool: shares.Pool | None = None) -> Iterator[None]:
    """One of the caller's places for worker processes (`shares.worker_pool`, or `pool`), held for the
    block. Outside a running gateway (a command, a test calling these functions) there is no loop and one
    user."""
    try:
        held = (pool or shares.worker_pool()).slot_in_thread(namespace, token)
        held.__enter__()
    except NoEventLoopError:
        yield
        return
    try:
        yield
    finally:
        held.__exit__(None, None, None)


def _private_temp() -> Path:
    """A fresh folder for one worker process's spill files, outside the responses folder (nothing a later
    query or a restart reads); those left by a gateway that was killed are removed at the first worker's
    start."""
    base = Path(tempfile.gettempdir())
    if not _SWEPT.is_set():
        _SWEPT.set()
        for old in base.glob(f"{_TEMP_PREFIX}*-*"):
            pid = old.name.removeprefix(_TEMP_PREFIX).partition("-")[0]
            if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=base))


class _Process(subprocess.Popen[bytes]):
    """A worker process, with the folder its queries spill into (removed with it) and the database its
    last query read (it may keep that one open: the next query on it is sent there if it is idle)."""

    temp: Path | None = None
    serves: str | None = None


class _Spawner:
    """One long-lived thread starts every worker process: Linux's parent-death signal follows the thread
    that started a process, and a pool thread may end while the worker it started is still warm."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[tuple[list[Any], threading.Event]] = (
            queue.SimpleQueue()
        )  # [warm_up] -> +process
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self, warm_up: bool = False) -> _Process:
        """A new worker process; `warm_up`: it converts a few rows of each kind while it waits for its first
        request (the worker started ahead, before anyone needs one)."""
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="sql-workers", daemon=True)
                self.thread.start()
        box: list[Any] = []
        done = threading.Event()
        self.requests.put((warm_up, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _run(self) -> None:
        path = os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))
        while True:
            warm_up, box, done = self.requests.get()
            temp = None
            try:
                temp = _private_temp()
                proc = _Process(
                    [*_niced(), sys.executable, "-m", "plugins.offload.sql_worker", str(IDLE_SECONDS), str(temp)]
                    + (["warm-up"] if warm_up else []),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env={
                        **os.environ,
                        "PYTHONPATH": path,
                        PARENT_ENV: str(os.getpid()),
                        NICED_ENV: "1" if _niced() else "",
                    },
                    cwd=_ROOT,
                )
                proc.temp = temp
                box.append(proc)
            except Exception as exc:  # handed to the caller
                if temp is not None:
                    shutil.rmtree(temp, ignore_errors=True)
                box.append(exc)
            done.set()


_SPAWNER = _Spawner()


@functools.cache
def _niced() -> list[str]:
    """The worker started at its lower priority (`nice`, where there is one): Python's start and DuckDB's
    import (~0.2 s of CPU) then yield to the gateway's own start and its upstreams' (a gateway fronting
    one server answered its first listing ~70 ms later when the worker lowered its priority only once
    started)."""
    found = shutil.which("nice")
    return [found, "-n", str(NICE)] if found else []


def _close(proc: _Process) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    if proc.temp is not None:  # what its queries spilled is gone with it
        shutil.rmtree(proc.temp, ignore_errors=True)


def _take(namespace: str, prefer: str | None = None) -> _Process | None:
    """A warm worker of this namespace (never another's): the one keeping the database `prefer` open if it
    waits, else the most recent; old and dead ones ended."""
    now, found, ended = time.monotonic(), None, []
    with _RUNNING_LOCK:
        for caller, idle in list(_IDLE.items()):
            for item in list(idle):
                since, proc = item
                if now - since > IDLE_KEPT or proc.poll() is not None:
                    idle.remove(item)
                    ended.append(proc)
            if caller == namespace and idle and found is None:
                keeps = [item for item in idle if prefer is not None and item[1].serves == prefer]
                found = (keeps or idle)[-1][1]
                idle.remove((keeps or idle)[-1])
            if not idle:
                del _IDLE[caller]
    for proc in ended:
        _close(proc)
    return found or _ahead()


def _ahead() -> _Process | None:
    """The worker started with the gateway (`start_ahead`), if it still waits: nobody's yet, so any caller
    may take it."""
    with _RUNNING_LOCK:
        if not _AHEAD:
            return None
        since, proc = _AHEAD.pop()
    if time.monotonic() - since <= IDLE_KEPT and proc.poll() is None:
        return proc
    _close(proc)
    return None


def start_ahead() -> None:
    """A worker started now, before any caller needs one (Python and DuckDB's import take ~0.2 s, which a
    first conversion would wait for): the first caller without a warm worker of its own takes it, as it
    has served nobody. One per run of the gateway: `serve` starts it beside its own imports
    (`gateway.early`), the plugin's start where nothing did; ended like any idle worker."""
    with _RUNNING_LOCK:
        stops = _STOPS[0]
        if _AHEAD_RUN[0] == stops:
            return
        if _AHEAD_RUN[0] == -1:  # a gateway that fails to start never stops its plugins: its exit ends it
            atexit.register(_end_ahead)
        _AHEAD_RUN[0] = stops
    try:
        proc = _SPAWNER.start(warm_up=True)
    except Exception as exc:  # no process to spare: the first conversion starts its own
        log.debug("no worker started ahead: %s", exc)
        return
    with _RUNNING_LOCK:
        if _STOPS[0] == stops:
            _AHEAD.append((time.monotonic(), proc))
            return
    _close(proc)  # the gateway stopped while it started


def _end_ahead() -> None:
    """The worker started ahead, ended and its folder removed (at exit: `serve` starts it before the
    plugins are configured, and a gateway whose start fails never stops them)."""
    with _RUNNING_LOCK:
        ahead = [proc for _, proc in _AHEAD]
        _AHEAD.clear()
    for proc in ahead:
        _close(proc)


def _idle_caps() -> tuple[int, int]:
    """How many workers may wait idle: per namespace, as many as it may run at once (its places for
    queries and for conversions), and in all, as many as both pools hold."""
    pools = (shares.worker_pool(), shares.conversion_pool())
    return sum(p.per_caller for p in pools), sum(p.total for p in pools)


def _give(namespace: str, proc: _Process) -> None:
    """Keep a worker warm for its namespace's next request, within `_idle_caps`."""
    per_caller, total = _idle_caps()
    ended = []
    with _RUNNING_LOCK:
        idle = _IDLE.setdefault(namespace, [])
        idle.append((time.monotonic(), proc))
        if len(idle) > per_caller:
            ended.append(idle.pop(0)[1])
        while sum(len(v) for v in _IDLE.values()) > total:
            # from the caller holding the most (its oldest): one caller's spare never ends another's last
            fullest = max((v for v in _IDLE.values() if v), key=lambda v: (len(v), -v[0][0]))
            ended.append(fullest.pop(0)[1])
        for caller in [c for c, v in _IDLE.items() if not v]:
            del _IDLE[caller]
    for old in ended:
        _close(old)


def _keep_one_warm(namespace: str) -> None:
    """A worker started for the namespace's next request if none waits warm: a conversion runs beside
    the caller's queries (its profiles are computed once its tables exist), so without one the first
    query after it would start a process (~0.15 s: Python and DuckDB's import). Within what `_give`
    keeps warm, and ended like any idle worker."""
    total = _idle_caps()[1]
    with _RUNNING_LOCK:  # one waits already, or the idle places are full (a spare would end another's)
        if _IDLE.get(namespace) or sum(len(v) for v in _IDLE.values()) >= total:
            return
    try:
        _give(namespace, _ahead() or _SPAWNER.start())  # the one started with the gateway is ready sooner
    except Exception as exc:  # no process to spare (a limit on processes): the query starts its own
        log.debug("no worker kept warm for %r: %s", namespace, exc)


class _Worker:
    """One request to a `sql_worker` process of the caller's namespace (a warm one, or a new one), read
    line by line (no line longer than a worker sends). When the block that made it ends, the process goes
    back warm if its answer was read to the end, else it is killed. The worker keeps its own time and
    dies with the gateway; the parent kills it only past its wall time (a worker that could not end
    itself)."""

    def __init__(self, request: dict[str, Any], seconds: float, wall: float, namespace: str = "", spare: bool = False):
        self.namespace = namespace
        self.reads = str(request["db"]) if request["op"] == "query" else None
        warm = _take(namespace, self.reads)
        self.proc = warm or _SPAWNER.start()
        self.reused = warm is not None  # a warm worker that died while idle: the request goes to a new one
        self.seconds, self.wall = seconds, wall
        self.size = 0
        self.timed_out = False
        self.done = False  # the request's last message was read: the process may serve another
        self.broken = ""  # why the last line was not a message (cut, too long, not JSON)
        self.timer = threading.Timer(wall + KILL_GRACE, self._time_up)
        self.timer.start()
        self.request = {**request, "address_space": ADDRESS_SPACE, "seconds": seconds, "wall": wall}
        self._send()
        if spare:  # after the send: the request's process is in _RUNNING (stop_all ends it) and at work
            _keep_one_warm(namespace)

    def _send(self) -> None:
        with _RUNNING_LOCK:
            _RUNNING.add(self.proc)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.out = self.proc.stdout
        try:
            self.proc.stdin.write((json.dumps(self.request) + "\n").encode())
            self.proc.stdin.flush()
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
        if not line and self.reused and not self.timed_out:  # it ended while idle, before taking this request
            self.reused = False
            with _RUNNING_LOCK:
                _RUNNING.discard(self.proc)
            _close(self.proc)
            self.proc = _SPAWNER.start()
            self._send()
            return self.message()
        if not line:
            return None
        if not line.endswith(b"\n"):
            self.broken = "too long" if len(line) >= LINE_BYTES else "cut"
            return None
        try:
            message = json.loads(line)
        except ValueError:
            self.broken = "not JSON"
            return None
        if message == STARTED:  # it took the request: from here, its end is this request's doing
            self.reused = False
            return self.message()
        # the request's last message: the process may serve another (not after a slice: the parsed
        # JSON it keeps is large; nor after running out of memory or time: those end the process)
        if any(k in message for k in ("end", "error", "loaded", "tables")):
            self.done = message.get("kind") not in ("memory", "time", "input")
        return message

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
        with _RUNNING_LOCK:
            _RUNNING.discard(self.proc)
        if self.done and not self.timed_out and self.proc.poll() is None:
            self.proc.serves = self.reads  # any other request closes what it kept open
            _give(self.namespace, self.proc)
        else:
            _close(self.proc)


def loaded(result: Path, kind: str, namespace: str = "") -> list[Table]:
    """The result's DuckDB file (built once per file version, in a worker process within `namespace`'s
    share) and its tables, their columns not yet profiled: what a query needs. A process that has not
    seen the result yet reads the file and the record saved beside it instead of converting again."""

    def make() -> list[Table]:
        if (saved := _saved_tables(result, profiled=False)) is not None:
            return saved
        if (shared := _twin_tables(result, namespace)) is not None:
            _keep_one_warm(namespace)  # no conversion started a worker: the first query finds one starting
            return shared
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
                request["candidates"] = [[list(c.steps), *c[1:]] for c in table_json.candidates(result)]
        try:
            message = _converting(namespace, request, "loaded", "turning this result into tables")
            if message.get("retried"):  # a statement ran twice: the loader's signs of size missed it
                log.info("converting %s needed more than %s of memory", result.name, BUILD_MEMORY_LIMIT)
            _save_tables(result, message["loaded"], profiled=False, built=tmp)
        finally:
            scratch.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
            tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
        return _tables_of(message["loaded"])

    return _LOADED.get(result, make)


def build(result: Path, kind: str, namespace: str = "") -> list[Table]:
    """The result's tables with their columns profiled (rows, types, nulls, distinct values, samples):
    `loaded`, then the profiles, computed in a worker that opens the file read-only (queries go on)."""

    def make() -> list[Table]:
        if (saved := _saved_tables(result, profiled=True)) is not None:
            return saved
        tables = loaded(result, kind, namespace)
        if (saved := _saved_tables(result, profiled=True)) is not None:  # a twin's profiles came with its tables
            return saved
        request = {
            "op": "profile",
            "db": str(db_path(result)),
            "tables": [asdict(t) for t in tables],
            "memory": BUILD_MEMORY_LIMIT,
            "memory_ceiling": BUILD_MEMORY_CEILING,
        }
        message = _converting(namespace, request, "tables", "profiling this result's tables")
        _save_tables(result, message["tables"], profiled=True)
        return _tables_of(message["tables"])

    return _TABLES.get(result, make)


def _twin_tables(result: Path, namespace: str = "") -> list[Table] | None:
    """The tables of an earlier result in the same folder (the same caller's) holding the same bytes, its
    DuckDB file linked beside this one: a file read again, or a log fetched twice, is converted once.
    None when there is no such result with its tables built, or its file cannot be linked (then this one
    is converted on its own). Only equal contents count: their SHA-256 digests where both are known (the
    responses store hashes a result as it writes it; a record keeps its result's), else their bytes
    compared; the size and name only pick candidates. Bytes are read within the caller's places for
    conversions, as a conversion reads them; digests need no place (a profile under way may hold it)."""
    if str(result) in _NO_TWIN or str(result.parent) in _NO_LINK:
        return None
    try:
        size = result.stat().st_size
        same_size = [
            (entry.stat().st_mtime_ns, Path(entry.path))
            for entry in os.scandir(result.parent)
            if entry.name != result.name
            and not entry.name.startswith(".")
            and entry.name.endswith(result.suffix)
            and entry.is_file(follow_symlinks=False)
            and entry.stat().st_size == size
        ]
    except OSError:
        return None
    if not same_size:
        return None
    mine, unsure = known_digest(result), []
    for _, twin in sorted(same_size, reverse=True)[:TWINS_COMPARED]:
        if (record := _record(twin)) is None:
            continue
        theirs = known_digest(twin) or _recorded_digest(twin, record)
        if mine is None or theirs is None:
            unsure.append((twin, record))
        elif mine == theirs and (shared := _share(result, twin, record, compare=False)) is not _NOT_SHARED:
            return shared
    if not unsure:
        return None
    with _slot(namespace, _token.get(), shares.conversion_pool()):
        for twin, record in unsure:
            if (shared := _share(result, twin, record, compare=True)) is not _NOT_SHARED:
                return shared
    return None


def _recorded_digest(result: Path, record: dict[str, Any]) -> str | None:
    """The digest a record keeps, if the result was not written or touched since (`files.written_as`)."""
    try:
        return record.get("digest") if record.get("digest_of") == written_as(result) else None
    except OSError:
        return None


_NOT_SHARED: Any = object()  # `_share` found nothing to share (the next candidate may have it)


def _share(result: Path, twin: Path, record: dict[str, Any], compare: bool) -> list[Table] | None:
    """`twin`'s tables (its `record`) for `result`, its DuckDB file linked beside it (`compare`: after
    their bytes were compared equal); `_NOT_SHARED` when they cannot serve it, None when this folder
    makes no links."""
    linked = temp_beside(result, "duckdb")
    try:
        try:  # linked before the bytes are compared: a file system without links costs no reading
            os.link(db_path(twin), linked)  # queries open it read-only: one file serves both
        except OSError as exc:
            if db_path(twin).exists() and not linked.exists():  # links are not made here
                log.info("no hard links in %s (%s): results read again are converted again", result.parent, exc)
                _NO_LINK.add(str(result.parent))
                return None
            return _NOT_SHARED
        if _version(linked) != record["db"] or (compare and not same_bytes(twin, result)):
            return _NOT_SHARED
        if record["result"] != _version(twin):  # written again while compared
            return _NOT_SHARED
        _save_tables(result, record["tables"], profiled=record.get("profiled", True), built=linked)
        log.debug("%s holds the bytes of %s: its tables serve it", result.name, twin.name)
        return _tables_of(record["tables"])
    except (OSError, ValueError, KeyError, TypeError):
        return _NOT_SHARED
    finally:
        linked.unlink(missing_ok=True)


def _converting(namespace: str, request: dict[str, Any], answer: str, what: str) -> dict[str, Any]:
    """One step of a conversion in a worker of the caller's, within its places for conversions: the
    message holding `answer`, or the failure (`what` failed) raised. A worker is kept warm beside it
    for the caller's queries."""
    with _slot(namespace, _token.get(), shares.conversion_pool()):
        worker = _Worker(request, BUILD_SECONDS, BUILD_SECONDS + 60, namespace, spare=True)
        try:
            message = worker.message()
            if message is None or answer not in message:
                raise worker.failure(message, what)
            return message
        finally:
            worker.end()


def tables_now(result: Path, kind: str, namespace: str = "", wanted: bool = False) -> list[Table] | str:
    """The profiled tables if they are ready, else at once what is happening (the conversion is started
    in the background if nothing runs it): an outline never waits for them. `wanted` (an outline asks):
    a background conversion's profiles start now, without waiting for a pause between calls."""
    if wanted and (asked := _PROFILES_WANTED.get(str(result))) is not None:
        asked.set()
    if (ready := _TABLES.peek(result)) is not None:
        return ready
    if (saved := _saved_tables(result, profiled=True)) is not None:
        _TABLES.put(result, saved)
        return saved
    if (failed := _FAILED.peek(result)) is not None:
        return f"none ({failed})"
    with _RUNNING_LOCK:
        since = _PREPARING.get(str(result))
    if since is None:
        warm(result, kind, namespace, profiles_now=wanted)
        since = time.monotonic()
    so_far = f"{time.monotonic() - since:.0f} s so far"
    if (made := _LOADED.peek(result)) is not None:
        return (
            f"{', '.join(t.name for t in made)}: ready for response_query; their column profiles are being "
            f"computed ({so_far}), response_outline lists them when done"
        )
    return f"being prepared ({so_far}); response_outline lists them when ready, and response_query waits for them"


def tables_within(result: Path, seconds: float) -> list[Table] | None:
    """The result's tables once a query can use them (rows and columns named; their profiles may come
    later), waiting at most `seconds` for the conversion under way; None past that or when it failed. A
    small result's fileRef waits this long so that a first query needs no look (a look costs the model
    a call and its tokens); an outline never waits."""
    deadline = time.monotonic() + seconds
    while True:
        if (ready := _TABLES.peek(result) or _LOADED.peek(result)) is not None:
            return ready
        with _RUNNING_LOCK:
            converting = str(result) in _PREPARING
        if not converting or time.monotonic() >= deadline:
            return None
        time.sleep(0.005)  # a fileRef waits on this: a few ms late at most


def _tables_of(profiled: list[dict[str, Any]]) -> list[Table]:
    known = {f.name for f in fields(Table)}
    return [Table(**{k: v for k, v in t.items() if k in known}) for t in profiled]


def _version(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _save_tables(result: Path, tables: list[dict[str, Any]], profiled: bool, built: Path | None = None) -> None:
    """The record beside the DuckDB file (`built` moved into place first), naming the versions of both:
    a record that does not match them (a crash between the two renames, a result written again) is not
    used. `profiled`: whether the tables' columns are profiled yet."""
    target = db_path(result)
    if built is not None:
        built.replace(target)
    record = {"result": _version(result), "db": _version(target), "tables": tables, "profiled": profiled}
    if (digest := known_digest(result)) is not None:  # a twin found after a restart is told without reading
        record["digest"], record["digest_of"] = digest, written_as(result)
    atomic_write(profile_path(result), json.dumps(record, ensure_ascii=False, default=str), sync=False)


def _record(result: Path) -> dict[str, Any] | None:
    """The record beside the result when it was written for this version of it (`_save_tables`)."""
    try:
        record = json.loads(profile_path(result).read_bytes())
        return record if record["result"] == _version(result) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _saved_tables(result: Path, profiled: bool) -> list[Table] | None:
    """The tables from the DuckDB file and the record beside the result, when both match it (and, if
    `profiled`, when the record holds the profiles)."""
    try:
        record = _record(result)
        if record is not None and record["db"] == _version(db_path(result)):
            return _tables_of(record["tables"]) if record.get("profiled", True) or not profiled else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def stop_all() -> None:
    """End every running conversion and query and every warm worker (the gateway is stopping: its exit
    must not wait for one; a worker handed back later ends at the latest with the process)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING) + [proc for idle in [*_IDLE.values(), _AHEAD] for _, proc in idle]
        _IDLE.clear()
        _AHEAD.clear()
        _STOPS[0] += 1  # a worker being started ahead meanwhile is ended, not kept
    for proc in running:
        proc.kill()
        if proc.temp is not None:
            shutil.rmtree(proc.temp, ignore_errors=True)


class _Token(threading.local):
    """The event loop a background thread reaches its share through (it is not a thread anyio started)."""

    value: Any = None

    def get(self) -> Any:
        return self.value


_token = _Token()


def warm(result: Path, kind: str, namespace: str = "", profiles_now: bool = False) -> threading.Thread:
    """Convert a result in the background right after the offload, so the first query finds it ready
    (a query that comes meanwhile waits for this conversion instead of starting another). It runs
    within the share of the namespace that owns the result: a caller busy with its own queries gets its
    tables at the first query instead."""
    try:
        token = anyio.from_thread.run_sync(anyio.lowlevel.current_token)
    except NoEventLoopError:
        token = None
    stops = _STOPS[0]
    with _RUNNING_LOCK:
        _PREPARING.setdefault(str(result), time.monotonic())
        wanted = _PROFILES_WANTED.setdefault(str(result), threading.Event())
    if profiles_now:  # an outline asked: no pause to wait for
        wanted.set()

    def convert() -> None:
        _token.value = token
        try:
            loaded(result, kind, namespace)  # what a query needs
            # the profiles later: the caller's first query, sent as the fileRef arrives, takes the warm
            # worker (a fresh gateway may have only the one it started ahead; a spare is still starting),
            # and then in a pause between the host's calls (a profile costs about what the conversion
            # did, and took a core from the next call's conversion), unless an outline asks for them
            if not wanted.wait(PROFILE_AFTER):
                activity.wait_for_pause(PROFILE_PAUSE_AT_MOST, stop=wanted)
            if _STOPS[0] != stops:
                return  # the gateway stopped meanwhile
            build(result, kind, namespace)
        except shares.Busy as exc:  # no place in time: the first query converts it
            log.debug("background conversion of %s not started: %s", result.name, exc)
        except Exception as exc:  # a result that cannot be converted: the outline and the first query say why
            log.debug("background conversion of %s failed: %s", result.name, exc)
            with contextlib.suppress(OSError):
                _FAILED.put(result, str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__)
        except BaseException as exc:  # the gateway is stopping (its loop cancelled the wait for a place)
            log.debug("background conversion of %s stopped: %r", result.name, exc)
        finally:
            with _RUNNING_LOCK:
                _PREPARING.pop(str(result), None)
                _PROFILES_WANTED.pop(str(result), None)

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
            loaded(result, kind, namespace)
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
            worker = _Worker(request, QUERY_SECONDS, QUERY_WALL, namespace)
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
            _NO_TWIN.add(str(result))  # a twin's file shared into place would be as unreadable
            _TABLES.forget(result)
            _LOADED.forget(result)
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
            namespace,
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
    """A sidecar DuckDB cannot open (cut, overwritten): derived data, to build again. Only an error reading
    the file counts: a query's own mistake that names a column `corrupt` is not one."""
    reading = error.startswith(("IO Error", "Serialization Error", "INTERNAL Error"))
    return reading and any(s in error for s in ("not a valid DuckDB database", "Cannot open database", "orrupt"))


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
