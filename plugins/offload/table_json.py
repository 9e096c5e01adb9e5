"""A JSON result's tables: every array of records and every map (an object keyed by name: API models,
OpenAPI `paths`, lockfile `packages`, dependency maps, i18n catalogs), one table each, the largest named
`items`; and `doc`, the whole document as one JSON value, for what no table holds.

A map's table has one row per entry: a key column (`key`, or `_key` when the values have a field `key`)
and the value's fields (an object) or `value` (anything else). Tables are named after their path; a name
already taken (a key literally named `items`, `a.b` beside `a_b`) gets a number, never another's table.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any, NamedTuple

import plugins.offload.json_outline as json_outline
from gateway.services.text import dumps
from plugins.offload.json_file import children
from plugins.offload.paths import Step, format_path
from plugins.offload.table_jsonl import SMALL_LIMIT_BYTES, date_options, may_hold_dates, object_size
from plugins.offload.tables import (
    MAIN,
    MAX_COLUMNS,
    Names,
    Table,
    quote,
    start_larger,
    unique_column,
    untangle,
)

SMALL_MAP = 4  # a small object is a table too when all of its (at least this many) values are objects
DOC_BYTES = 16 * 1024 * 1024  # documents up to this size are also one JSON value in `doc`
PIECE_BYTES = 2 * 1024 * 1024  # rows are handed to DuckDB in files of about this size (its reader's memory)
LONG_ROW = 64 * 1024  # a conversion with rows longer than this (bytes of JSON)...
WIDE_ROW = 100  # ...or with more fields than this starts with its larger memory limit...
NESTED_CELLS = 500_000  # ...or with more rows x keys of their nested objects than this (the types DuckDB
# infers for them): 600,000 failed at the small limit (30,000 rows of 20 keys, 5,000 of 300, the 3,260 shapes
# of 2,049 member names of an AWS API model), 400,000 did not
NESTED_KEYS_SEEN = 10_000  # distinct nested keys counted at most
_KEY = "__ctx_entry_key__"  # the key column while loading; renamed once the value's fields are known


class Part(NamedTuple):
    """A part of the document that becomes a table."""

    steps: tuple[Step, ...]
    is_array: bool
    rows: int
    by_prefix: bool  # ijson's dotted prefix names it exactly (`json_outline.prefix_is_safe`)
    root_keys: int = 0  # how many keys the root object has (0: the root is not an object)


def candidates(path: Path) -> list[Part]:
    """Each part that is a table, largest first."""
    found = json_outline.nodes(path)
    root = found.get(())
    keys = root.count if root is not None and root.type == "object" else 0
    maps = {s for s, n in found.items() if n.is_map}
    out = []
    for steps, node in found.items():
        if any(steps[:i] in maps for i in range(len(steps))):
            continue  # an entry of a map is a row, not a table
        if node.type == "array" and node.count and node.objects * 2 >= node.count:
            out.append(Part(steps, True, node.count, json_outline.prefix_is_safe(path, list(steps)), keys))
        elif node.is_map or (node.type == "object" and node.count >= SMALL_MAP and node.objects == node.count):
            out.append(Part(steps, False, node.count, json_outline.prefix_is_safe(path, list(steps)), keys))
    out.sort(key=lambda c: (-c.rows, len(c.steps)))
    return out


class Stopped(Exception):
    """The conversion was told to stop (its time limit, or the gateway is stopping)."""


def load(conn: Any, path: Path, scratch: Path, stop: threading.Event, parts: list[Part] | None = None) -> list[Table]:
    """Create the tables; `scratch` is a temporary file the loader may write (removed by the caller);
    `stop` ends the conversion; `parts` are `candidates(path)` when the caller has them already."""
    names = Names()
    tables = []
    for i, part in enumerate(candidates(path) if parts is None else parts):
        name = MAIN if i == 0 else names.claim("_".join(str(s) for s in part.steps) or "root")
        tables.append(_load_part(conn, path, part, name, scratch, stop))
    if (size := path.stat().st_size) <= DOC_BYTES:
        if size > SMALL_LIMIT_BYTES:
            start_larger(conn)  # DuckDB parses the document whole: 1.6 MB of nested JSON failed at the small limit
        conn.execute(
            "CREATE TABLE doc AS SELECT json FROM read_json_objects(?, format='unstructured', "
            f"maximum_object_size={object_size(size)})",
            [str(path)],
        )
        tables.append(Table("doc", "whole document (one row, column json)"))
    return tables


def _load_part(conn: Any, path: Path, part: Part, name: str, scratch: Path, stop: threading.Event) -> Table:
    pieces: list[Path] = []
    try:
        if part.is_array and (table := _load_raw(conn, path, part, name, scratch, stop, pieces)) is not None:
            return table
        for piece in pieces:
            piece.unlink(missing_ok=True)
        pieces.clear()
        return _load_rows(conn, path, list(part.steps), part.is_array, part.by_prefix, name, scratch, stop, pieces)
    finally:
        for piece in pieces:
            piece.unlink(missing_ok=True)


# -- the raw path: an array's own bytes handed to DuckDB, cut between records, nothing parsed in Python --

RAW_PIECE = 1 << 20  # bytes of records per piece (DuckDB's reader holds about two pieces; 48 MB suffice)
RAW_EDGE = 1 << 20  # the array must start (end) this close to the file's start (end)
RAW_TRIES = 64  # brackets tried at each end before giving the part to the Python path
_BOUNDARY = re.compile(rb"\}\s*,(?=\s*\{)")  # between two records, or inside one (a nested array)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _load_raw(
    conn: Any, path: Path, part: Part, name: str, scratch: Path, stop: threading.Event, pieces: list[Path]
) -> Table | None:
    """The array at the root or at a key of the root object, read by DuckDB from its own bytes: about
    5x faster than parsing every record in Python (68 MB: 1.8 s against ~9 s). None when the array is
    elsewhere, or its bytes are not what DuckDB can take as they are (an item that is not an object, a
    record with a key twice, more than MAX_COLUMNS keys): the Python path makes that table.

    The pieces are cut at `},{` without parsing, so a cut may fall inside a string or a nested array;
    DuckDB's reader is strict, so such a piece fails to parse (and the Python path takes over): a piece
    that parses as a whole array proves its cut fell between two records, piece after piece. The row
    count is checked against the outline's as well."""
    import duckdb

    if len(part.steps) > 1 or (part.steps and not isinstance(part.steps[0], str)):
        return None
    span = _array_span(path, part.steps[0] if part.steps else None, part.root_keys)
    if span is None:
        return None
    longest, dates = _cut(path, span, scratch, stop, pieces)
    if not pieces:
        return None
    if part.rows * _nested_width(pieces[0]) > NESTED_CELLS:
        start_larger(conn)
    table = Table(name, format_path(list(part.steps)))
    try:
        conn.execute(
            f"CREATE TABLE {quote(name)} AS SELECT * FROM read_json_auto(?, format='array', records=true, "
            f"maximum_object_size={object_size(longest)}, sample_size=-1, union_by_name=true{date_options(dates)})",
            [[str(p) for p in pieces]],
        )
    except duckdb.Error as exc:
        if isinstance(exc, duckdb.InterruptException):
            raise
        return None
    rows = conn.execute(f"SELECT count(*) FROM {quote(name)}").fetchone()[0]
    columns = len(conn.execute(f"DESCRIBE {quote(name)}").fetchall())
    if rows != part.rows or columns > MAX_COLUMNS:
        conn.execute(f"DROP TABLE {quote(name)}")
        return None
    untangle(conn, table)
    return table


