"""What every shape's loader shares: the table record, unique SQL names, quoting, and the column profile an
outline shows (type, nulls, distinct, min/max, samples)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAIN = "items"  # the main table of a result: its largest array of records, map, CSV or JSON Lines
RESERVED = ("lines", "doc")  # the text table and the whole-document table keep these names
MAX_COLUMNS = 500  # a part with more different keys is one JSON column: a result too wide for a table
PROFILE_SAMPLES = 2
SAMPLE_CHARS = 40
TYPE_CHARS = 60
EXACT_DISTINCT_ROWS = 200_000  # up to this many rows an exact count(DISTINCT) of each column is cheap
APPROX_NOTE = "estimate (approx_count_distinct, HyperLogLog: within a few %)"


@dataclass
class Table:
    """One table of a result's DuckDB file, as the outline and the query's errors describe it."""

    name: str
    source: str  # where its rows come from: a JSON path, "CSV", "JSON lines", "text lines", "whole document"
    rows: int = 0
    columns: list[dict[str, Any]] = field(default_factory=list)  # the profile: name, type, nulls, ...
    notes: list[str] = field(default_factory=list)  # what the model must know (a column left as text, ...)
    key_column: str | None = None  # maps: the column holding each entry's key

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.name, "from": self.source, "rows": self.rows}
        if self.key_column:
            out["keyColumn"] = self.key_column
        out["columns"] = self.columns
        if self.notes:
            out["notes"] = self.notes
        return out


BRIEF_COLUMNS = 16


def brief(table: Table, columns: int = BRIEF_COLUMNS) -> str:
    """One line for a fileRef: rows, where from, the columns a first query needs."""
    names = [c["name"] for c in table.columns]
    shown = ", ".join(names[:columns]) + (f", … (+{len(names) - columns})" if len(names) > columns else "")
    where = "" if table.source.startswith(("CSV", "text lines", "JSON lines", "whole")) else f" from {table.source}"
    key = f", key column {table.key_column}" if table.key_column else ""
    return f"{table.rows} rows{where}{key}: {shown}"


def quote(name: str) -> str:
    """A SQL identifier, always quoted: a key named `select`, `2024` or `a.b` is a column like any other."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """A SQL string literal (a view cannot take a prepared parameter)."""
    return "'" + text.replace("'", "''") + "'"


def sql_name(name: str) -> str:
    """The identifier as a hint writes it: bare when DuckDB reads it bare, else quoted."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_]*", name) and name not in _KEYWORDS else quote(name)


_KEYWORDS = {"select", "from", "where", "group", "order", "by", "limit", "table", "key", "value", "all", "and", "or"}


class Names:
    """Table names of one result: each path gets a readable name, never one already taken."""

    def __init__(self) -> None:
        self.taken: set[str] = {MAIN, *RESERVED}

    def claim(self, wanted: str) -> str:
        base = re.sub(r"[^0-9A-Za-z_\u0080-\uffff]+", "_", wanted).strip("_") or "t"
        name, n = base, 2
        while name.lower() in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name.lower())
        return name


def unique_column(wanted: str, existing: list[str]) -> str:
    """A column name that none of `existing` has (a map's key column beside a field named `key`)."""
    lowered = {c.lower() for c in existing}
    name = wanted
    while name.lower() in lowered:
        name = "_" + name
    return name


def start_larger(conn: Any) -> None:
    """Give the next statements the conversion's larger memory limit now, where the first would fail
    and the statement run twice (a worker's `sql_worker._Growing`; a plain connection keeps its one limit)."""
    if hasattr(conn, "grow"):
        conn.grow()


