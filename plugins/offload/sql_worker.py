"""The child process that runs DuckDB for response_query (and JSONPath over a large result): conversions,
queries and slices of one caller (namespace), one at a time, each with its own limits.

A query or a conversion can need far more memory than its DuckDB limit says (DuckDB computes a chunk of
2,048 rows at once: `repeat('x', 10000000)` over 150 rows is 1.5 GB before the first row is fetched), and
a runaway one must not take a shared gateway down with it. So each runs here, in a process of its own
with its address space capped, ended by its parent when its time is up, when the gateway stops, or when
the parent has read all it will read. The parent (`query.py`) writes one JSON request a line on stdin;
this answers each with JSON lines on stdout: `{"tables": [...]}` for a conversion; `{"columns": [...]}`, then
`{"rows": [...]}` batches and `{"end": true}` for a query; `{"answer": ...}` for a slice; `{"error": ...,
"kind": ...}` when it fails. Between requests it waits, warm, for the next; idle for `idle` seconds, or
after running out of memory or time, it ends.

It looks after itself too: it runs at a lower CPU priority than the gateway, dies with the gateway
(the parent-death signal) and kills itself past its wall time (SIGALRM, default action), so nothing
outlives a gateway killed mid-query (each request has its own wall time; none while it waits). Its time limit is its own clock over the computation: time spent
blocked while the parent reads or saves what it sent does not count; past it DuckDB is interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.services.files import temp_beside

BATCH_BYTES = 2 * 1024 * 1024  # a line of rows ends once it reaches this size...
ROW_BYTES = 8 * 1024 * 1024  # ...and one row may be at most this large: a line is never above both
LINE_BYTES = BATCH_BYTES + ROW_BYTES + 64 * 1024  # the longest line the parent reads
NICE = 10  # below the gateway's own priority: a query never slows the answers of other callers
PR_SET_PDEATHSIG = 1
NICED_ENV = "CTX_WORKER_NICED"  # set (non-empty) by a parent that started the worker under `nice` already
PARENT_ENV = "CTX_WORKER_PARENT"  # the gateway's pid: a parent gone before the signal was set is seen
STARTED = {"started": True}  # the first line of every answer: the request was taken
TIME_EXIT = 124  # the exit status of a worker that ended itself at its time limit
KEEP_BYTES = 64 * 1024 * 1024  # a database up to this size stays open between queries (`_Kept`)...
KEEP_GROWTH = 32 * 1024 * 1024  # ...while the process holds at most this much more than once it opened it
REFUSED = ("COPY", "COPY_DATABASE", "EXPORT", "ATTACH", "DETACH", "LOAD", "EXTENSION", "SET", "VARIABLE_SET")


def _look_after_itself() -> None:
    """A lower priority and death with the parent (POSIX; Linux for the parent-death signal)."""
    parent = int(os.environ.get(PARENT_ENV, "0")) or os.getppid()
    with contextlib.suppress(AttributeError, OSError):
        if not os.environ.get(NICED_ENV):  # else started under `nice -n NICE` already: the gateway's plus NICE
            os.nice(NICE)
    if sys.platform == "linux":
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was asked for
            os._exit(1)
    if hasattr(signal, "alarm"):  # no handler: the kernel ends the process, whatever it is doing
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _alarm(wall: float) -> None:
    """A request's wall time (0: none, while the process waits for the next request)."""
    if hasattr(signal, "alarm"):
        signal.alarm(0 if wall <= 0 else max(1, int(wall + 0.999)))


class _Clock:
    """The computation's own time: it runs from `start` (the process's start-up is not the caller's
    doing) except while the process waits to hand a line to its parent. Past `seconds` it calls `stop`
    (DuckDB's interrupt) once."""

    def __init__(self) -> None:
        self.seconds, self.used, self.started = 0.0, 0.0, time.monotonic()
        self.expired = False
        self.stop: Any = None
        self._lock = threading.Lock()
        self._running = threading.Event()  # clear while paused: an idle worker's clock never wakes
        threading.Thread(target=self._watch, daemon=True).start()

    def reset(self, seconds: float) -> None:
        """A new request's clock, paused until its computation starts."""
        with self._lock:
            self.seconds, self.used, self.expired, self.stop = seconds, 0.0, False, None
            self._running.clear()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def start(self, stop: Any = None) -> None:
        self.stop = stop
        self.resume()

    def _watch(self) -> None:
        while True:
            self._running.wait()
            time.sleep(0.05)
            with self._lock:
                if self.paused:
                    continue
                now = time.monotonic()
                self.used += now - self.started
                self.started = now
                if self.used < self.seconds or self.expired:
                    continue
                self.expired = True
                stop = self.stop
            if stop is not None:
                stop()

    def pause(self) -> None:
        with self._lock:
            self.used += time.monotonic() - self.started
            self._running.clear()

    def resume(self) -> None:
        with self._lock:
            self.started = time.monotonic()
            self._running.set()


