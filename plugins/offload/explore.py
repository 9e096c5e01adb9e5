"""The exploring tools' handlers: outline, slice, search and compress an offloaded result, each answer cut
to the token budget."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from pathlib import Path
from typing import Any

import plugins.offload.json_compress as json_compress
import plugins.offload.json_outline as json_outline
import plugins.offload.json_search as json_search
import plugins.offload.json_values as json_values
import plugins.offload.query as query
import plugins.offload.textfile as textfile
from gateway.args import Args, ToolInputError
from gateway.services.responses import ResponseStore, id_of, saved_kind
from gateway.services.text import human_size
from plugins.offload.fit import cost, fit, longest_prefix, take_within
from plugins.offload.json_file import SMALL_FILE, BrokenJSON, is_small
from plugins.offload.json_slice import MORE, json_slice
from plugins.offload.paths import format_path, parse_path
from plugins.offload.tables import MAIN, Table, sql_name

# a wildcard or filter (`$..name`, `[?(@.x > 1)]`) over a file larger than this runs in a worker process:
# over 3 MB it held the gateway's interpreter long enough to push another caller's p99 past 300 ms
MATCHES_HERE = 256 * 1024
# what a reply holds besides the cut list (its other keys), in tokens
LINES_FRAME = 70  # start/end/total, next/prev, a note
ROWS_FRAME = 20  # columns' frame, row_count
ROWS_NOTE = 110  # the note and the fileRef of a cut answer
SAVED_BYTES = 64 * 1024 * 1024  # what a saved answer may take on disk
_NOTED_COLUMN = re.compile(r'column "((?:[^"]|"")*)"')
MODES = ("first_of_array", "sample_array", "truncate_strings", "keys_only", "select_keys")


def _terms(query: str) -> list[str]:
    terms = [t.lower() for t in query.split() if any(ch.isalnum() for ch in t)]
    if not terms:
        raise ToolInputError("response_search: `query` has no searchable words; give one or more words or ids")
    return list(dict.fromkeys(terms))[:12]


class Explorer:
    """The four handlers over one responses store; `budget` is the answer budget in tokens for the host
    connection that asked (its window decides it)."""

    def __init__(self, store: ResponseStore, namespace: str = ""):
        self.store, self.namespace = store, namespace  # the namespace: whose share of worker processes

    def _file(self, args: Args) -> Path:
        return self.store.resolve(args.str("path", required=True))

    def _kind(self, path: Path) -> str:
        return saved_kind(path)

    def _refuse_binary(self, path: Path, tool: str) -> None:
        raise ToolInputError(
            f"{tool}: {path.name} is a binary file ({human_size(path.stat().st_size)}); "
            f"open it with: {self.store.open_command(path)}"
        )

    def outline(self, args: Args, budget: int) -> dict[str, Any]:
        path = self._file(args)
        rid = id_of(path)
        kind = self._kind(path)
        if kind == "binary":
            return {
                "type": "binary",
                "size": path.stat().st_size,
                "sizeHint": human_size(path.stat().st_size),
                "openCmd": self.store.open_command(path),
            }
        tables, trouble = self._ready(path, kind)  # never waits: the tables join once they exist
        if kind == "text":
            main = next((t for t in tables if t.name == MAIN), None)
            if main is not None:  # CSV / JSON Lines: the table is the outline
                info: dict[str, Any] = {"type": "table", "size": path.stat().st_size, "format": main.source}
                info["rows"] = main.rows
                info["tables"] = [_summary(t) for t in tables]
                info["compressionHints"] = _table_hints(rid, tables)
                return self._fit(info, budget)
            info = textfile.outline(path)
            info["tables"] = [_summary(t) for t in tables] or trouble
            info["compressionHints"] = _text_hints(rid, info)
            return self._fit(info, budget)
        whole = json_outline.outline(path)
        info = {k: whole[k] for k in ("type", "size", "keys", "keyCount", "itemCount", "itemCountNote") if k in whole}
        info["tables"] = [_summary(t) for t in tables] or trouble
        info["compressionHints"] = _json_hints(rid, whole) + _table_hints(rid, tables)
        info["structure"] = whole["structure"]
        info["samples"] = whole["samples"]
        return self._fit(info, budget)

    def _ready(self, path: Path, kind: str) -> tuple[list[Table], str]:
        """The result's profiled tables if they exist, else none and what is happening (being prepared,
        N s so far; or why there are none)."""
        ready = query.tables_now(path, kind, self.namespace, wanted=True)
        return (ready, "") if isinstance(ready, list) else ([], ready)

    def _catalog(self, path: Path, kind: str) -> tuple[list[Table], list[str]]:
        """The result's tables, or none and why (the outline still answers)."""
        try:
            return query.build(path, kind, self.namespace), []
        except Exception as exc:
            return [], [f"no tables: {str(exc).splitlines()[0][:160]}"]

    def _fit(self, payload: dict[str, Any], budget: int) -> dict[str, Any]:
        value, cut = fit(payload, budget)
        if cut:
            value["note"] = "cut to fit the token budget; use response_slice on a part"
        return value

    def slice(self, args: Args, budget: int) -> dict[str, Any]:
        path = self._file(args)
        json_path = args.str("json_path")
        start = args.int("start_line", lo=1)
        end = args.int("end_line", lo=1)
        if json_path is not None and (start or end):
            raise ToolInputError("response_slice: give json_path or start_line/end_line, not both")
        if self._kind(path) == "binary":
            self._refuse_binary(path, "response_slice")
        if json_path is None:
            if start is None and end is None:
                raise ToolInputError("response_slice: give json_path (JSON) or start_line and end_line (any text)")
            start = start or 1
            end = end or start + 49
            if end < start:
                raise ToolInputError(f"response_slice: end_line {end} is before start_line {start}")
            lines, total = textfile.lines(path, start, end)
            if not lines:
                raise ToolInputError(f"response_slice: the file has {total} lines; start_line {start} is past the end")
            room = budget - LINES_FRAME
            shown = lines[: longest_prefix(len(lines), lambda n: cost(lines[:n]), room)]
            if not shown:  # one line longer than the budget: its start
                shown = [fit(lines[0], room)[0]]
            last = start + len(shown) - 1
            out: dict[str, Any] = {"start_line": start, "end_line": last, "total_lines": total, "lines": shown}
            if last < total:
                span = last - start + 1
                out["next"] = {"start_line": last + 1, "end_line": min(total, last + span)}
            if start > 1:
                out["prev"] = {"start_line": max(1, start - (last - start + 1)), "end_line": start - 1}
            if last < end and last < total:
                out["note"] = f"stopped at line {last} to fit the token budget; continue with start_line={last + 1}"
            return out
        if self._kind(path) != "json":
            raise ToolInputError(
                "response_slice: json_path works on JSON results; this one is text, use "
                "start_line/end_line or response_search"
            )
        size = path.stat().st_size
        matching = parse_path(json_path)[1] is not None  # a wildcard or filter may walk the whole document
        if size <= (MATCHES_HERE if matching else SMALL_FILE):  # parsed whole and cached here: no process to start
            answer = json_slice(path, json_path, budget)
        else:  # a path over a large file (`..*`) can build many times its size: a worker's memory, not ours;
            # and a walk over a mid-sized one holds the gateway's interpreter for seconds: a worker's time
            answer = query.json_path_in_worker(path, json_path, budget, self.namespace)
        if (more := answer.pop(MORE, None)) is not None:
            answer["note"] = self._rest_of_matches(path, more["path"], answer["shown"], answer["total"], budget)
        return answer

    def _rest_of_matches(self, path: Path, where: str, shown: int, total: int, budget: int) -> str:
        """The note of a wildcard's answer cut to the budget: a next step that reaches the rest."""
        table = next((t for t in self._ready(path, "json")[0] if t.source == where), None)
        step = (
            f"response_query(path='{id_of(path)}', sql='SELECT * FROM {sql_name(table.name)} LIMIT 100 OFFSET {shown}')"
            if table is not None
            else f"response_compress(path='{id_of(path)}', mode='select_keys', json_path={where!r}, keys=[...])"
        )
        return f"{shown} of {total} matches shown (token budget {budget}); the rest: {step}"

    def search(self, args: Args, budget: int) -> dict[str, Any]:
        path = self._file(args)
        terms = _terms(args.str("query", required=True, max_len=500))
        limit = args.int("limit", 10, lo=1, hi=50)
        offset = args.int("offset", 0, lo=0)
        kind = self._kind(path)
        if kind == "binary":
            self._refuse_binary(path, "response_search")
        try:
            if kind != "json":
                raise BrokenJSON("text")
            hits, total = json_search.search(path, terms, limit, offset)
        except BrokenJSON:  # text, or JSON too broken to stream: search its lines
            hits, total = textfile.search(path, terms, limit, offset)
        out: dict[str, Any] = {"query": terms, "total": total, "matches": hits}
        if offset + len(hits) < total:
            out["next_offset"] = offset + len(hits)
        return fit(out, budget)[0]

    def compress(self, args: Args, budget: int) -> dict[str, Any]:
        path = self._file(args)
        mode = args.choice("mode", MODES)
        json_path = args.str("json_path")
        head = args.int("array_head", 3, lo=0, hi=1000)
        tail = args.int("array_tail", 1 if mode == "sample_array" else 0, lo=0, hi=1000)
        max_length = args.int("max_length", 80, lo=1, hi=100_000)
        keys = args.str_list("keys", required=mode == "select_keys")
        if self._kind(path) != "json":
            raise ToolInputError(
                "response_compress works on JSON results; for text use response_slice (line ranges) or response_search"
            )
        steps, _ = parse_path(json_path)
        if not steps and not is_small(path) and mode != "keys_only" and json_values.large_array(path, []) is None:
            info = json_outline.outline(path)
            biggest = max(info["itemCount"].items(), key=lambda kv: kv[1], default=(None, 0))[0]
            raise ToolInputError(
                f"response_compress: the file is {human_size(info['size'])}; give a json_path below the root"
                + (f", e.g. json_path='{biggest}'" if biggest and biggest != "$" else "")
            )
        count = json_values.large_array(path, steps) if mode != "keys_only" else None
        if count is not None:
            # a large array is compressed item by item: never loaded whole
            stream = json_compress.compress_stream(
                path, steps, count, mode, head=head, tail=tail, max_length=max_length, wanted=keys
            )
            kept, used = [], 2
            for item in stream:
                kept.append(item)
                used += cost(item) + 1
                if used > budget:
                    return self._compressed_file(mode, steps, itertools.chain(kept, stream))
            return self._compressed(mode, steps, kept)
        if not steps and mode == "keys_only" and not is_small(path):
            value: Any = json_outline.outline(path)["structure"]
        else:
            value, steps = json_values.resolve(path, json_path)
            value = json_compress.compress(value, mode, head=head, tail=tail, max_length=max_length, keys=keys)
        if cost(value) <= budget:
            return self._compressed(mode, steps, value)
        return self._compressed_file(mode, steps, iter([value]), whole=True)

    def query(self, args: Args, budget: int) -> dict[str, Any]:
        path = self._file(args)
        sql = args.str("sql", required=True, max_len=20_000)
        max_tokens = args.int("max_tokens", budget, lo=50, hi=1_000_000)
        kind = self._kind(path)
        if kind == "binary":
            self._refuse_binary(path, "response_query")
        try:
            with query.execute(path, kind, sql, self.namespace) as (columns, rows):
                room = max_tokens - cost(columns) - ROWS_FRAME
                first, rest = itertools.tee(rows)
                shown, read, unread = take_within(first, room)
                if unread or len(read) > len(shown):  # the note and the fileRef need room too
                    shown = shown[: longest_prefix(len(shown), lambda n: cost(shown[:n]), room - ROWS_NOTE)]
                    answer = self._rows_saved(columns, shown, rest, max_tokens)
                    if rows.capped:  # the answer is larger than a reply may read back
                        answer["row_count"] = f"more than {answer['fileRef']['rows']}"
                        answer["note"] = (
                            f"the answer is larger than {human_size(query.ANSWER_BYTES)}: its first "
                            f"{answer['fileRef']['rows']} rows are in the fileRef; narrow it (WHERE, aggregate, "
                            "LIMIT/OFFSET) to read the rest"
                        )
                    return answer
        except query.QueryError as exc:
            raise ToolInputError(f"response_query: {exc}. Tables: {', '.join(self.tables(path, kind))}") from None
        out: dict[str, Any] = {"columns": columns, "rows": shown, "row_count": len(shown)}
        if warnings := self._caveats(path, kind, sql):
            out["note"] = "; ".join(warnings)
        return out

    def _caveats(self, path: Path, kind: str, sql: str) -> list[str]:
        """What the query touches that the loader could not be sure of (a column left as text although
        it looks numeric): said with the answer, so no ORDER BY over text passes unremarked."""
        lowered = sql.lower()
        try:  # the notes come with the tables: the query never waits for their column profiles
            tables = query.loaded(path, kind, self.namespace)
        except Exception:  # the query ran: its tables exist (a failure here only loses the note)
            return []
        return [
            note
            for table in tables
            for note in table.notes
            if (named := _NOTED_COLUMN.match(note)) and named.group(1).replace('""', '"').lower() in lowered
        ]

    def _rows_saved(self, columns: list[str], shown: list[Any], every_row: Any, max_tokens: int) -> dict[str, Any]:
        """Rows beyond the budget: every row of the answer saved as a new result, as CSV (the column names
        once, a `row` number first), which response_query reads back as the typed table `items`. Counted
        while it is written, and cut at SAVED_BYTES."""
        names = _unique_names(["row", *columns])
        total, cut = 0, False

        def chunks() -> Any:
            nonlocal total, cut
            buffer = io.StringIO()
            writer = csv.writer(buffer, lineterminator="\n")
            writer.writerow(names)
            written = 0
            for row in every_row:
                if written + buffer.tell() >= SAVED_BYTES:
                    cut = True
                    break
                total += 1
                writer.writerow([total, *map(_cell, row)])
                if buffer.tell() >= 1 << 20:
                    written += buffer.tell()
                    yield buffer.getvalue()
                    buffer.seek(0)
                    buffer.truncate()
            yield buffer.getvalue()

        saved = self.store.save_chunks("response_query", chunks(), "text")
        out = {
            "columns": columns,
            "rows": shown,
            "row_count": f"more than {total}" if cut else total,
            "note": (
                f"{total - len(shown)} of {total} rows left out to fit {max_tokens} tokens: aggregate "
                "(count, GROUP BY), filter (WHERE) or add LIMIT; all rows are in the fileRef"
            ),
            "fileRef": {
                "id": saved.id,
                "path": str(saved.path),
                "sizeHint": human_size(saved.size),
                "rows": total,
                "next": f"response_query(path='{saved.id}', sql='SELECT * FROM items WHERE row > {len(shown)} LIMIT 50')",
            },
        }
        if cut:
            out["note"] = (
                f"the saved rows stop at {total}: a saved answer may take {human_size(SAVED_BYTES)}; narrow it "
                "(WHERE, aggregate, fewer columns) to save the rest"
            )
        return out

    def tables(self, path: Path, kind: str) -> list[str]:
        """The tables a query on this result can use, with their columns."""
        tables, trouble = self._catalog(path, kind)
        return trouble + [
            f"{t.name}({', '.join(c['name'] for c in t.columns[:12])}{', …' if len(t.columns) > 12 else ''})"
            for t in tables
        ]

    def _compressed(self, mode: str, steps: list[Any], value: Any) -> dict[str, Any]:
        return {
            "json_path": format_path(steps),
            "mode": mode,
            "value": value,
            "hint": "response_slice for one item in full; response_search to find records",
        }

    def _compressed_file(self, mode: str, steps: list[Any], items: Any, whole: bool = False) -> dict[str, Any]:
        """Still too large for the context: saved as a new file (written as it is produced)."""

        def chunks() -> Any:
            if whole:
                yield json.dumps(next(items), ensure_ascii=False)
                return
            yield "["
            for i, item in enumerate(items):
                yield ("," if i else "") + json.dumps(item, ensure_ascii=False)
            yield "]"

        saved = self.store.save_chunks(f"response_compress__{mode}", chunks(), "json")
        return {
            "json_path": format_path(steps),
            "mode": mode,
            "fileRef": {
                "id": saved.id,
                "path": str(saved.path),
                "size": saved.size,
                "sizeHint": human_size(saved.size),
            },
            "hint": "still too large for the context, so it was saved as a new file: narrow json_path "
            "(e.g. one array), lower array_head, or use select_keys; or outline the new file",
        }


