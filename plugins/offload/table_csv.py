"""CSV / TSV results as a typed table: missing values are NULL, each column takes the type of its values.

DuckDB reads the file as text first (its reader handles quoted separators and newlines); then one scan
counts, per column, how many of the values that are not missing cast to each type, and the table is made
with the narrowest type all of them take. A column that stays text although most of its values are numbers
is named in the table's notes, so no ORDER BY over text passes unremarked.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from plugins.offload.tables import MAIN, Table, literal, quote

# How real files write "no value": R, pandas/Excel exports, SQL dumps, spreadsheets.
MISSING = ("", "na", "n/a", "nan", "null", "none", "-", "--", "?", "#n/a", "nil", ".")
# In a text column "None", "-" or "?" can be a real value (damage: None); these never are
TEXT_MISSING = ("", "na", "n/a", "#n/a", "nan", "null")
HEAD_BYTES = 64 * 1024
# (DuckDB type, the check that every value casts to it), narrowest first
TYPES = (
    ("BIGINT", "TRY_CAST({v} AS BIGINT) IS NOT NULL AND regexp_matches({v}, '^[-+]?([1-9][0-9]*|0)$')"),
    ("DOUBLE", "TRY_CAST({v} AS DOUBLE) IS NOT NULL AND NOT regexp_matches({v}, '^[-+]?0[0-9]')"),
    ("DATE", "TRY_CAST({v} AS DATE) IS NOT NULL"),
    ("TIMESTAMP", "TRY_CAST({v} AS TIMESTAMP) IS NOT NULL"),
    ("BOOLEAN", "lower({v}) IN ('true', 'false')"),
)
# DuckDB reads a DATE or a TIMESTAMP only from a text whose first character past white space and a minus
# is a digit, or from infinity, inf or epoch (any case): no other value is cast to one
MAY_BE_DATE = r"^[\t\n\v\f\r ]*-?[0-9iIeE]"  # (RE2's \s leaves out \v, which DuckDB skips)
MOSTLY = 0.5  # a text column with at least this share of numbers is flagged


def dialect(path: Path) -> str | None:
    """The separator when the file reads as a table (every row of its head has the same number of fields,
    at least two, quoted fields included); else None."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    text = head.decode("utf-8", errors="replace")
    if len(head) == HEAD_BYTES:
        text = text[: text.rfind("\n") + 1]  # whole rows only
    for sep in (",", "\t", ";", "|"):
        if sep not in text.partition("\n")[0]:
            continue
        try:
            rows = [r for r in csv.reader(io.StringIO(text), delimiter=sep) if r]
        except csv.Error:
            continue
        widths = {len(r) for r in rows}
        if len(rows) >= 2 and len(widths) == 1 and widths.pop() >= 2:
            return sep
    return None