def untangle(conn: Any, table: Table) -> None:
    """A column DuckDB typed JSON because its values mix types (a title that is sometimes a number)
    becomes text when none of its values is an object or array, so it compares and prints as text."""
    for name, duck_type, *_ in conn.execute(f"DESCRIBE {quote(table.name)}").fetchall():
        if duck_type != "JSON":
            continue
        q = quote(name)
        nested = conn.execute(
            f"SELECT count(*) FROM {quote(table.name)} WHERE json_type({q}) IN ('OBJECT', 'ARRAY')"
        ).fetchone()[0]
        if nested:
            continue
        conn.execute(
            f"ALTER TABLE {quote(table.name)} ALTER {q} TYPE VARCHAR USING "
            f"CASE WHEN json_type({q}) = 'NULL' THEN NULL ELSE {q}->>'$' END"
        )
        table.notes.append(f"column {q} mixes strings and numbers: kept as text")


def described(conn: Any, table: Table) -> Table:
    """Rows and the columns' names and types: what a fileRef names (cheap: no scan of the values), before
    the profiles."""
    table.rows = conn.execute(f"SELECT count(*) FROM {quote(table.name)}").fetchone()[0]
    described = conn.execute(f"DESCRIBE {quote(table.name)}").fetchall()
    table.columns = [{"name": row[0], "type": _short(str(row[1]), TYPE_CHARS)} for row in described]
    return table


def profile(conn: Any, table: Table) -> Table:
    """Rows and per column: type, nulls, distinct count, min/max and two samples. The distinct count is
    exact up to EXACT_DISTINCT_ROWS rows; above, DuckDB's HyperLogLog estimate, capped at the values
    there are and marked `distinctApprox` (an estimate above the row count reads as duplicates that are
    not there). A map's key column is unique by construction: said, not counted."""
    described = conn.execute(f"DESCRIBE {quote(table.name)}").fetchall()
    names = [row[0] for row in described]
    types = {row[0]: str(row[1]) for row in described}
    table.rows = conn.execute(f"SELECT count(*) FROM {quote(table.name)}").fetchone()[0]
    if not names or table.name in RESERVED:  # lines and doc: their two columns say all
        table.columns = [{"name": n, "type": types[n]} for n in names]
        return table
    exact = table.rows <= EXACT_DISTINCT_ROWS
    stats: list[str] = []
    for n in names:
        q = quote(n)
        stats.append(f"count({q})")
        if _orderable(types[n]):
            distinct = f"count(DISTINCT {q})" if exact else f"approx_count_distinct({q})"
            stats += [distinct if n != table.key_column else "0", f"min({q})::VARCHAR", f"max({q})::VARCHAR"]
    row = conn.execute(f"SELECT {', '.join(stats)} FROM {quote(table.name)}").fetchone()
    head = conn.execute(f"SELECT * FROM {quote(table.name)} LIMIT 200").fetchall()
    at = 0
    table.columns = []
    for i, n in enumerate(names):
        col: dict[str, Any] = {"name": n, "type": _short(types[n], TYPE_CHARS)}
        col["nulls"] = table.rows - row[at]
        at += 1
        if _orderable(types[n]):
            values = table.rows - col["nulls"]
            distinct, low, high = row[at], row[at + 1], row[at + 2]
            at += 3
            if n == table.key_column:
                col["distinct"], col["unique"] = values, True
            else:
                col["distinct"] = min(distinct, values)
                if not exact:
                    col["distinctApprox"] = APPROX_NOTE
                elif distinct == values == table.rows > 1:
                    col["unique"] = True
            if low is not None and types[n] != "VARCHAR":  # a text's min and max say little; samples do
                col["min"], col["max"] = _short(low, SAMPLE_CHARS), _short(high, SAMPLE_CHARS)
        samples: list[Any] = []
        for r in head:
            value = r[i]
            if value is not None and value not in samples:
                samples.append(value)
                if len(samples) == PROFILE_SAMPLES:
                    break
        col["samples"] = [_short(v if isinstance(v, (int, float, bool)) else str(v), SAMPLE_CHARS) for v in samples]
        table.columns.append(col)
    return table


def _orderable(duck_type: str) -> bool:
    return not any(t in duck_type for t in ("STRUCT", "MAP", "[]", "JSON", "UNION", "BLOB"))


def _short(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + f"…(+{len(value) - limit})"
    return value