def _cell(value: Any) -> Any:
    """A value as a CSV cell the table reads back: NULL empty, lists and records as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return value


def _unique_names(columns: list[str]) -> list[str]:
    """Column names as record keys: a repeated name (two `count(*)`) gets a number."""
    out: list[str] = []
    for name in columns:
        unique, n = name, 2
        while unique in out:
            unique, n = f"{name}_{n}", n + 1
        out.append(unique)
    return out


def _json_hints(rid: str, info: dict[str, Any]) -> list[str]:
    """Slices that work on this document: the first item of its largest array, or the first entry of
    its largest map (never a path that fails)."""
    hints = []
    structure = info["structure"]
    for part in info["itemCount"]:
        entry = structure.get(part, {})
        steps, _ = parse_path(None if part == "$" else part)
        if entry.get("type") == "array":
            hints.append(f"response_slice(path='{rid}', json_path={format_path([*steps, 0])!r})")
            break
        if entry.get("firstKeys"):
            hints.append(f"response_slice(path='{rid}', json_path={format_path([*steps, entry['firstKeys'][0]])!r})")
            break
    hints.append(f"response_search(path='{rid}', query='<words or ids>')")
    return hints


def _summary(table: Table) -> dict[str, Any]:
    out = table.summary()
    if len(table.columns) > MAX_COLUMNS:
        out["columns"] = table.columns[:MAX_COLUMNS]
        out["moreColumns"] = f"+{len(table.columns) - MAX_COLUMNS} (DESCRIBE {sql_name(table.name)} lists all)"
    return out


MAX_COLUMNS = 24


def _table_hints(rid: str, tables: list[Table]) -> list[str]:
    """Ready-to-send queries that fit the tables, so a small model sees the dialect once."""
    hints = []

    def q(sql: str) -> str:
        return f"response_query(path='{rid}', sql={sql!r})"

    for table in tables:
        name = sql_name(table.name)
        if table.name == "doc":
            if len(tables) == 1:
                hints.append(q("SELECT json_keys(json) FROM doc"))
            continue
        if table.name == "lines":
            if len(tables) == 1:
                hints.append(q("SELECT n, text FROM lines WHERE text LIKE '%word%' LIMIT 20"))
            continue
        hints.append(q(f"SELECT count(*) FROM {name}"))
        cols = table.columns
        group = next((c for c in cols if c["type"] == "VARCHAR" and 1 < c.get("distinct", 0) <= 50), None)
        if group:
            hints.append(q(f"SELECT {sql_name(group['name'])}, count(*) AS n FROM {name} GROUP BY 1 ORDER BY n DESC"))
        number = next((c for c in cols if c["type"] in ("BIGINT", "DOUBLE") and c["name"] != table.key_column), None)
        label = table.key_column or next((c["name"] for c in cols if c["type"] == "VARCHAR"), None)
        if number and label:
            n = sql_name(number["name"])
            hints.append(
                q(f"SELECT {sql_name(label)}, {n} FROM {name} WHERE {n} IS NOT NULL ORDER BY {n} DESC LIMIT 5")
            )
        nested = next((c for c in cols if c["type"].endswith("[]")), None)
        if nested:
            inner = sql_name(nested["name"])
            hints.append(q(f"SELECT unnest({inner}) AS v, count(*) FROM {name} GROUP BY 1 ORDER BY 2 DESC LIMIT 10"))
        if table.name == MAIN and len(hints) > 3:
            break
    return hints[:6]


def _text_hints(rid: str, info: dict[str, Any]) -> list[str]:
    hints = [f"response_slice(path='{rid}', start_line=1, end_line=50)"]
    level = next(iter(info.get("levels") or {}), None)
    if level:  # a log: its own levels, never a level it does not have
        hints.append(f"response_search(path='{rid}', query='{level}')")
        hints.append(f"response_query(path='{rid}', sql=\"SELECT count(*) FROM lines WHERE text LIKE '%{level}%'\")")
    else:
        hints.append(f"response_search(path='{rid}', query='<words>')")
        hints.append(f"response_query(path='{rid}', sql=\"SELECT n, text FROM lines WHERE text LIKE '%word%'\")")
    return hints
