"""Replacing an oversized result: its blocks saved as files, one small fileRef reply in its place."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import ijson
import mcp_types as types
import pydantic_core

import plugins.offload.query as query
import plugins.offload.table_csv as table_csv
import plugins.offload.textfile as textfile
from gateway.plugin import ToolCall
from gateway.services import spill
from gateway.services.costs import duplicate_block, looks_like_json, meta_size
from gateway.services.responses import ResponseStore, Saved, response_uri
from gateway.services.text import human_size
from plugins.offload.json_file import BrokenJSON, is_small
from plugins.offload.json_outline import outline, warm_outline
from plugins.offload.tables import BRIEF_COLUMNS, brief

INLINE_KEYS = 10
META_INLINE = 64 * 1024  # a `_meta` larger than this is not passed on whole...
META_KEY_INLINE = 4 * 1024  # ...its keys larger than this go to a file, named under META_NOTE
META_NOTE = "mcp-context-gateway/offloadedMeta"
INLINE_COLUMNS = 60
TABLES_WAIT = 2.0  # seconds the fileRef waits at most for the tables of a result...
TABLES_WAIT_BYTES = (
    16 * 1024 * 1024
)  # ...up to this size (converted in well under a second); a larger one answers at once
HEAD_BYTES = 256 * 1024
MAX_LISTED_FILES = 6


def offload(
    store: ResponseStore,
    call: ToolCall,
    result: types.CallToolResult,
    max_size: int,
    max_tokens: int,
    written: list[Path] | None = None,
    always: bool = False,
) -> types.CallToolResult | None:
    """The result saved to files and replaced by one fileRef reply; None when nothing in it can be saved.
    The reply states the result's cost (a structuredContent copy of the text counted once) as its size;
    its tokens are counted here (`call.cost_of`), once the conversion of the saved file has started, so
    the count and the conversion overlap and the event loop never waits for either.
    A write that fails (disk full, a file size limit) removes what this offload already wrote and raises.
    `written` receives the path of every file saved, so a caller whose call was cancelled can remove them.
    `always`: the tool's results are saved whatever their size (its reply says so when this one fits)."""
    parts: list[tuple[str, Saved]] = []
    try:
        return _replace(store, call, result, (max_size, max_tokens, always), parts)
    except BaseException:
        for _, saved in parts:
            saved.path.unlink(missing_ok=True)
        raise
    finally:
        if written is not None:
            written.extend(saved.path for _, saved in parts)


def _replace(
    store: ResponseStore,
    call: ToolCall,
    result: types.CallToolResult,
    limits: tuple[int, int, bool],
    parts: list[tuple[str, Saved]],
) -> types.CallToolResult | None:
    """The work of `offload`: every file it saves goes into `parts` at once, so a failure can remove it."""
    max_size, max_tokens, always = limits
    stem = f"{call.server}__{call.tool}"
    meta = result.meta
    copy = duplicate_block(result)  # looked for once: the count is told
    if (big := meta_size(meta)) > META_INLINE:  # a huge `_meta` (a trace, a debug dump): large keys to a file
        kept = {k: v for k, v in meta.items() if meta_size({k: v}) <= META_KEY_INLINE}
        moved = {k: spill.restored(v) for k, v in meta.items() if k not in kept}
        saved = store.save_text(f"{stem}__meta", pydantic_core.to_json(moved).decode(), "json")
        parts.append(("_meta", saved))
        meta = {**kept, META_NOTE: {"keys": sorted(moved), "id": saved.id, "sizeHint": human_size(saved.size)}}
        cost = call.cost_of(result, copy)
        if cost.size - big <= max_size and cost.tokens <= max_tokens:  # the rest may pass as it is
            return result.model_copy(update={"meta": meta})
    inline: list[Any] = []
    structured = result.structured_content
    if structured is not None and copy is None:
        if (raw := spill.of_value(structured)) is not None:
            parts.append(("structuredContent", store.adopt(stem, raw, "json")))
        else:
            data = pydantic_core.to_json(spill.restored(structured)).decode()
            parts.append(("structuredContent", store.save_text(stem, data, "json")))
    for i, block in enumerate(result.content):
        label = f"content[{i}]"
        if isinstance(block, types.TextContent):
            parts.append((label, _save_text(store, stem, block.text)))
        elif isinstance(block, (types.ImageContent, types.AudioContent)):
            parts.append((f"{label} {block.mime_type}", store.save_base64(stem, block.data, block.mime_type)))
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append((f"{label} {res.uri}", _save_text(store, stem, res.text)))
            else:
                mime = res.mime_type or "application/octet-stream"
                parts.append((f"{label} {res.uri}", store.save_base64(stem, res.blob, mime)))
        else:
            inline.append(block)  # resource links are small pointers: kept as they are
    if not parts:
        return None
    _, primary = max(parts, key=lambda p: p[1].size)
    if primary.kind != "binary":
        query.tables_now(primary.path, primary.kind, call.namespace)  # the conversion starts: the count overlaps it
    cost = call.cost_of(result, copy)
    ref: dict[str, Any] = {
        "id": primary.id,
        "path": str(primary.path),
        "size": cost.size,
        "sizeHint": human_size(cost.size),
        "tokens": cost.tokens,
        "maxSizeHint": f"{human_size(max_size)} / {max_tokens} tokens",
        "kind": primary.kind,
    }
    if primary.size != cost.size:
        ref["fileSize"] = primary.size  # the saved file (JSON escapes and other blocks make the result larger)
    if primary.kind == "binary":
        ref["mime"] = primary.mime
    ref["openCmd"] = store.open_command(primary.path)
    what = "error output" if result.is_error else "result"
    if not always or cost.size > max_size or cost.tokens > max_tokens:  # over a limit, told by a prefix maybe
        # size and tokens stand above: the message says only what to do
        ref["message"] = (
            f"The tool's {what} is too large for the context; saved to a file. Query or explore it in pieces; do not read it whole."
        )
    else:  # the server's config saves every result of this tool (offload = "always")
        ref["message"] = (
            f"The tool's {what} ({human_size(cost.size)}, ~{cost.tokens} tokens) was saved to a file, as every "
            "result of this tool is. Explore it with the response_* tools or open the file."
        )
    reply: dict[str, Any] = {"fileRef": ref}
    if len(parts) > 1:
        listed = parts[:MAX_LISTED_FILES]  # the reply stays small however many blocks there are
        reply["files"] = [
            {"id": s.id, "part": label, "kind": s.kind, "sizeHint": human_size(s.size)} for label, s in listed
        ]
        if len(parts) > len(listed):
            reply["moreFiles"] = f"{len(parts) - len(listed)} more blocks saved beside these"
    reply["outline"] = inline_outline(primary, call.namespace)
    reply["next"] = (
        f"response_outline(path='{primary.id}')" if primary.kind != "binary" else f"open it with: {ref['openCmd']}"
    )
    text = json.dumps(reply, ensure_ascii=False)
    # the same file as a resource link: hosts that show links can open it; resources/read serves it in pieces
    link = types.ResourceLink(
        uri=response_uri(primary.id),
        name=primary.id,
        title=f"{call.name} result ({human_size(primary.size)})",
        mime_type=primary.mime or None,
        size=primary.size,
    )
    return types.CallToolResult(
        content=[types.TextContent(text=text), link, *inline], is_error=result.is_error, _meta=meta
    )


