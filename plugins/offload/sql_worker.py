"""The child process that runs DuckDB for response_query: one conversion or one query per process.

A query or a conversion can need far more memory than its DuckDB limit says (DuckDB computes a chunk of
2,048 rows at once: `repeat('x', 10000000)` over 150 rows is 1.5 GB before the first row is fetched), and
a runaway one must not take a shared gateway down with it. So each runs here, in a process of its own
with its address space capped, ended by its parent when its time is up, when the gateway stops, or when
the parent has read all it will read. The parent (`query.py`) writes one JSON request on stdin; this
answers JSON lines on stdout: `{"tables": [...]}` for a conversion; `{"columns": [...]}`, then
`{"rows": [...]}` batches and `{"end": true}` for a query; `{"error": ..., "kind": ...}` when it fails.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

BATCH_BYTES = 2 * 1024 * 1024  # the size a batch of rows aims at (widths measured as rows come)


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


def _send(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message, ensure_ascii=False, default=str) + "\n")
    out.flush()


class _Growing:
    """A conversion's connection that starts with a small memory limit and raises it once, to `ceiling`,
    for a statement that needs more (and runs that statement again: a failed one left nothing behind).
    Most results convert within the small limit; a worker's peak stays near DuckDB's own size."""

    def __init__(self, conn: Any, ceiling: str):
        self.conn, self.ceiling, self.grown = conn, ceiling, False

    def execute(self, *args: Any) -> Any:
        import duckdb

        try:
            return self.conn.execute(*args)
        except duckdb.OutOfMemoryException:
            if self.grown:
                raise
            self.grown = True
            self.conn.execute(f"SET memory_limit = '{self.ceiling}'")
            return self.conn.execute(*args)


def _convert(request: dict[str, Any], out: Any) -> None:
    import threading

    import duckdb

    from plugins.offload.loaders import load
    from plugins.offload.tables import profile

    raw = duckdb.connect(request["target"], config={"threads": 1, "memory_limit": request["memory"]})
    conn = _Growing(raw, request["memory_ceiling"])
    try:
        tables = load(
            conn,
            Path(request["result"]),
            request["kind"],
            Path(request["scratch"]),
            threading.Event(),
            None if "candidates" not in request else [(tuple(c[0]), c[1], c[2]) for c in request["candidates"]],
        )
        profiled = [asdict(profile(conn, t)) for t in tables]
        conn.execute("CHECKPOINT")
    finally:
        raw.close()
    _send(out, {"tables": profiled})  # after the close: the file is whole when the parent moves it


def _query(request: dict[str, Any], out: Any) -> None:
    import duckdb

    conn = duckdb.connect(
        request["db"],
        read_only=True,
        config={
            "threads": request["threads"],
            "memory_limit": request["memory"],
            "max_temp_directory_size": request["temp"],
            "enable_external_access": False,
        },
    )
    conn.execute("SET lock_configuration = true")
    cursor = conn.execute(request["sql"])
    if cursor.description is None:
        _send(out, {"error": "the statement returned no rows; only queries (SELECT, WITH ...) answer", "kind": "sql"})
        return
    _send(out, {"columns": [d[0] for d in cursor.description]})
    batch_rows = 1  # the first row tells how wide they are
    while batch := cursor.fetchmany(batch_rows):
        text = json.dumps({"rows": batch}, ensure_ascii=False, default=str)
        out.write(text + "\n")
        out.flush()
        per_row = max(1, len(text) // len(batch))
        batch_rows = max(1, min(10_000, BATCH_BYTES // per_row))
    _send(out, {"end": True})


def main() -> None:
    request = json.loads(sys.stdin.readline())
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the parent's pipe
    os.close(0)
    _limit_memory(request["address_space"])
    import duckdb

    try:
        (_convert if request["op"] == "convert" else _query)(request, out)
    except duckdb.PermissionException as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "permission"})
    except duckdb.OutOfMemoryException as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "memory"})
    except MemoryError:
        _send(out, {"error": "out of memory", "kind": "memory"})
    except duckdb.Error as exc:
        _send(out, {"error": str(exc).splitlines()[0], "kind": "duckdb"})
    except Exception as exc:  # a loader's own failure (broken JSON, ...): said, never a traceback
        _send(out, {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", "kind": "load"})


if __name__ == "__main__":
    main()
