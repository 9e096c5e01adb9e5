"""Offload: no upstream result larger than its limit reaches the model.

A result over `max_response_size` bytes or `max_response_tokens` tokens is written to
`{workspace}/responses/` and replaced by a small fileRef; the model explores the file with
response_outline / response_compress / response_slice / response_search.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import ijson
import mcp_types as types
import pydantic_core

from gateway.args import Args, ToolInputError
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall, guarded, tool
from gateway.results import human_size
from gateway.tokens import estimate_tokens
from plugins.offload import jsonfile, textfile
from plugins.offload.fit import cost, fit
from plugins.offload.paths import PathError, format_path, parse_path
from plugins.offload.store import ResponseStore, Saved, StoreError, open_command, utf8_size

log = logging.getLogger("plugins.offload")

MODES = ("first_of_array", "sample_array", "truncate_strings", "keys_only", "select_keys")
INLINE_KEYS = 10
HEAD_BYTES = 256 * 1024
DUPLICATE_CHECK_LIMIT = 64 * 1024 * 1024
MAX_LISTED_FILES = 6


PATH = {"type": "string", "description": "fileRef id (resp_...) or file path"}
JSON_PATH = {"type": "string", "description": "e.g. data.0.name or $.data[0].name; -1 = last"}


def looks_like_json(text: str) -> bool:
    head = text[:64].lstrip()
    tail = text[-64:].rstrip()
    return bool(head) and ((head[0] == "{" and tail.endswith("}")) or (head[0] == "[" and tail.endswith("]")))


def _terms(query: str) -> list[str]:
    terms = [t.lower() for t in query.split() if any(ch.isalnum() for ch in t)]
    if not terms:
        raise ToolInputError("response_search: `query` has no searchable words; give one or more words or ids")
    return list(dict.fromkeys(terms))[:12]


class OffloadPlugin(Plugin):
    name = "offload"

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.store: ResponseStore | None = None
        self.offloaded = 0
        self._tg: anyio.abc.TaskGroup | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self.store = ResponseStore(ctx.settings.gateway.responses_dir)
        removed = self.store.remove_older_than(ctx.settings.gateway.response_ttl_hours)
        if removed:
            log.info("removed %d offloaded responses older than %s h", removed, ctx.settings.gateway.response_ttl_hours)
        if not ijson.backend.startswith("yajl2_c"):
            log.warning("ijson runs on its %s backend, not the C one: large JSON files will be slow", ijson.backend)

    def _ctx(self) -> GatewayContext:
        assert self.ctx is not None and self.store is not None, "offload plugin not started"
        return self.ctx

    def status(self, session_id: str) -> dict[str, Any]:
        return {"offloaded": self.offloaded, "ijson": ijson.backend}

    # -- hooks ----------------------------------------------------------------------------------

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        # Hosts validate structuredContent against outputSchema and would reject a fileRef.
        upstream = self._ctx().catalog.tool_routes
        return [
            t.model_copy(update={"output_schema": None}) if t.name in upstream and t.output_schema else t for t in tools
        ]

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        if call.server is None:
            return result
        ctx = self._ctx()
        max_size, max_tokens = ctx.max_response_size(call.server), ctx.max_response_tokens(call.server)
        size, tokens = measure(result)
        if size <= max_size and tokens <= max_tokens:
            return result
        return await anyio.to_thread.run_sync(self._offload, call, result, size, tokens, max_size, max_tokens)

    # -- offloading ---------------------------------------------------------------------------------

    def _offload(
        self, call: ToolCall, result: types.CallToolResult, size: int, tokens: int, max_size: int, max_tokens: int
    ) -> types.CallToolResult:
        assert self.store is not None
        stem = f"{call.server}__{call.tool}"
        parts: list[tuple[str, Saved]] = []
        inline: list[Any] = []
        texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
        structured = result.structured_content
        if structured is not None and not _duplicates_text(structured, texts):
            data = pydantic_core.to_json(structured).decode()
            parts.append(("structuredContent", self.store.save_text(stem, data, "json")))
        for i, block in enumerate(result.content):
            label = f"content[{i}]"
            if isinstance(block, types.TextContent):
                parts.append(
                    (label, self.store.save_text(stem, block.text, "json" if looks_like_json(block.text) else "text"))
                )
            elif isinstance(block, (types.ImageContent, types.AudioContent)):
                parts.append((f"{label} {block.mime_type}", self.store.save_bytes(stem, block.data, block.mime_type)))
            elif isinstance(block, types.EmbeddedResource):
                res = block.resource
                if isinstance(res, types.TextResourceContents):
                    kind = "json" if looks_like_json(res.text) else "text"
                    parts.append((f"{label} {res.uri}", self.store.save_text(stem, res.text, kind)))
                else:
                    mime = res.mime_type or "application/octet-stream"
                    parts.append((f"{label} {res.uri}", self.store.save_bytes(stem, res.blob, mime)))
            else:
                inline.append(block)  # resource links are small pointers: kept as they are
        if not parts:
            return result
        self.offloaded += 1
        _, primary = max(parts, key=lambda p: p[1].size)
        ref: dict[str, Any] = {
            "id": primary.id,
            "path": str(primary.path),
            "size": primary.size,
            "sizeHint": human_size(primary.size),
            "tokens": tokens,
            "maxSizeHint": f"{human_size(max_size)} / {max_tokens} tokens",
            "kind": primary.kind,
        }
        if primary.kind == "binary":
            ref["mime"] = primary.mime
        ref["openCmd"] = open_command(primary.path)
        what = "error output" if result.is_error else "result"
        ref["message"] = (
            f"The tool's {what} ({human_size(size)}, ~{tokens} tokens) is too large for the context; "
            "saved to a file. Explore it in small pieces; do not read the whole file."
        )
        reply: dict[str, Any] = {"fileRef": ref}
        if len(parts) > 1:
            listed = parts[:MAX_LISTED_FILES]  # the reply stays small however many blocks there are
            reply["files"] = [
                {"id": s.id, "part": label, "kind": s.kind, "sizeHint": human_size(s.size)} for label, s in listed
            ]
            if len(parts) > len(listed):
                reply["moreFiles"] = f"{len(parts) - len(listed)} more blocks saved beside these"
        reply["outline"] = self._inline_outline(primary)
        reply["next"] = (
            f"response_outline(path='{primary.id}')" if primary.kind != "binary" else f"open it with: {ref['openCmd']}"
        )
        text = json.dumps(reply, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(text=text), *inline], is_error=result.is_error, _meta=result.meta
        )

    def _inline_outline(self, saved: Saved) -> dict[str, Any]:
        if saved.kind == "binary":
            return {"type": "binary", "mime": saved.mime}
        if saved.kind == "text":
            with open(saved.path, encoding="utf-8", errors="replace") as fh:
                head = [line for _, line in zip(range(3), fh, strict=False)]
            return {"type": "text", "firstLines": textfile.head_preview("".join(head))}
        if jsonfile.is_small(saved.path):
            try:
                full = jsonfile.outline(saved.path)
            except jsonfile.BrokenJSON as exc:
                return {"type": "text", "note": f"looks like JSON but {exc}"}
            out = {"type": full["type"]}
            if "keys" in full:
                out["keys"] = full["keys"][:INLINE_KEYS]
            counts = {k: v for k, v in full["itemCount"].items() if k.count(".") <= 1}
            out["itemCount"] = dict(itertools.islice(counts.items(), 5))
            return out
        jsonfile.warm_outline(saved.path)  # counts and samples are ready by the model's next call
        return _head_outline(saved.path)

    # -- the exploration tools -----------------------------------------------------------------------

    def tools(self) -> list[PluginTool]:
        path = {"path": PATH}
        handle = self._tool
        return [
            tool(
                "response_outline",
                "Outline an offloaded result (fileRef id): type, keys, item counts, samples "
                "and ready-to-use hints. Call this first; never read the whole file.",
                handle(self.outline),
                path,
                ["path"],
            ),
            tool(
                "response_compress",
                "A smaller view of an offloaded JSON result: first_of_array, sample_array, "
                "truncate_strings, keys_only or select_keys, optionally below json_path.",
                handle(self.compress),
                path
                | {
                    "mode": {"type": "string", "enum": list(MODES)},
                    "json_path": JSON_PATH,
                    "array_head": {"type": "integer"},
                    "array_tail": {"type": "integer"},
                    "max_length": {"type": "integer"},
                    "keys": {"type": "array", "items": {"type": "string"}},
                },
                ["path", "mode"],
            ),
            tool(
                "response_slice",
                "One value of an offloaded JSON result by json_path, or a line range "
                "(start_line, end_line) of any text result.",
                handle(self.slice),
                path | {"json_path": JSON_PATH, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
                ["path"],
            ),
            tool(
                "response_search",
                "Find lines (text) or records (JSON) of an offloaded result containing the "
                "query words; ranked, with paths or line numbers.",
                handle(self.search),
                path | {"query": {"type": "string"}, "limit": {"type": "integer"}, "offset": {"type": "integer"}},
                ["path", "query"],
            ),
        ]

    def _tool(self, fn: Any) -> Any:
        async def threaded(args: Args, call: ToolCall) -> dict[str, Any]:
            try:
                return await anyio.to_thread.run_sync(fn, args)  # file work stays off the event loop
            except UnicodeDecodeError:
                raise ToolInputError("the file is not UTF-8 text; open it with its openCmd instead") from None
            except jsonfile.BrokenJSON as exc:
                raise ToolInputError(str(exc)) from None

        return guarded(threaded, (StoreError, PathError))

    def _answer_budget(self) -> int:
        return self._ctx().max_response_tokens(None)

    def _file(self, args: Args) -> Path:
        assert self.store is not None
        return self.store.resolve(args.str("path", required=True))

    def _kind(self, path: Path) -> str:
        if path.suffix == ".json":
            return "json"
        if path.suffix in (".txt", ".md", ".csv", ".log"):
            return "text"
        return "binary"

    def _refuse_binary(self, path: Path, tool: str) -> None:
        raise ToolInputError(
            f"{tool}: {path.name} is a binary file ({human_size(path.stat().st_size)}); "
            f"open it with: {open_command(path)}"
        )

    def outline(self, args: Args) -> dict[str, Any]:
        path = self._file(args)
        rid = _id_of(path)
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
            ]
            return self._fit(info)
        info = jsonfile.outline(path)
        info["compressionHints"] = _json_hints(rid, info)
        return self._fit(info)

    def _fit(self, payload: dict[str, Any]) -> dict[str, Any]:
        value, cut = fit(payload, self._answer_budget())
        if cut:
            value["note"] = "cut to fit the token budget; use response_slice on a part"
        return value

    def slice(self, args: Args) -> dict[str, Any]:
        path = self._file(args)
        json_path = args.str("json_path")
        start = args.int("start_line", lo=1)
        end = args.int("end_line", lo=1)
        if json_path is not None and (start or end):
            raise ToolInputError("response_slice: give json_path or start_line/end_line, not both")
        if self._kind(path) == "binary":
            self._refuse_binary(path, "response_slice")
        budget = self._answer_budget()
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
        count = jsonfile.large_array(path, steps)
        stream = jsonfile.stream_matches(path, steps, remainder) if count is not None else None
        if stream is not None:  # a large array: take what fits, never load it whole
            return self._bounded_slice(json_path, steps, remainder, stream, count, budget)
        value, steps = jsonfile.resolve(path, json_path)
        nxt, prev = (None, None)
        if remainder is None:
            nxt, prev = jsonfile.neighbours(path, steps)
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

    def search(self, args: Args) -> dict[str, Any]:
        path = self._file(args)
        terms = _terms(args.str("query", required=True, max_len=500))
        limit = args.int("limit", 10, lo=1, hi=50)
        offset = args.int("offset", 0, lo=0)
        kind = self._kind(path)
        if kind == "binary":
            self._refuse_binary(path, "response_search")
        try:
            if kind != "json":
                raise jsonfile.BrokenJSON("text")
            hits, total = jsonfile.search(path, terms, limit, offset)
        except jsonfile.BrokenJSON:  # text, or JSON too broken to stream: search its lines
            hits, total = textfile.search(path, terms, limit, offset)
        out: dict[str, Any] = {"query": terms, "total": total, "matches": hits}
        if offset + len(hits) < total:
            out["next_offset"] = offset + len(hits)
        return fit(out, self._answer_budget())[0]

    def compress(self, args: Args) -> dict[str, Any]:
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
        if not steps and not jsonfile.is_small(path) and mode != "keys_only" and jsonfile.large_array(path, []) is None:
            info = jsonfile.outline(path)
            biggest = max(info["itemCount"].items(), key=lambda kv: kv[1], default=(None, 0))[0]
            raise ToolInputError(
                f"response_compress: the file is {human_size(info['size'])}; give a json_path below the root"
                + (f", e.g. json_path='{biggest}'" if biggest and biggest != "$" else "")
            )
        budget = self._answer_budget()
        count = jsonfile.large_array(path, steps) if mode != "keys_only" else None
        if count is not None:
            # a large array is compressed item by item: never loaded whole
            stream = jsonfile.compress_stream(
                path, steps, count, mode, head=head, tail=tail, max_length=max_length, wanted=keys
            )
            kept, used = [], 2
            for item in stream:
                kept.append(item)
                used += cost(item) + 1
                if used > budget:
                    return self._compressed_file(mode, steps, itertools.chain(kept, stream))
            return self._compressed(mode, steps, kept)
        if not steps and mode == "keys_only" and not jsonfile.is_small(path):
            value: Any = jsonfile.outline(path)["structure"]
        else:
            value, steps = jsonfile.resolve(path, json_path)
            value = jsonfile.compress(value, mode, head=head, tail=tail, max_length=max_length, keys=keys)
        if cost(value) <= budget:
            return self._compressed(mode, steps, value)
        return self._compressed_file(mode, steps, iter([value]), whole=True)

    def _compressed(self, mode: str, steps: list[Any], value: Any) -> dict[str, Any]:
        return {
            "json_path": format_path(steps),
            "mode": mode,
            "value": value,
            "hint": "response_slice for one item in full; response_search to find records",
        }

    def _compressed_file(self, mode: str, steps: list[Any], items: Any, whole: bool = False) -> dict[str, Any]:
        """Still too large for the context: saved as a new file (written as it is produced)."""
        assert self.store is not None

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


def _id_of(path: Path) -> str:
    return f"resp_{path.stem.rsplit('-', 1)[-1]}"


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


def _duplicates_text(structured: Any, texts: list[str]) -> bool:
    """True when structuredContent repeats a text block (e.g. {"content": <the text>})."""
    if not texts:
        return False
    if isinstance(structured, dict) and any(isinstance(v, str) and v in texts for v in structured.values()):
        return True
    encoded = pydantic_core.to_json(structured)
    for text in texts:
        if len(encoded) == len(text) and encoded.decode() == text:
            return True
        # the same JSON with other spacing (json.dumps defaults): compare parsed values
        if looks_like_json(text) and 0.8 * len(encoded) <= len(text) <= 1.6 * len(encoded) <= DUPLICATE_CHECK_LIMIT:
            try:
                if json.loads(text) == structured:
                    return True
            except ValueError:
                continue
    return False


def _head_outline(path: Path) -> dict[str, Any]:
    """Root type and the keys seen in the first 256 KB: cheap, for the fileRef of a huge JSON."""
    with open(path, "rb") as fh:
        head = fh.read(HEAD_BYTES)
    root, keys = "unknown", []
    try:
        for prefix, event, value in ijson.parse(head):
            if prefix == "" and event in ("start_map", "start_array"):
                root = "object" if event == "start_map" else "array"
            elif prefix == "" and event == "map_key":
                keys.append(value)
                if len(keys) >= INLINE_KEYS:
                    break
    except ijson.JSONError:
        pass
    out: dict[str, Any] = {"type": root}
    if keys:
        out["keys"] = keys
    out["note"] = "partial (large file): response_outline gives item counts and samples"
    return out


def measure(result: types.CallToolResult) -> tuple[int, int]:
    """Bytes and tokens of everything the model would receive: all blocks and structuredContent."""
    size = tokens = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            size += utf8_size(block.text)
            tokens += estimate_tokens(block.text)
        elif isinstance(block, (types.ImageContent, types.AudioContent)):
            size += len(block.data)
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                size += utf8_size(res.text)
                tokens += estimate_tokens(res.text)
            else:
                size += len(res.blob)
        else:
            size += len(block.model_dump_json())
    if result.structured_content is not None:
        data = pydantic_core.to_json(result.structured_content)
        size += len(data)
        tokens += estimate_tokens(data.decode())
    return size, tokens
