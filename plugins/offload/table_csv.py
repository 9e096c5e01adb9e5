"""CSV / TSV results as a typed table: missing values are NULL, each column takes the type of its values.

DuckDB reads the file as text first (its reader handles quoted separators and newlines); then one scan
counts, per column, how many of the values that are not missing cast to each type, and the table is made
with the narrowest type all of them take. A column that stays text although most of its values are numbers
is named in the table's notes, so no ORDER BY over text passes unremarked.
"""

from __future__ import annotations

import csv
import io
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
    missing = ", ".join(f"'{m}'" for m in MISSING)
    counts: list[str] = []
    for n in names:
        v = f"trim({quote(n)})"
        present = f"{v} IS NOT NULL AND lower({v}) NOT IN ({missing})"
        counts.append(f"count(*) FILTER (WHERE {present})")
        counts += [f"count(*) FILTER (WHERE {present} AND {check.format(v=v)})" for _, check in TYPES]
    text_missing = ", ".join(f"'{m}'" for m in TEXT_MISSING)
    counts += [f"count(*) FILTER (WHERE lower(trim({quote(n)})) IN ({text_missing}))" for n in names]
    row = conn.execute(f"SELECT {', '.join(counts)} FROM raw_csv").fetchone() if names else ()
    width = 1 + len(TYPES)
    columns, notes, nulled = [], [], []
    for i, n in enumerate(names):
        values, *castable = row[i * width : (i + 1) * width]
        q, v = quote(n), f"trim({quote(n)})"
        kind = next((t for (t, _), c in zip(TYPES, castable, strict=True) if values and c == values), None)
        if kind is None:
            columns.append(f"CASE WHEN lower({v}) IN ({text_missing}) THEN NULL ELSE {q} END AS {q}")
            if missing_text := row[len(names) * width + i]:
                nulled.append(f"{n} ({missing_text})")
            numbers = castable[1]
            if values and numbers >= MOSTLY * values:
                notes.append(
                    f"column {q} is text: {values - numbers} of its {values} values are not numbers; "
                    f"use TRY_CAST({q} AS DOUBLE) to compare or sort it as numbers"
                )
            continue
        columns.append(f"CASE WHEN lower({v}) IN ({missing}) THEN NULL ELSE CAST({v} AS {kind}) END AS {q}")
    conn.execute(f"CREATE TABLE {MAIN} AS SELECT {', '.join(columns)} FROM raw_csv")
    conn.execute("DROP VIEW raw_csv")
    notes.append("missing values (empty, NA, N/A, NaN, null, None, -, ?) in number and date columns are NULL")
    if nulled:
        notes.append("text columns: empty, NA, N/A, NaN and null read as NULL in " + ", ".join(nulled[:10]))
    return Table(MAIN, "CSV" if sep == "," else f"CSV (separator {sep!r})", notes=notes)