_CLOCK: _Clock | None = None
_WARM_UP = False  # started ahead of any request (`warm-up`): converts a little of each kind while it waits
_TEMP = ""  # this process's folder for what a query spills (given by the parent, removed with the process)


def _limit_memory(byte_count: int) -> None:
    """Cap the address space: an allocation beyond it fails inside DuckDB (an error), not the machine.
    (POSIX only; elsewhere DuckDB's own limits and the answer cap remain.)"""
    try:
        import resource
    except ImportError:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > byte_count:
        resource.setrlimit(resource.RLIMIT_AS, (byte_count, hard))


def _send(out: Any, message: dict[str, Any] | str) -> None:
    text = message if isinstance(message, str) else json.dumps(message, ensure_ascii=False, default=str)
    if _CLOCK is not None:
        _CLOCK.pause()  # the parent reading or saving is not this computation's time
    try:
        out.write(text + "\n")
        out.flush()
    finally:
        if _CLOCK is not None:
            _CLOCK.resume()


class _Growing:
    """A conversion's connection that starts with a small memory limit and raises it once, to `ceiling`:
    up front when the loader sees rows that need more (`grow`: long records, wide rows), else for a
    statement that ran out (and runs that statement again: a failed one left nothing behind). Most
    results convert within the small limit; a worker's peak stays near DuckDB's own size."""

    def __init__(self, conn: Any, ceiling: str):
        self.conn, self.ceiling, self.grown, self.retried = conn, ceiling, False, False

    def grow(self) -> None:
        if not self.grown:
            self.grown = True
            self.conn.execute(f"SET memory_limit = '{self.ceiling}'")

    def execute(self, *args: Any) -> Any:
        import duckdb

        try:
            return self.conn.execute(*args)
        except (duckdb.OutOfMemoryException, duckdb.TransactionException) as exc:
            # a commit that cannot pin its blocks is out of memory too (long strings)
            memory = isinstance(exc, duckdb.OutOfMemoryException) or "pin block" in str(exc)
            if self.grown or not memory:
                raise
            self.grow()
            self.retried = True
            return self.conn.execute(*args)


def _convert(request: dict[str, Any], out: Any) -> None:
    """The tables made and the file closed (whole): their columns' profiles are a later request, so a
    first query need not wait for them."""
    import threading

    import duckdb

    from plugins.offload.loaders import load
    from plugins.offload.table_json import Part
    from plugins.offload.tables import described

    raw = duckdb.connect(request["target"], config={"threads": 1, "memory_limit": request["memory"]})
    _interrupt_with_clock(raw)
    conn = _Growing(raw, request["memory_ceiling"])
    try:
        tables = load(
            conn,
            Path(request["result"]),
            request["kind"],
            Path(request["scratch"]),
            threading.Event(),
            None if "candidates" not in request else [Part(tuple(c[0]), *c[1:]) for c in request["candidates"]],
        )
        tables = [described(conn, t) for t in tables]
        conn.execute("CHECKPOINT")
    finally:
        raw.close()
    _send(
        out, {"loaded": [asdict(t) for t in tables], "grown": conn.grown, "retried": conn.retried}
    )  # the file is whole now


def _profile(request: dict[str, Any], out: Any) -> None:
    """The profiles of a built file's tables (opened read-only: queries may read it meanwhile)."""
    import duckdb

    from plugins.offload.tables import Table, profile

    raw = duckdb.connect(request["db"], read_only=True, config={"threads": 1, "memory_limit": request["memory"]})
    _interrupt_with_clock(raw)
    conn = _Growing(raw, request["memory_ceiling"])
    try:
        profiled = [asdict(profile(conn, Table(**t))) for t in request["tables"]]
    finally:
        raw.close()
    _send(out, {"tables": profiled})


