"""The exploring tools' handlers: outline, slice, search and compress an offloaded result, each answer cut
to the token budget."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import plugins.offload.json_compress as json_compress
import plugins.offload.json_outline as json_outline
import plugins.offload.json_search as json_search
import plugins.offload.json_values as json_values
import plugins.offload.query as query
import plugins.offload.textfile as textfile
from gateway.args import Args, ToolInputError
from gateway.services.responses import ResponseStore, id_of, open_command, saved_kind
from gateway.services.text import human_size
from gateway.services.tokens import estimate_tokens
from plugins.offload.fit import cost, fit
from plugins.offload.json_file import BrokenJSON, is_small
from plugins.offload.paths import format_path, parse_path

MODES = ("first_of_array", "sample_array", "truncate_strings", "keys_only", "select_keys")


def _terms(query: str) -> list[str]:
    terms = [t.lower() for t in query.split() if any(ch.isalnum() for ch in t)]
    if not terms:
        raise ToolInputError("response_search: `query` has no searchable words; give one or more words or ids")
    return list(dict.fromkeys(terms))[:12]


class Explorer:
    """The four handlers over one responses store; `budget` is the answer budget in tokens for the host
    connection that asked (its window decides it)."""

    def __init__(self, store: ResponseStore):
        self.store = store

    def _file(self, args: Args) -> Path:
        return self.store.resolve(args.str("path", required=True))

    def _kind(self, path: Path) -> str:
        return saved_kind(path)

    def _refuse_binary(self, path: Path, tool: str) -> None:
        raise ToolInputError(
            f"{tool}: {path.name} is a binary file ({human_size(path.stat().st_size)}); "
            f"open it with: {open_command(path)}"
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
                "openCmd": open_command(path),
            }
        if kind == "text":
            info = textfile.outline(path)
            info["compressionHints"] = [
                f"response_slice(path='{rid}', start_line=1, end_line=50)",
                f"response_search(path='{rid}', query='ERROR')",
                f"response_query(path='{rid}', sql=\"SELECT count(*) FROM lines WHERE text LIKE '%ERROR%'\")",
            ]
            info["tables"] = self.tables(path, kind)
            return self._fit(info, budget)
        info = json_outline.outline(path)
        info["compressionHints"] = _json_hints(rid, info)
        tables = query._json_tables(path)
        if tables:
            info["tables"] = {name: (".".join(keys) or "$") for name, keys in tables.items()}
            info["compressionHints"] += _query_hints(rid, info)
        return self._fit(info, budget)

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
            shown = []
            used = 0
            for line in lines:
                c = estimate_tokens(line) + 2
                if used + c > budget and shown:
                    break
                shown.append(line if c <= budget else line[: budget * 2] + "…(line cut)")
                used += c
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
        steps, remainder = parse_path(json_path)
        count = json_values.large_array(path, steps)
        stream = json_values.stream_matches(path, steps, remainder) if count is not None else None
        if stream is not None:  # a large array: take what fits, never load it whole
            return self._bounded_slice(json_path, steps, remainder, stream, count, budget)
        value, steps = json_values.resolve(path, json_path)
        nxt, prev = (None, None)
        if remainder is None:
            nxt, prev = json_values.neighbours(path, steps)
        shown, cut = fit(value, budget)
        return _slice_answer(json_path, steps, remainder, shown, cut, _deeper(steps, value), budget, nxt, prev)

    def _bounded_slice(
        self, json_path: str, steps: list[Any], remainder: str | None, stream: Any, count: int, budget: int
    ) -> dict[str, Any]:
        shown, used, more = [], 2, False
        for value in stream:
            c = cost(value) + 1
            if used + c > budget:
                more = True
                break
            shown.append(value)
            used += c
        if more and remainder is None:
            shown.append(f"…(+{count - len(shown)} more items)")
        elif more:
            shown.append("…(more matches not shown)")
        return _slice_answer(json_path, steps, remainder, shown, more, format_path([*steps, 0]), budget)

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
            columns, rows, total = query.run(path, kind, sql)
        except query.QueryError as exc:
            raise ToolInputError(f"response_query: {exc}. Tables: {', '.join(self.tables(path, kind))}") from None
        shown: list[Any] = []
        used = cost(columns) + 20
        for row in rows:
            c = cost(row) + 1
            if used + c > max_tokens:
                break
            shown.append(row)
            used += c
        out: dict[str, Any] = {"columns": columns, "rows": shown, "row_count": total}
        if len(shown) < total:
            out["note"] = (
                f"{total - len(shown)} of {total} rows left out to fit {max_tokens} tokens: aggregate "
                "(count, GROUP BY), filter (WHERE) or add LIMIT"
            )
            if len(rows) > len(shown):
                saved = self.store.save_chunks(
                    "response_query", iter([json.dumps({"columns": columns, "rows": rows}, ensure_ascii=False)]), "json"
                )
                out["fileRef"] = {"id": saved.id, "path": str(saved.path), "sizeHint": human_size(saved.size)}
                if len(rows) < total:
                    out["fileRef"]["note"] = f"the first {len(rows)} rows"
        return out

    def tables(self, path: Path, kind: str) -> list[str]:
        """The tables a query on this result can use."""
        if kind == "json":
            try:
                return list(query._json_tables(path)) or ["(no array of objects in this result)"]
            except BrokenJSON:
                pass
        if query._looks_like_ndjson(path):
            return ["items (one row per JSON line)", "lines(n, text)"]
        return ["items (CSV columns)", "lines(n, text)"] if query._looks_like_csv(path) else ["lines(n, text)"]

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


def _slice_answer(
    json_path: str,
    steps: list[Any],
    remainder: str | None,
    shown: Any,
    cut: bool,
    deeper: str,
    budget: int,
    next_path: str | None = None,
    prev_path: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"json_path": format_path(steps) if remainder is None else json_path, "value": shown}
    if cut:
        out["note"] = (
            f"value cut to the token budget ({budget} tokens); go deeper, e.g. json_path='{deeper}', "
            "or use response_compress"
        )
    out["next_path"], out["prev_path"] = next_path, prev_path
    return out


def _deeper(steps: list[Any], value: Any) -> str:
    if isinstance(value, list):
        return format_path([*steps, 0])
    if isinstance(value, dict) and value:
        return format_path([*steps, next(iter(value))])
    return format_path(steps)


def _json_hints(rid: str, info: dict[str, Any]) -> list[str]:
    hints = []
    arrays = sorted(((p, n) for p, n in info["itemCount"].items() if n), key=lambda kv: -kv[1])
    if arrays:
        path, _ = arrays[0]
        base = "" if path == "$" else path
        first = f"{base}.0" if base else "0"
        hints.append(f"response_slice(path='{rid}', json_path='{first}')")
        hints.append(f"response_compress(path='{rid}', mode='sample_array', json_path='{base or '$'}', array_head=3)")
        sample = (info.get("samples") or {}).get(path) or []
        if sample and isinstance(sample[0], dict):
            keys = list(sample[0])[:3]
            hints.append(f"response_compress(path='{rid}', mode='select_keys', json_path='{base or '$'}', keys={keys})")
    hints.append(f"response_search(path='{rid}', query='<words or ids>')")
    return hints


def _query_hints(rid: str, info: dict[str, Any]) -> list[str]:
    """Ready-to-send queries over `items`, so a small model sees the dialect once."""
    hints = [f"response_query(path='{rid}', sql='SELECT count(*) FROM items')"]
    arrays = sorted(((p, n) for p, n in info["itemCount"].items() if n), key=lambda kv: -kv[1])
    sample = (info.get("samples") or {}).get(arrays[0][0]) if arrays else None
    if sample and isinstance(sample[0], dict):
        text_keys = [k for k, v in sample[0].items() if isinstance(v, str) and len(v) < 40]
        if text_keys:
            k = text_keys[-1]
            hints.append(
                f"response_query(path='{rid}', sql='SELECT \"{k}\", count(*) AS n FROM items GROUP BY 1 ORDER BY n DESC')"
            )
    return hints
