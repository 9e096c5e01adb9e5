"""response_query: DuckDB SQL over one offloaded result, read-only and confined to it.

Each result is converted once to a DuckDB file beside it (`.<name>.duckdb`, removed with the result by
the TTL and `clean`): a JSON result's largest array of objects is the table `items`, every other array
of objects a table named after its path (`meta.warnings` -> `meta_warnings`); a CSV/TSV result is `items`
with typed columns; every text result is also `lines(n, text)`. A query then opens that file read-only,
with DuckDB's own controls: no file or network access (`enable_external_access = false`), the
configuration locked, bounded threads, memory and time.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import plugins.offload.json_outline as json_outline
import plugins.offload.json_values as json_values
from gateway.services.files import VersionedCache
from gateway.services.text import dumps
from plugins.offload.json_file import BrokenJSON
from plugins.offload.paths import parse_path

log = logging.getLogger("plugins.offload")
QUERY_SECONDS = 20.0
MEMORY_LIMIT = "1GB"
BUILD_MEMORY_LIMIT = "128MB"  # the buffers of the JSON reader are sized to the longest record (below)
THREADS = 2
FETCH_CAP = 5000  # rows read back at most; the total is counted separately
_TABLES: VersionedCache[dict[str, list[str]]] = VersionedCache(max_items=32)
_BUILD_LOCK = threading.Lock()


class QueryError(ValueError):
    """A query DuckDB refused or could not run; the message says what is allowed."""


def db_path(result: Path) -> Path:
    return result.with_name(f".{result.name}.duckdb")


def table_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", path).strip("_") or "items"


def _json_tables(result: Path) -> dict[str, list[str]]:
    """table name -> the keys of the array of objects it holds; the largest is `items`."""
    info = json_outline.outline(result)
    arrays = [
        (p, n)
        for p, n in info["itemCount"].items()
        if n and isinstance((info.get("samples") or {}).get(p, [None])[0], dict)
    ]
    arrays.sort(key=lambda pn: -pn[1])
    tables: dict[str, list[str]] = {}
    for i, (p, _) in enumerate(arrays):
        steps, remainder = parse_path(None if p == "$" else p)
        if remainder is not None or not all(isinstance(s, str) for s in steps):
            continue
        tables["items" if i == 0 else table_name(p)] = [str(s) for s in steps]
    return tables


def _looks_like_ndjson(result: Path) -> bool:
    """JSON Lines / NDJSON: the first lines are each one JSON object."""
    with open(result, encoding="utf-8", errors="replace") as fh:
        head = [fh.readline() for _ in range(5)]
    head = [h for h in head if h.strip()]
    try:
        return len(head) >= 2 and all(isinstance(json.loads(h), dict) for h in head)
    except ValueError:
        return False


def _looks_like_csv(result: Path) -> str | None:
    with open(result, encoding="utf-8", errors="replace") as fh:
        head = [fh.readline() for _ in range(6)]
    head = [h for h in head if h.strip()]
    if len(head) < 2:
        return None
    for sep in (",", "\t"):
        counts = {h.count(sep) for h in head}
        if len(counts) == 1 and counts.pop() >= 1:
            return sep
    return None


def _longest_line(path: Path) -> int:
    """Bytes of the longest line of a file."""
    longest, carried = 0, 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            start = 0
            while (newline := block.find(b"\n", start)) >= 0:
                longest = max(longest, carried + newline - start)
                carried, start = 0, newline + 1
            carried += len(block) - start
    return max(longest, carried)


def _object_size(longest: int) -> int:
    """DuckDB's `maximum_object_size` for records no longer than `longest` bytes. Its JSON reader
    allocates buffers of twice this size, so the 100 MB it would take for any file cost 200 MB of
    memory for a result of a few MB; records are rarely large."""
    return max(1 << 20, longest + 1024)


def build(result: Path, kind: str) -> dict[str, list[str]]:
    """The DuckDB file for a result (built once per file version); returns table -> columns."""
    import duckdb

    def make() -> dict[str, list[str]]:
        target = db_path(result)
        tmp = target.with_name(target.name + ".tmp")
        tmp.unlink(missing_ok=True)
        with _BUILD_LOCK:
            # one thread: a conversion runs beside the other tools (it may be in the background)
            conn = duckdb.connect(str(tmp), config={"threads": 1, "memory_limit": BUILD_MEMORY_LIMIT})
            try:
                ndjson_lines = kind != "json" and _looks_like_ndjson(result)
                if kind == "json":
                    try:
                        tables = _json_tables(result)
                    except BrokenJSON:  # several JSON values, one a line: JSON Lines saved as .json
                        tables, ndjson_lines = {}, _looks_like_ndjson(result)
                else:
                    tables = {}
                if ndjson_lines:
                    conn.execute(
                        "CREATE TABLE items AS SELECT * FROM read_json_auto(?, format='newline_delimited', "
                        f"maximum_object_size={_object_size(_longest_line(result))})",
                        [str(result)],
                    )
                if kind == "json":
                    for name, keys in tables.items():
                        ndjson = result.with_name(f".{result.name}.{name}.ndjson.tmp")
                        try:
                            longest = 0
                            with open(ndjson, "w", encoding="utf-8") as fh:
                                for item in json_values.stream_array(result, keys):
                                    if isinstance(item, dict):
                                        line = dumps(item) + "\n"
                                        longest = max(longest, len(line))
                                        fh.write(line)
                            conn.execute(
                                f"CREATE TABLE {name} AS SELECT * FROM read_json_auto(?, format='newline_delimited', "
                                f"maximum_object_size={_object_size(4 * longest)}, sample_size=-1)",
                                [str(ndjson)],
                            )
                        finally:
                            ndjson.unlink(missing_ok=True)
                if kind != "json" or ndjson_lines:
                    sep = None if ndjson_lines else _looks_like_csv(result)
                    if sep is not None:
                        conn.execute(
                            "CREATE TABLE items AS SELECT * FROM read_csv_auto(?, delim=?)", [str(result), sep]
                        )
                    conn.execute(
                        "CREATE TABLE lines AS SELECT row_number() OVER () AS n, text FROM read_csv(?, "
                        "columns={'text': 'VARCHAR'}, header=false, delim=chr(31), quote='', escape='', "
                        "auto_detect=false, null_padding=true, strict_mode=false)",
                        [str(result)],
                    )
                tables = {
                    t: [c[0] for c in conn.execute(f"DESCRIBE {t}").fetchall()]
                    for (t,) in conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
                }
            finally:
                conn.close()
        tmp.replace(target)
        return tables

    return _TABLES.get(result, make)


def warm(result: Path, kind: str) -> None:
    """Convert a large result in the background right after the offload, so the first query finds it ready
    (a query that comes meanwhile waits for this conversion instead of starting another)."""

    def convert() -> None:
        try:
            build(result, kind)
        except Exception as exc:  # a result that cannot be converted: the first query will say why
            log.debug("background conversion of %s failed: %s", result.name, exc)

    # not a daemon: DuckDB aborts the whole process (exit 134) when a daemon thread inside it is killed at
    # interpreter exit; the exit waits for the conversion instead
    threading.Thread(target=convert, name=f"duckdb:{result.name}", daemon=False).start()


def run(result: Path, kind: str, sql: str) -> tuple[list[str], list[list[Any]], int]:
    """(columns, rows up to FETCH_CAP, total row count) of one query."""
    import duckdb

    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("`sql` is empty; e.g. SELECT count(*) FROM items")
    try:
        build(result, kind)
    except (duckdb.Error, BrokenJSON) as exc:
        raise QueryError(f"this result could not be turned into tables ({str(exc).splitlines()[0]})") from None
    conn = duckdb.connect(
        str(db_path(result)), read_only=True, config={"threads": THREADS, "memory_limit": MEMORY_LIMIT}
    )
    timer = threading.Timer(QUERY_SECONDS, conn.interrupt)
    try:
        conn.execute("SET enable_external_access = false")
        conn.execute("SET lock_configuration = true")
        timer.start()
        try:
            cursor = conn.execute(sql)
            if cursor.description is None:
                raise QueryError("the statement returned no rows; only queries (SELECT, WITH ...) answer")
            columns = [d[0] for d in cursor.description]
            rows = [list(r) for r in cursor.fetchmany(FETCH_CAP + 1)]
            total = len(rows)
            if total > FETCH_CAP:
                rows = rows[:FETCH_CAP]
                total = conn.execute(f"SELECT count(*) FROM ({sql.rstrip().rstrip(';')})").fetchone()[0]
        except duckdb.InterruptException:
            raise QueryError(f"the query ran longer than {QUERY_SECONDS:.0f} s and was stopped; narrow it") from None
        except duckdb.PermissionException as exc:
            raise QueryError(
                "that reads or writes outside this result, which response_query does not allow "
                f"(only this result's tables can be queried): {str(exc).splitlines()[0]}"
            ) from None
        except duckdb.Error as exc:
            raise QueryError(f"DuckDB: {str(exc).splitlines()[0]}") from None
    finally:
        timer.cancel()
        conn.close()
    return columns, [json.loads(dumps(r)) for r in rows], total