def _interrupt_with_clock(conn: Any) -> None:
    if _CLOCK is not None:
        _CLOCK.start(conn.interrupt)


def _refused(conn: Any, sql: str) -> str | None:
    """Why the SQL is not a query response_query runs (a statement that writes files, attaches or loads
    something, or changes a setting), or None."""
    try:
        statements = conn.extract_statements(sql)
    except Exception:  # a syntax error: DuckDB's own message says where, when it runs
        return None
    for statement in statements:
        try:
            kind = str(statement.type).rpartition(".")[2]
        except ValueError:  # a statement type the Python binding cannot name (UPDATE EXTENSIONS): not a query
            kind = "UNKNOWN"
        if kind in REFUSED or kind == "UNKNOWN":
            return (
                f"{kind.replace('_', ' ')} statements are not allowed: response_query answers queries "
                "(SELECT, WITH, DESCRIBE, ...); it never writes, attaches or loads files. Large answers are "
                "saved for you as a new result"
            )
    return None


class _Kept:
    """The database the last query read, kept open for the next query on the same file: opening one costs
    15-25 ms, most of a small query's time. Each query has a connection of its own (`cursor`), so nothing
    one leaves (temporary tables, prepared statements) reaches the next; the settings were locked when it
    was opened. Kept only for a small file, and only while the process holds little more memory than
    when it opened it (DuckDB keeps what a query used until the database closes: a GROUP BY of millions
    of groups left an idle worker at 185 MB instead of 76); any other request closes it (DuckDB refuses
    a file opened twice with other settings), and so does an error that is not the query's own.

    A database is known by its file (device, inode, size, time): a result read again, whose tables are a
    link to the first one's file, finds it open (4 ms against ~20 for a query on a file opened anew).
    Every file is opened under one name, `result` (DuckDB names a database after the first word of its
    file's name, through a link made for the open), so no query sees another result's name."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.conn: Any = None
        self.resident = 0  # the process's memory once the database was open
        self.opened = 0  # databases opened: each under a link name of its own (DuckDB caches them by path)

    def cursor(self, request: dict[str, Any], duckdb: Any) -> tuple[Any, Any]:
        """A connection for the query, and the database to close after it (None when it is kept)."""
        settings = (request["threads"], request["memory"], request["temp"])
        try:  # a file built again tells by its inode
            identity: tuple[int, ...] | None = _identity(request["db"])
        except OSError:  # gone: DuckDB's own error says so, and the parent builds it again
            identity = None
        key = None if identity is None else (*identity, *settings)
        path = Path(request["db"])
        # a file opened under its own name (no links there) is kept under its path too
        if key is not None and self.key in (key, (str(path), *key)):
            return self.conn.cursor(), None
        self.close()
        self.opened += 1
        link = _link_name(path, self.opened)
        try:
            os.link(path, link)
            identity = _identity(link)  # what is opened: the file may have been replaced since
            key = (*identity, *settings)
        except OSError:  # no links on this file system (or the file is gone): its own name, kept per path
            link, key = None, None if key is None else (str(path), *key)
        try:
            conn = duckdb.connect(
                str(link or path),
                read_only=True,
                config={
                    "threads": request["threads"],
                    "memory_limit": request["memory"],
                    "max_temp_directory_size": request["temp"],
                    **({"temp_directory": _TEMP} if _TEMP else {}),  # this process's own, removed with it
                },
            )
        finally:
            if link is not None:  # DuckDB holds the file open; a read-only database is not read by name again
                with contextlib.suppress(OSError):
                    link.unlink()
        try:
            conn.execute("SET enable_external_access = false")  # after temp_directory: DuckDB refuses it after
            conn.execute("SET lock_configuration = true")
            cursor = conn.cursor()
        except BaseException:
            conn.close()
            raise
        if key is None or identity is None or identity[2] > KEEP_BYTES or not (resident := _resident()):
            return cursor, conn
        self.key, self.conn, self.resident = key, conn, resident
        return cursor, None

    def after_query(self) -> None:
        """Closed when the process now holds much more memory than when it opened the file."""
        if self.conn is not None and _resident() > self.resident + KEEP_GROWTH:
            self.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.key = self.conn = None


def _link_name(db: Path, opened: int) -> Path:
    """Where the link that opens `db` as `result` goes: in this process's own folder when it is on the
    same file system (the parent removes that folder with the process, so a worker killed while it
    opens leaves nothing), else beside the file under a temp name the start-up sweep knows."""
    try:
        if _TEMP and os.stat(_TEMP).st_dev == os.stat(db).st_dev:
            return Path(_TEMP) / f"result.{opened}.duckdb"
    except OSError:
        pass
    return temp_beside(db.with_name("result"), f"duckdb.{opened}")  # `.result.duckdb.<n>.<writer>.<thread>.tmp`


def _identity(path: str | Path) -> tuple[int, ...]:
    """A file's device, inode, size and modification time."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _resident() -> int:
    """This process's resident memory in bytes (0 where /proc cannot tell: nothing is kept then)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


_KEPT = _Kept()


def _query(request: dict[str, Any], out: Any) -> None:
    import duckdb

    conn, database = _KEPT.cursor(request, duckdb)
    try:
        _answer(conn, request, out)
    finally:
        conn.close()  # the next query starts from a connection of its own
        if database is not None:
            database.close()
        _KEPT.after_query()


def _answer(conn: Any, request: dict[str, Any], out: Any) -> None:
    if (why := _refused(conn, request["sql"])) is not None:
        _send(out, {"error": why, "kind": "sql"})
        return
    _interrupt_with_clock(conn)
    cursor = conn.execute(request["sql"])
    if cursor.description is None:
        _send(out, {"error": "the statement returned no rows; only queries (SELECT, WITH ...) answer", "kind": "sql"})
        return
    _send(out, {"columns": [d[0] for d in cursor.description]})
    parts: list[str] = []
    size = 0
    fetch = 1  # the first row tells how wide they are (a guess only: each line is cut by its bytes)
    while batch := cursor.fetchmany(fetch):
        fetched = 0
        for row in batch:
            part = json.dumps(row, ensure_ascii=False, default=str)
            width = len(part) if part.isascii() else len(part.encode())  # bytes as written (한 is 3)
            if width > ROW_BYTES:  # bytes are capped where they are made: never one huge line
                _send(out, {"error": _row_too_large(width), "kind": "sql"})
                return
            parts.append(part)
            size += width + 1
            fetched += width + 1
            if size >= BATCH_BYTES:
                _send(out, '{"rows": [' + ",".join(parts) + "]}")
                parts, size = [], 0
        fetch = max(1, min(10_000, BATCH_BYTES // max(1, fetched // len(batch))))
    if parts:
        _send(out, '{"rows": [' + ",".join(parts) + "]}")
    _send(out, {"end": True})


def _row_too_large(size: int) -> str:
    return (
        f"one row of the answer is {size // (1024 * 1024)} MB, more than {ROW_BYTES // (1024 * 1024)} MB a row may "
        "be; select fewer or shorter columns (e.g. left(col, 1000))"
    )


def _slice(request: dict[str, Any], out: Any) -> None:
    """A JSONPath over a large result, with this process's memory and time limits."""
    from gateway.args import ToolInputError
    from plugins.offload.json_file import BrokenJSON
    from plugins.offload.json_slice import json_slice
    from plugins.offload.paths import PathError

    if _CLOCK is not None:
        _CLOCK.start(lambda: os._exit(TIME_EXIT))  # nothing to interrupt: the process ends
    try:
        answer = json_slice(Path(request["path"]), request["json_path"], request["budget"])
    except (ToolInputError, PathError, BrokenJSON, UnicodeDecodeError) as exc:  # the caller's to mend
        _send(out, {"error": str(exc), "kind": "input", "type": type(exc).__name__})
        return
    _send(out, {"answer": answer})


