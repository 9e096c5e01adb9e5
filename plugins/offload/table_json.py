"""A JSON result's tables: every array of records and every map (an object keyed by name: API models,
OpenAPI `paths`, lockfile `packages`, dependency maps, i18n catalogs), one table each, the largest named
`items`; and `doc`, the whole document as one JSON value, for what no table holds.

A map's table has one row per entry: a key column (`key`, or `_key` when the values have a field `key`)
and the value's fields (an object) or `value` (anything else). Tables are named after their path; a name
already taken (a key literally named `items`, `a.b` beside `a_b`) gets a number, never another's table.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import plugins.offload.json_outline as json_outline
from gateway.services.text import dumps
from plugins.offload.json_file import children
from plugins.offload.paths import Step, format_path
from plugins.offload.table_jsonl import object_size
from plugins.offload.tables import MAIN, MAX_COLUMNS, Names, Table, quote, unique_column, untangle

SMALL_MAP = 4  # a small object is a table too when all of its (at least this many) values are objects
DOC_BYTES = 16 * 1024 * 1024  # documents up to this size are also one JSON value in `doc`
PIECE_BYTES = 2 * 1024 * 1024  # rows are handed to DuckDB in files of about this size (its reader's memory)
LONG_ROW = 64 * 1024  # a conversion with rows longer than this (bytes of JSON)...
WIDE_ROW = 100  # ...or with more fields than this starts with its larger memory limit
_KEY = "__ctx_entry_key__"  # the key column while loading; renamed once the value's fields are known


def candidates(path: Path) -> list[tuple[tuple[Step, ...], bool, int]]:
    """(steps, is_array, rows) of each part that is a table, largest first."""
    found = json_outline.nodes(path)
    maps = {s for s, n in found.items() if n.is_map}
    out = []
    for steps, node in found.items():
        if any(steps[:i] in maps for i in range(len(steps))):
            continue  # an entry of a map is a row, not a table
        if node.type == "array" and node.count and node.objects * 2 >= node.count:
            out.append((steps, True, node.count))
        elif node.is_map or (node.type == "object" and node.count >= SMALL_MAP and node.objects == node.count):
            out.append((steps, False, node.count))
    out.sort(key=lambda c: (-c[2], len(c[0])))
    return out


class Stopped(Exception):
    """The conversion was told to stop (its time limit, or the gateway is stopping)."""


def load(conn: Any, path: Path, scratch: Path, stop: threading.Event, parts: list[Any] | None = None) -> list[Table]:
    """Create the tables; `scratch` is a temporary file the loader may write (removed by the caller);
    `stop` ends the conversion; `parts` are `candidates(path)` when the caller has them already."""
    names = Names()
    tables = []
    for i, (steps, is_array, _) in enumerate(candidates(path) if parts is None else parts):
        name = MAIN if i == 0 else names.claim("_".join(str(s) for s in steps) or "root")
        tables.append(_load_part(conn, path, list(steps), is_array, name, scratch, stop))
    if path.stat().st_size <= DOC_BYTES:
        conn.execute(
            "CREATE TABLE doc AS SELECT json FROM read_json_objects(?, format='unstructured', "
            f"maximum_object_size={object_size(path.stat().st_size)})",
            [str(path)],
        )
        tables.append(Table("doc", "whole document (one row, column json)"))
    return tables


def _load_part(
    conn: Any, path: Path, steps: list[Step], is_array: bool, name: str, scratch: Path, stop: threading.Event
) -> Table:
    pieces: list[Path] = []
    try:
        return _load_rows(conn, path, steps, is_array, name, scratch, stop, pieces)
    finally:
        for piece in pieces:
            piece.unlink(missing_ok=True)


def _load_rows(
    conn: Any,
    path: Path,
    steps: list[Step],
    is_array: bool,
    name: str,
    scratch: Path,
    stop: threading.Event,
    pieces: list[Path],
) -> Table:
    """The rows written as JSON Lines in pieces of PIECE_BYTES (`scratch` and numbered files beside it),
    then read by DuckDB as one list of files: its JSON reader holds about a file's size while it reads
    (70 MB for a 60 MB file, 41 MB for pieces of 2 MB)."""
    longest, skipped, fields, size = 0, 0, set(), 0
    pieces.append(scratch)
    fh = open(scratch, "wb")  # noqa: SIM115 - closed below, or replaced by the next piece
    try:
        for key, value in children(path, steps, is_array, json_outline.prefix_is_safe(path, steps)):
            if is_array:
                if not isinstance(value, dict):
                    skipped += 1
                    continue
                row = value
            else:
                row = {_KEY: key, **value} if isinstance(value, dict) else {_KEY: key, "value": value}
            if len(fields) <= MAX_COLUMNS:
                fields.update(row)
            line = dumps(row).encode() + b"\n"
            longest = max(longest, len(line))
            if size >= PIECE_BYTES:  # bytes counted here: a text file's tell() costs more than the row
                if stop.is_set():
                    raise Stopped
                fh.close()
                pieces.append(scratch.with_name(f"{scratch.name}.{len(pieces)}"))
                fh = open(pieces[-1], "wb")  # noqa: SIM115
                size = 0
            fh.write(line)
            size += len(line)
    finally:
        fh.close()
    files = [str(p) for p in pieces]
    table = Table(name, format_path(steps))
    if (longest > LONG_ROW or len(fields) > WIDE_ROW) and hasattr(conn, "grow"):
        conn.grow()  # the small memory limit would fail this statement: it would run twice
    if len(fields) > MAX_COLUMNS:  # a wide, sparse part: one JSON value a row, not a column a key
        conn.execute(
            f"CREATE TABLE {quote(name)} AS SELECT json FROM read_json_objects(?, format='newline_delimited', "
            f"maximum_object_size={object_size(4 * longest)})",
            [files],
        )
        table.notes.append(
            f"more than {MAX_COLUMNS} different keys: one row per {'item' if is_array else 'entry'} in column "
            f"json (JSON); read fields with json->>'$.name'" + ("" if is_array else f", the key with json->>'$.{_KEY}'")
        )
        return table
    conn.execute(
        f"CREATE TABLE {quote(name)} AS SELECT * FROM read_json_auto(?, format='newline_delimited', "
        f"maximum_object_size={object_size(4 * longest)}, sample_size=-1, union_by_name=true)",
        [files],
    )
    untangle(conn, table)
    if not is_array:
        key_column = unique_column("key", [f for f in fields if f != _KEY])
        conn.execute(f"ALTER TABLE {quote(name)} RENAME COLUMN {quote(_KEY)} TO {quote(key_column)}")
        table.key_column = key_column
        table.notes.append(f"one row per entry of the object at {format_path(steps)}; its key is {key_column}")
    if skipped:
        table.notes.append(f"{skipped} items of the array are not objects and have no row")
    return table