def _array_span(path: Path, key: str | None, keys: int) -> tuple[int, int] | None:
    """The offsets of the `[` and the `]` of the root array (key None) or of the root object's array
    at `key`, found by trying the brackets near each end: the text before a `[` must be the object up
    to `"key":` (it parses once `null}` is added), the text after a `]` the rest of the object, with
    the keys the root object has (`keys`) between them."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(min(size, RAW_EDGE))
        fh.seek(max(0, size - RAW_EDGE))
        tail_at = fh.tell()
        tail = fh.read()
    body = head.lstrip(b" \t\r\n")
    lead = len(head) - len(body)
    start = end = None
    before: list[tuple[str, Any]] = []
    if key is None:
        if body[:1] == b"[":
            start = lead
        trimmed = tail.rstrip(b" \t\r\n")
        if trimmed[-1:] == b"]":
            end = tail_at + len(trimmed) - 1
    else:
        if body[:1] != b"{":
            return None
        at = lead
        for _ in range(RAW_TRIES):
            at = head.find(b"[", at + 1)
            if at < 0:
                break
            if (before := _pairs(head[:at] + b"null}")) and before[-1] == (key, None):
                start = at
                break
        at = len(tail)
        for _ in range(RAW_TRIES):
            at = tail.rfind(b"]", 0, at)
            if at < 0:
                break
            after = _pairs(b'{"": null' + tail[at + 1 :]) if start is not None else []
            if after and len(before) + len(after) - 1 == keys:
                end = tail_at + at
                break
    if start is None or end is None or end <= start:
        return None
    return start, end


def _pairs(text: bytes) -> list[tuple[str, Any]]:
    """The (key, value) pairs of the JSON object `text`, in order; none when it is not one."""
    try:
        pairs = json.loads(text, object_pairs_hook=lambda p: p)
    except ValueError:  # not JSON (UnicodeDecodeError is one too)
        return []
    return pairs if isinstance(pairs, list) else []


def _cut(
    path: Path, span: tuple[int, int], scratch: Path, stop: threading.Event, pieces: list[Path]
) -> tuple[int, bool]:
    """The records between the array's brackets written as arrays of about RAW_PIECE bytes (`scratch`
    and numbered files beside it); the longest piece's size, and whether a string may be a date."""
    start, end = span
    longest, dates = 0, False

    def write(chunk: bytes) -> None:
        nonlocal longest, dates
        if stop.is_set():
            raise Stopped
        pieces.append(scratch if not pieces else scratch.with_name(f"{scratch.name}.{len(pieces)}"))
        pieces[-1].write_bytes(b"[" + chunk + b"]")
        longest = max(longest, len(chunk))
        dates = dates or may_hold_dates(chunk)  # whole records (else DuckDB refuses the piece)

    with open(path, "rb") as fh:
        fh.seek(start + 1)
        left = end - start - 1
        buf = bytearray()  # grows in place while a long record is read
        searched, counted, depth, bias, resync = RAW_PIECE // 2, 0, 0, 0, 4 * RAW_PIECE
        while left:
            chunk = fh.read(min(RAW_PIECE, left))
            left -= len(chunk)
            buf += chunk
            while len(buf) >= RAW_PIECE:
                found = _BOUNDARY.search(buf, searched)
                if found is None:  # a record longer than a piece: read on
                    searched = max(searched, len(buf) - 64)
                    break
                cut = found.start() + 1
                depth += _nesting(buf, counted, cut)  # brackets opened minus closed, strings included
                counted, searched = cut, found.end()
                if depth != bias and cut > resync:
                    # strings with brackets of their own never balance: count without them, now and then
                    bias, resync = depth - _nesting(_STRING.sub(b"", bytes(buf[:cut]))), cut + 4 * RAW_PIECE
                if depth == bias:  # the cut is between two records of the array (DuckDB checks it)
                    write(bytes(buf[:cut]))
                    del buf[: found.end()]
                    searched, counted, depth, bias, resync = RAW_PIECE // 2, 0, 0, 0, 4 * RAW_PIECE
        if buf.strip():
            write(bytes(buf))
    return longest, dates