OPS = {"convert": _convert, "profile": _profile, "query": _query, "slice": _slice}


def main() -> None:
    global _CLOCK, _TEMP, _WARM_UP
    _look_after_itself()
    idle = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    _TEMP = sys.argv[2] if len(sys.argv) > 2 else ""
    _WARM_UP = sys.argv[3:4] == ["warm-up"]
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the parent's pipe
    _CLOCK = _Clock()
    try:
        _requests(idle, out, _CLOCK)
    finally:
        _KEPT.close()
        if _TEMP:  # the parent removes it too when it ends this process
            shutil.rmtree(_TEMP, ignore_errors=True)


def _requests(idle: float, out: Any, clock: _Clock) -> None:
    """Requests answered one at a time until the parent is gone, this one idles `idle` seconds, or it ran
    out of memory or time."""
    import duckdb

    with duckdb.connect(":memory:") as warm:  # DuckDB's first database in a process costs ~15 ms more: here,
        warm.execute("SELECT count(*), max(range) FROM range(10)").fetchall()  # not in the first request
    warm_ups = list(_WARM_FILES.items()) if _TEMP and _WARM_UP else []
    limited = False
    while True:
        # only while nobody waits, and not while the gateway starts (the process was started beside it)
        while warm_ups and not select.select([sys.stdin.buffer], [], [], WARM_UP_AFTER)[0]:
            _warm_up(duckdb, *warm_ups.pop(0))
        warm_ups = []  # a request came first: it warmed the process itself (none runs later, beside others' work)
        if not select.select([sys.stdin.buffer], [], [], idle)[0]:  # idle too long: the process ends
            return
        line = sys.stdin.buffer.readline()
        if not line:  # the parent closed the pipe: done
            return
        request = json.loads(line)
        _send(out, STARTED)
        if not limited:  # the same cap for every request (the address space cannot be raised again)
            _limit_memory(request["address_space"])
            limited = True
        _alarm(request["wall"])
        clock.reset(request["seconds"])
        if request["op"] != "query":
            _KEPT.close()
        ending = _serve(request, out, duckdb)
        clock.pause()
        _alarm(0)
        if ending:  # out of memory or time: a fresh process for the next request
            return