def _save_text(store: ResponseStore, stem: str, text: str) -> Saved:
    """A text block as a file: moved into place when the upstream reader left it on disk."""
    if (part := spill.of(text)) is not None:
        return store.adopt(stem, part, "json" if part.looks_like_json() else "text")
    return store.save_text(stem, text, "json" if looks_like_json(text) else "text")


def inline_outline(saved: Saved, namespace: str) -> dict[str, Any]:
    """A few lines of outline for the fileRef reply, and the tables a query can use (their columns named,
    so a first query needs no look): cheap even for a huge file. The conversion starts here in the
    background; a small result's fileRef waits briefly for its tables, a large
    one's never does."""
    if saved.kind == "binary":
        return {"type": "binary", "mime": saved.mime}
    query.tables_now(saved.path, saved.kind, namespace)  # starts the conversion
    out = _text_outline(saved) if saved.kind == "text" else _json_outline(saved)
    tables = query.tables_now(saved.path, saved.kind, namespace)
    if isinstance(tables, str) and saved.size <= TABLES_WAIT_BYTES:
        tables = query.tables_within(saved.path, TABLES_WAIT) or query.tables_now(saved.path, saved.kind, namespace)
    if isinstance(tables, str):
        out["tables"] = tables
        return out
    if out["type"] == "csv":  # the main table's line names every column: the header is not repeated
        out.pop("columns", None)
        out.pop("moreColumns", None)
    out["tables"] = {t.name: brief(t, INLINE_COLUMNS if out["type"] == "csv" else BRIEF_COLUMNS) for t in tables}
    if notes := [n for t in tables for n in t.notes if n.startswith("column ")]:
        out["notes"] = notes[:4]
    return out


def _text_outline(saved: Saved) -> dict[str, Any]:
    if (sep := table_csv.dialect(saved.path)) is not None:  # the header whole: it names the columns
        columns = table_csv.header(saved.path, sep)
        out: dict[str, Any] = {"type": "csv", "columns": columns[:INLINE_COLUMNS]}
        if len(columns) > INLINE_COLUMNS:
            out["moreColumns"] = len(columns) - INLINE_COLUMNS
        return out
    with open(saved.path, encoding="utf-8", errors="replace") as fh:
        head = [line for _, line in zip(range(3), fh, strict=False)]
    return {"type": "text", "firstLines": textfile.head_preview("".join(head))}


def _json_outline(saved: Saved) -> dict[str, Any]:
    if not is_small(saved.path):
        warm_outline(saved.path)  # counts and samples are ready by the model's next call
        return _head_outline(saved.path)
    try:
        full = outline(saved.path)
    except BrokenJSON as exc:
        return {"type": "text", "note": f"looks like JSON but {exc}"}
    out: dict[str, Any] = {"type": full["type"]}
    if "keys" in full:
        out["keys"] = full["keys"][:INLINE_KEYS]
        if len(full["keys"]) > INLINE_KEYS or "keyCount" in full:
            out["keyCount"] = full.get("keyCount", len(full["keys"]))
    out["itemCount"] = dict(itertools.islice(full["itemCount"].items(), 5))
    return out


# -- the exploration tools -----------------------------------------------------------------------


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