def header(path: Path, sep: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        return next(csv.reader(fh, delimiter=sep), [])


def load(conn: Any, path: Path, sep: str) -> Table:
    """The table `items`, typed, from the CSV at `path`."""
    conn.execute(
        f"CREATE TEMP VIEW raw_csv AS SELECT * FROM read_csv({literal(str(path))}, all_varchar=true, header=true, "
        f"delim={literal(sep)}, quote='\"', escape='\"', null_padding=true, strict_mode=false)"
    )
    names = [row[0] for row in conn.execute("DESCRIBE raw_csv").fetchall()]
    found = {row[0]: row[1:] for row in conn.execute(_typing_scan(names)).fetchall()} if names else {}
    columns, notes, nulled = [], [], []
    for i, n in enumerate(names):
        values, castable, numbers, missing_text = found.get(i, (0, 0, 0, 0))  # no row: every value NULL
        q, v = quote(n), f"trim({quote(n)})"
        kind = next((t for bit, (t, _) in enumerate(TYPES, 1) if values and castable >> bit & 1), None)
        if kind is None:
            columns.append(f"CASE WHEN {_spelled(v, TEXT_MISSING)} THEN NULL ELSE {q} END AS {q}")
            if missing_text:
                nulled.append(f"{n} ({missing_text})")
            if values and numbers >= MOSTLY * values:
                notes.append(
                    f"column {q} is text: {values - numbers} of its {values} values are not numbers; "
                    f"use TRY_CAST({q} AS DOUBLE) to compare or sort it as numbers"
                )
            continue
        columns.append(f"CASE WHEN {_spelled(v, MISSING)} THEN NULL ELSE CAST({v} AS {kind}) END AS {q}")
    conn.execute(f"CREATE TABLE {MAIN} AS SELECT {', '.join(columns)} FROM raw_csv")
    conn.execute("DROP VIEW raw_csv")
    notes.append("missing values (empty, NA, N/A, NaN, null, None, -, ?) in number and date columns are NULL")
    if nulled:
        notes.append("text columns: empty, NA, N/A, NaN and null read as NULL in " + ", ".join(nulled[:10]))
    return Table(MAIN, "CSV" if sep == "," else f"CSV (separator {sep!r})", notes=notes)


def _spelled(value: str, spellings: tuple[str, ...]) -> str:
    """SQL: the value, lower-cased, is one of `spellings`. One regular expression, not `IN (...)`: DuckDB
    gives each constant of an IN list a vector per column, so a table of 20 such columns (a 17 KB CSV)
    needed more than a conversion's first 48 MB and ran twice."""
    pattern = "|".join(re.escape(s) for s in spellings)
    longest = max(len(s.encode()) for s in spellings)  # most values are longer: no regex for them
    return f"(strlen({value}) <= {longest} AND regexp_full_match(lower({value}), {literal(f'({pattern})')}))"


def _typing_scan(names: list[str]) -> str:
    """One pass over the text table: a row per column (by its place, `i`) with how many of its values are
    present (not a missing spelling), the types every one of them casts to (a bit per `TYPES` entry, bit
    0: present), how many are numbers, and how many are a text column's missing spelling. Each value is
    trimmed once and its checks made once, into one mask; the columns' values are unnested into one, so
    the query's plan is the same small one for any number of columns (one mask per column made DuckDB
    plan for 20–25 ms before reading a row: most of a small CSV's scan). Two shortcuts leave every mask
    as the full checks make it (`tests/unit/test_offload_tables.py` compares both on tricky values): a
    whole number passes the DOUBLE check and no other, and a value that cannot be a date is not cast to
    one (a failed cast is the dearest check). Bird strikes (1.2 MB, 14 columns) 0.16 → 0.06 s, penguins
    (53 KB, 17 columns) 0.04 → 0.01 s."""
    v = "v"

    def checks(*skipped: str) -> str:
        return " | ".join(
            f"(({check.format(v=v)})::INTEGER << {bit})"
            for bit, (name, check) in enumerate(TYPES, 1)
            if name not in skipped
        )

    mask = (
        f"CASE WHEN {v} IS NULL THEN 0 WHEN {_spelled(v, TEXT_MISSING)} THEN {_TEXT_MISSING_MASK} "
        f"WHEN {_spelled(v, MISSING)} THEN 0 "
        f"WHEN {TYPES[0][1].format(v=v)} THEN {_WHOLE_MASK} "
        f"WHEN regexp_matches({v}, {literal(MAY_BE_DATE)}) THEN 1 | {checks('BIGINT')} "
        f"ELSE 1 | {checks('BIGINT', 'DATE', 'TIMESTAMP')} END"
    )
    values = ", ".join(f"trim({quote(n)})" for n in names)
    return (
        "SELECT i, count(*) FILTER (WHERE m & 1 = 1), coalesce(bit_and(m) FILTER (WHERE m & 1 = 1), 0), "
        f"count(*) FILTER (WHERE m & {_DOUBLE_BIT} = {_DOUBLE_BIT}), count(*) FILTER (WHERE m = {_TEXT_MISSING_MASK}) "
        f"FROM (SELECT i, {mask} AS m FROM (SELECT unnest(range({len(names)})) AS i, unnest([{values}]) AS {v} "
        "FROM raw_csv)) GROUP BY i"
    )


_DOUBLE_BIT = 1 << (1 + [name for name, _ in TYPES].index("DOUBLE"))  # its bit in a value's mask
_WHOLE_MASK = 1 | 1 << 1 | _DOUBLE_BIT  # present, BIGINT (the first of TYPES) and DOUBLE
_TEXT_MISSING_MASK = 1 << (len(TYPES) + 1)  # a text column's missing spelling: never present (each is in MISSING)