def _nesting(text: bytes | bytearray, start: int = 0, end: int | None = None) -> int:
    """Brackets and braces opened minus closed in text[start:end]."""
    end = len(text) if end is None else end
    opened = text.count(b"{", start, end) + text.count(b"[", start, end)
    return opened - text.count(b"}", start, end) - text.count(b"]", start, end)


def _load_rows(
    conn: Any,
    path: Path,
    steps: list[Step],
    is_array: bool,
    by_prefix: bool,
    name: str,
    scratch: Path,
    stop: threading.Event,
    pieces: list[Path],
) -> Table:
    """The rows written as JSON Lines in pieces of PIECE_BYTES (`scratch` and numbered files beside it),
    then read by DuckDB as one list of files: its JSON reader holds about a file's size while it reads
    (70 MB for a 60 MB file, 41 MB for pieces of 2 MB)."""
    import duckdb

    longest, skipped, fields, size, rows, dates = 0, 0, set(), 0, 0, False
    nested: set[str] = set()
    pieces.append(scratch)
    fh = open(scratch, "wb")  # noqa: SIM115 - closed below, or replaced by the next piece
    try:
        for key, value in children(path, steps, is_array, by_prefix):
            if is_array:
                if not isinstance(value, dict):
                    skipped += 1
                    continue
                row = value
            else:
                row = {_KEY: key, **value} if isinstance(value, dict) else {_KEY: key, "value": value}
            if len(fields) <= MAX_COLUMNS:
                fields.update(row)
            if len(nested) <= NESTED_KEYS_SEEN:
                _nested_keys(row, nested)
            rows += 1
            line = dumps(row).encode() + b"\n"
            longest = max(longest, len(line))
            dates = dates or may_hold_dates(line)
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
    if longest > LONG_ROW or len(fields) > WIDE_ROW or rows * len(nested) > NESTED_CELLS:
        start_larger(conn)

    def one_json_column(why: str) -> Table:
        """A wide or sparse part: one JSON value a row, not a column a key."""
        conn.execute(
            f"CREATE TABLE {quote(name)} AS SELECT json FROM read_json_objects(?, format='newline_delimited', "
            f"maximum_object_size={object_size(4 * longest)})",
            [files],
        )
        table.notes.append(
            f"{why}: one row per {'item' if is_array else 'entry'} in column json (JSON); read fields with "
            f"json->>'$.name'" + ("" if is_array else f", the key with json->>'$.{_KEY}'")
        )
        return table

    if len(fields) > MAX_COLUMNS:
        return one_json_column(f"more than {MAX_COLUMNS} different keys")
    try:
        conn.execute(
            f"CREATE TABLE {quote(name)} AS SELECT * FROM read_json_auto(?, format='newline_delimited', "
            f"maximum_object_size={object_size(4 * longest)}, sample_size=-1, union_by_name=true{date_options(dates)})",
            [files],
        )
    except duckdb.NotImplementedException as exc:
        if "Duplicate name" not in str(exc):
            raise
        # keys that differ only in case (`message` beside `Message`): DuckDB's columns and fields cannot
        return one_json_column("keys that differ only in case")
    if not is_array and _KEY not in {row[0] for row in conn.execute(f"DESCRIBE {quote(name)}").fetchall()}:
        # each key in few entries (a package.json's root): DuckDB reads such rows as one map, not columns
        conn.execute(f"DROP TABLE {quote(name)}")
        return one_json_column("entries too unlike for columns")
    untangle(conn, table)
    if not is_array:
        key_column = unique_column("key", [f for f in fields if f != _KEY])
        conn.execute(f"ALTER TABLE {quote(name)} RENAME COLUMN {quote(_KEY)} TO {quote(key_column)}")
        table.key_column = key_column
        table.notes.append(f"one row per entry of the object at {format_path(steps)}; its key is {key_column}")
    if skipped:
        table.notes.append(f"{skipped} items of the array are not objects and have no row")
    return table


def _nested_width(piece: Path) -> int:
    """The distinct nested keys (`_nested_keys`) of the records in a piece of the raw path (the first:
    about a MB of them, parsed in ~10 ms); 0 when the piece does not parse (its cut fell inside a record:
    DuckDB finds that too)."""
    try:
        records = json.loads(piece.read_bytes())
    except ValueError:
        return 0
    keys: set[str] = set()
    for record in records if isinstance(records, list) else ():
        if isinstance(record, dict) and len(keys) <= NESTED_KEYS_SEEN:
            _nested_keys(record, keys)
    return len(keys)


def _nested_keys(row: dict[str, Any], into: set[str]) -> None:
    """The keys of the objects in a row's fields, two levels down: the width of the types DuckDB infers."""
    for value in row.values():
        if isinstance(value, dict):
            into.update(value)
            for inner in value.values():
                if isinstance(inner, dict):
                    into.update(inner)
