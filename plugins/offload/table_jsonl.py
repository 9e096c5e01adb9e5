"""JSON Lines / NDJSON results: one row per line's object, typed by DuckDB's JSON reader."""

from __future__ import annotations

import json
import re
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


def longest_line(path: Path) -> tuple[int, bool]:
    """Bytes of the longest line of a file, and whether a string in it may be a date (`may_hold_dates`)."""
    longest, carried, dates, tail = 0, 0, False, b""
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            start = 0
            while (newline := block.find(b"\n", start)) >= 0:
                longest = max(longest, carried + newline - start)
                carried, start = 0, newline + 1
            carried += len(block) - start
            dates = dates or may_hold_dates(tail + block)  # a string may start at the end of a block
            tail = block[-_DATE_REACH:]
    return max(longest, carried), dates


# DuckDB's JSON reader tries ~14 date and timestamp formats on every string while it detects the types
# (80 of the 180 ms of a 2.6 MB API model's). Every format starts with a number, and its native casts
# take white space, a minus, a digit, or `epoch` / `infinity`: where no string of the data starts so,
# nothing can be typed a date, and one fixed format detects the same types. A string is looked at from
# its opening quote (one not escaped); keys count too (rarely led by a digit: then all formats are tried).
_QUOTE_LED = re.compile(rb'"[\t\n\v\f\r ]*(?:[-0-9eEiI\\]|\Z)')
_DATE_LED = re.compile(
    rb'"(?:[\t\n\v\f\r ]|\\[tnrf])*(?:-?(?:[0-9]|(?i:epoch|infinity))|[^"\\]{0,9}\\u00)'
)  # an escape of an ASCII character within its first characters may be a digit or a space
_LEAD = re.compile(rb'"(?:[\t\n\v\f\r ]|\\[tnrf])*')  # a string's opening quote and its white space
_DATE_REACH = 64  # bytes of a block carried into the next: a string's start that may be a date fits
_UNSURE_END = 16  # a string's white space that ends this close to the end of a block may lead to a date
FIXED_DATES = ", dateformat='%Y-%m-%d', timestampformat='%Y-%m-%dT%H:%M:%S'"


def may_hold_dates(data: bytes) -> bool:
    """Whether a JSON string in `data` (whole records, or a block of them) may be typed a date or a
    timestamp by DuckDB's detection: False proves none can (`date_options`)."""
    for hit in _QUOTE_LED.finditer(data):
        if hit.end() == len(data):  # white space up to the end of a block: the next one tells
            return True
        at = slash = hit.start()
        while slash and data[slash - 1] == 0x5C:  # "\\" before the quote
            slash -= 1
        if slash == 0 and at:  # its escapes run past the start of `data`: unknown, so maybe
            return True
        if (at - slash) % 2 == 0 and (
            _DATE_LED.match(data, at)
            # its white space runs on past what the next block carries of this one: decided there no more
            or (at < len(data) - _DATE_REACH and _LEAD.match(data, at).end() > len(data) - _UNSURE_END)  # type: ignore[union-attr]
        ):
            return True
    return False


def date_options(may_hold: bool) -> str:
    """read_json's options for dates: DuckDB's detection where a string may be one, else one format."""
    return "" if may_hold else FIXED_DATES


def object_size(longest: int) -> int:
    """DuckDB's `maximum_object_size` for records no longer than `longest` bytes. Its JSON reader
    allocates buffers of twice this size, so the 100 MB it would take for any file cost 200 MB of
    memory for a result of a few MB; records are rarely large."""
    return max(1 << 20, longest + 1024)


# DuckDB's line reader holds more than a conversion's small memory limit for files above this size (2 MB
# of real JSON Lines failed at 48 MB): such a file starts at the larger limit instead of running twice
SMALL_LIMIT_BYTES = 1 << 20


def load(conn: Any, path: Path) -> Table:
    longest, dates = longest_line(path)
    size = object_size(longest)
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
        f"maximum_object_size={size}, sample_size=-1{date_options(dates)})",
        [str(path)],
    )
    table = Table(MAIN, "JSON lines (one row per line)")
    untangle(conn, table)
    return table
