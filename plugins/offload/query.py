"""response_query: DuckDB SQL over one offloaded result, read-only and confined to it.

Each result is converted once to a DuckDB file beside it (`.<name>.duckdb`, removed with the result by
the TTL and `clean`). Each shape has a loader of its own: `table_json` (arrays of records and maps, the
largest `items`, and `doc`), `table_csv` (typed columns, missing values NULL), `table_jsonl`, and
`table_lines` (`lines(n, text)` for every text result). A query then opens that file read-only, with
DuckDB's own controls: no file or network access (`enable_external_access = false`), the configuration
locked, bounded threads, memory and time.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import plugins.offload.table_csv as table_csv
import plugins.offload.table_json as table_json
import plugins.offload.table_jsonl as table_jsonl
import plugins.offload.table_lines as table_lines
from gateway.services.files import VersionedCache
from gateway.services.text import dumps
from plugins.offload.json_file import BrokenJSON
from plugins.offload.tables import Table, profile

log = logging.getLogger("plugins.offload")
QUERY_SECONDS = 20.0
MEMORY_LIMIT = "256MB"  # a query's working memory; beyond it DuckDB spills to disk...
TEMP_LIMIT = "1GB"  # ...at most this much
BUILD_SECONDS = 120.0  # a conversion taking longer is stopped (the slices and search still answer)
BUILD_MEMORY_LIMIT = "128MB"  # the buffers of the JSON reader are sized to the longest record
THREADS = 2
_TABLES: VersionedCache[list[Table]] = VersionedCache(max_items=32)


class QueryError(ValueError):
    """A query DuckDB refused or could not run; the message says what is allowed."""


def db_path(result: Path) -> Path:
    return result.with_name(f".{result.name}.duckdb")


def _temp(result: Path, what: str) -> Path:
    """A temporary file of this process and thread (the store's start-up sweep keeps a live one)."""
    return result.with_name(f".{result.name}.{what}.{os.getpid()}.{threading.get_ident()}.tmp")


def _load(conn: Any, result: Path, kind: str, scratch: Path, stop: threading.Event) -> list[Table]:
    """Every table of the result, by its shape."""
    import duckdb

    tables: list[Table] = []
    if kind == "json":
        try:
            return table_json.load(conn, result, scratch, stop)
        except BrokenJSON:  # several JSON values, one a line: JSON Lines saved as .json
            if not table_jsonl.detect(result):
                raise
    if table_jsonl.detect(result):
        tables.append(table_jsonl.load(conn, result))
    elif (sep := table_csv.dialect(result)) is not None:
        try:
            tables.append(table_csv.load(conn, result, sep))
        except duckdb.InterruptException:
            raise
        except duckdb.Error as exc:  # not UTF-8, rows of other widths further down: lines still answer
            log.info("%s reads as CSV at first but not as a table: %s", result.name, str(exc).splitlines()[0])
    tables.append(table_lines.load(conn, result, scratch, stop))
    return tables


class _Conversion:
    """One running conversion: its connection and stop flag, so a time limit or the gateway's shutdown
    can end it (DuckDB's statements are interrupted, the loaders' own loops check the flag)."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.stop = threading.Event()

    def interrupt(self) -> None:
        self.stop.set()
        self.conn.interrupt()


_RUNNING: set[_Conversion] = set()
_RUNNING_LOCK = threading.Lock()


def build(result: Path, kind: str) -> list[Table]:
    """The DuckDB file for a result (built once per file version, one conversion per file at a time; a
    conversion never waits for another file's); its tables, profiled."""
    import duckdb

    def make() -> list[Table]:
        target = db_path(result)
        tmp, scratch = _temp(result, "duckdb"), _temp(result, "scratch")
        tmp.unlink(missing_ok=True)
        try:
            # one thread and bounded memory: a conversion runs beside the other tools (maybe in the background)
            conn = duckdb.connect(str(tmp), config={"threads": 1, "memory_limit": BUILD_MEMORY_LIMIT})
            running = _Conversion(conn)
            timer = threading.Timer(BUILD_SECONDS, running.interrupt)
            with _RUNNING_LOCK:
                _RUNNING.add(running)
            timer.start()
            try:
                tables = [profile(conn, t) for t in _load(conn, result, kind, scratch, running.stop)]
                if running.stop.is_set():
                    raise duckdb.InterruptException("stopped")
            except (duckdb.InterruptException, table_json.Stopped):
                raise QueryError(
                    f"turning this result into tables took longer than {BUILD_SECONDS:.0f} s (or the gateway is "
                    "stopping) and was stopped; use response_slice or response_search on it"
                ) from None
            finally:
                timer.cancel()
                with _RUNNING_LOCK:
                    _RUNNING.discard(running)
                conn.close()
            tmp.replace(target)
        finally:
            scratch.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
            tmp.with_name(tmp.name + ".wal").unlink(missing_ok=True)
        return tables

    return _TABLES.get(result, make)


def stop_all() -> None:
    """End every running conversion (the gateway is stopping: its exit must not wait for one)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for conversion in running:
        conversion.interrupt()


def warm(result: Path, kind: str) -> threading.Thread:
    """Convert a large result in the background right after the offload, so the first query finds it ready
    (a query that comes meanwhile waits for this conversion instead of starting another)."""

    def convert() -> None:
        try:
            build(result, kind)
        except Exception as exc:  # a result that cannot be converted: the first query will say why
            log.debug("background conversion of %s failed: %s", result.name, exc)

    # not a daemon: DuckDB aborts the whole process (exit 134) when a daemon thread inside it is killed at
    # interpreter exit; the exit waits for the conversion instead
    thread = threading.Thread(target=convert, name=f"duckdb:{result.name}", daemon=False)
    thread.start()
    return thread


_READERS: dict[tuple[str, int, int], Any] = {}  # sidecar version -> its read-only, locked connection
_READERS_LOCK = threading.Lock()
MAX_READERS = 16


def _reader(result: Path, kind: str) -> Any:
    """A cursor on the result's sidecar. Every query on one result shares one read-only connection,
    configured once (external access off, configuration locked): DuckDB keeps one instance per file in a
    process, so a second connection's own settings would be refused and concurrent queries would fail.
    A damaged sidecar is derived data: it is removed and built again, once."""
    import duckdb

    for attempt in (1, 2):
        build(result, kind)
        db = db_path(result)
        try:
            version = db.stat()
            key = (str(db), version.st_ino, version.st_mtime_ns)
            with _READERS_LOCK:
                conn = _READERS.get(key)
                if conn is None:
                    for old in [k for k in _READERS if k[0] == key[0]]:
                        # an earlier version of this sidecar: DuckDB would hand its instance out again
                        _READERS.pop(old).close()
                    conn = duckdb.connect(
                        str(db),
                        read_only=True,
                        config={
                            "threads": THREADS,
                            "memory_limit": MEMORY_LIMIT,
                            "max_temp_directory_size": TEMP_LIMIT,
                            "enable_external_access": False,
                        },
                    )
                    conn.execute("SET lock_configuration = true")
                    while len(_READERS) >= MAX_READERS:
                        _READERS.pop(next(iter(_READERS)))
                    _READERS[key] = conn
                return conn.cursor()
        except (duckdb.Error, OSError) as exc:
            if attempt == 2:
                raise QueryError(f"the tables of this result cannot be opened ({str(exc).splitlines()[0]})") from None
            log.warning("the tables of %s were unreadable (%s); building them again", result.name, exc)
            db.unlink(missing_ok=True)
            _TABLES.forget(result)
    raise AssertionError("unreachable")


@contextmanager
def execute(result: Path, kind: str, sql: str) -> Iterator[tuple[list[str], Rows]]:
    """(columns, every row as JSON values, fetched in batches as they are read) of one query; the
    cursor stays open, and the time limit holds, until the block ends."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("`sql` is empty; e.g. SELECT count(*) FROM items")
    try:
        cursor = _reader(result, kind)
    except (duckdb.Error, BrokenJSON, OSError) as exc:
        raise QueryError(f"this result could not be turned into tables ({str(exc).splitlines()[0]})") from None
    timer = threading.Timer(QUERY_SECONDS, cursor.interrupt)
    try:
        with _duckdb_errors():
            timer.start()
            cursor.execute(sql)
            if cursor.description is None:
                raise QueryError("the statement returned no rows; only queries (SELECT, WITH ...) answer")
            columns = [d[0] for d in cursor.description]
        yield columns, Rows(cursor)
    finally:
        timer.cancel()
        cursor.close()


ANSWER_BYTES = 64 * 1024 * 1024  # what one answer may read back from DuckDB, as JSON
BATCH_BYTES = 2 * 1024 * 1024  # the size a fetch aims at (rows of unknown width: measured as they come)


class Rows:
    """The rows of a query as JSON values, fetched in batches sized by the bytes of the rows already seen,
    and no more than ANSWER_BYTES in all: a query whose rows are huge (`repeat('x', 10000000)`) is read
    a few rows at a time and stops at the cap instead of filling the memory. `capped` tells that rows
    were left unread."""

    def __init__(self, cursor: Any):
        self.cursor = cursor
        self.capped = False

    def __iter__(self) -> Iterator[list[Any]]:
        batch_rows, fetched = 1, 0  # the first row tells how wide they are
        with _duckdb_errors():
            while batch := self.cursor.fetchmany(batch_rows):
                text = dumps(batch)
                fetched += len(text)
                yield from json.loads(text)
                if fetched >= ANSWER_BYTES:
                    self.capped = bool(self.cursor.fetchmany(1))
                    return
                per_row = max(1, len(text) // len(batch))
                batch_rows = max(1, min(10_000, BATCH_BYTES // per_row, (ANSWER_BYTES - fetched) // per_row + 1))


@contextmanager
def _duckdb_errors() -> Iterator[None]:
    import duckdb

    try:
        yield
    except duckdb.InterruptException:
        raise QueryError(f"the query ran longer than {QUERY_SECONDS:.0f} s and was stopped; narrow it") from None
    except duckdb.PermissionException as exc:
        raise QueryError(
            "that reads or writes outside this result, which response_query does not allow "
            f"(only this result's tables can be queried): {str(exc).splitlines()[0]}"
        ) from None
    except duckdb.Error as exc:
        raise QueryError(f"DuckDB: {str(exc).splitlines()[0]}") from None
