"""JSON Lines / NDJSON results: one row per line's object, typed by DuckDB's JSON reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugins.offload.tables import MAIN, MAX_COLUMNS, Table, start_larger, untangle


def detect(path: Path) -> bool:
    """The first lines are each one JSON object."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        head = [fh.readline() for _ in range(5)]
    head = [h for h in head if h.strip()]
    try:
        return len(head) >= 2 and all(isinstance(json.loads(h), dict) for h in head)
    except ValueError:
        return False


def longest_line(path: Path) -> int:
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


def object_size(longest: int) -> int:
    """DuckDB's `maximum_object_size` for records no longer than `longest` bytes. Its JSON reader
    allocates buffers of twice this size, so the 100 MB it would take for any file cost 200 MB of
    memory for a result of a few MB; records are rarely large."""
    return max(1 << 20, longest + 1024)


# DuckDB's line reader holds more than a conversion's small memory limit for files above this size (2 MB
# of real JSON Lines failed at 48 MB): such a file starts at the larger limit instead of running twice
SMALL_LIMIT_BYTES = 1 << 20


def load(conn: Any, path: Path) -> Table:
    size = object_size(longest_line(path))
    if path.stat().st_size > SMALL_LIMIT_BYTES:
        start_larger(conn)
    keys = conn.execute(
        "SELECT count(DISTINCT k) FROM (SELECT unnest(json_keys(json)) AS k FROM "
        f"read_json_objects(?, format='newline_delimited', maximum_object_size={size}))",
        [str(path)],
    ).fetchone()[0]
    if keys > MAX_COLUMNS:  # too wide for a column a key: one JSON value a row
        conn.execute(
            f"CREATE TABLE {MAIN} AS SELECT json FROM read_json_objects(?, format='newline_delimited', "
            f"maximum_object_size={size})",
            [str(path)],
        )
        note = f"{keys} different keys: one row per line in column json (JSON); read fields with json->>'$.name'"
        return Table(MAIN, "JSON lines (one row per line)", notes=[note])
    conn.execute(
        f"CREATE TABLE {MAIN} AS SELECT * FROM read_json_auto(?, format='newline_delimited', "
        f"maximum_object_size={size}, sample_size=-1)",
        [str(path)],
    )
    table = Table(MAIN, "JSON lines (one row per line)")
    untangle(conn, table)
    return table