WARM_UP_AFTER = 0.5  # seconds a worker waits idle before each warm-up conversion
# what `_warm_up` converts: a few rows of each kind, shaped as the loaders' slower paths take them
_WARM_FILES = {
    "warm.csv": ("csv", "id,name,when,price\n1,a,2020-01-02,1.5\n2,NA,2021-03-04,\n"),
    "warm.json": (
        "json",
        '{"items": [{"a": 1, "b": "x", "c": [1]}, {"a": 2, "b": null, "c": []}], "m": {"k": {"v": 1}}}',
    ),
}


def _warm_up(duckdb: Any, name: str, what: tuple[str, str]) -> None:
    """A first conversion of one kind, in memory, before a request needs one: the first of each kind in a
    process costs ~15-25 ms more than later ones (the loaders' import, DuckDB's first CSV or JSON read and
    casts). From a file in this process's own folder; a failure only leaves the first request to pay it."""
    import threading

    kind, text = what
    path, scratch = Path(_TEMP) / name, Path(_TEMP) / "warm.scratch"
    try:
        from plugins.offload.loaders import load
        from plugins.offload.tables import described, profile

        path.write_text(text, encoding="utf-8")
        with duckdb.connect(":memory:", config={"threads": 1}) as conn:
            for table in load(conn, path, kind, scratch, threading.Event()):
                profile(conn, described(conn, table))
    except Exception as exc:  # a warm-up never stops the worker
        print(f"sql worker: warm-up failed: {_first_line(exc)}", file=sys.stderr)
    finally:
        for written in (path, scratch):  # the scratch: what a loader may write (its caller removes it)
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)


def _serve(request: dict[str, Any], out: Any, duckdb: Any) -> bool:
    """One request answered; True when this process should end after it."""
    try:
        OPS[request["op"]](request, out)
    except duckdb.InterruptException as exc:
        kind = "time" if _CLOCK is not None and _CLOCK.expired else "duckdb"
        _send(out, {"error": str(exc).splitlines()[0], "kind": kind})
        return kind == "time"
    except duckdb.PermissionException as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "permission"})
    except duckdb.OutOfMemoryException as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "memory"})
        return True
    except MemoryError:
        _send(out, {"error": "out of memory", "kind": "memory"})
        return True
    except (duckdb.InternalException, duckdb.FatalException) as exc:  # DuckDB may refuse all else after one
        _send(out, {"error": str(exc).splitlines()[0], "kind": "duckdb"})
        return True
    except duckdb.Error as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "duckdb"})
    except Exception as exc:  # a loader's own failure (broken JSON, ...): said, never a traceback
        _send(out, {"error": f"{type(exc).__name__}: {_first_line(exc)}", "kind": "load"})
    return False


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


if __name__ == "__main__":
    main()
