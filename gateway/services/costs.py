"""What things cost in the model's context, counted one way for every part that reports it.

A result costs what the host puts in front of the model. Hosts show the model either the text
blocks or the `structuredContent` (a client that reads one ignores the other), so when one is a
copy of the other it is counted once, the larger of the two, not the sum. Images and audio cost
what `media` says, never their base64 length.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

import mcp_types as types
import pydantic_core

from gateway.services import spill
from gateway.services.media import audio_tokens, image_tokens
from gateway.services.text import utf8_size
from gateway.services.tokens import ESTIMATOR, SAMPLE_ABOVE, estimate_tokens

DUPLICATE_CHECK_LIMIT = 64 * 1024 * 1024  # larger JSON texts are compared only when byte-identical
# bytes: a longer result is counted in a thread of its caller's share of counts (`shares.count_pool`), not
# on the event loop (an exact count takes ~0.13 ms per KB: 2 ms here, 40 ms for 300 KB)
COUNT_APART_ABOVE = 16 * 1024


# A text whose first (limit + CUT_SLACK) * PREFIX_CHARS characters already cost more than a token limit is
# over it, whatever follows (tokens only grow as text is added, but for the few a cut may split)
PREFIX_CHARS = 8  # characters looked at per token of the limit (real texts cost one per 2-5)
CUT_SLACK = 8  # tokens the cut at the prefix's end may add


def definition_tokens(tools: Sequence[types.Tool]) -> int:
    """Tokens of tool definitions as they go over the wire (compact JSON): one figure for every report."""
    return sum(estimate_tokens(tool.model_dump_json(by_alias=True, exclude_none=True)) for tool in tools)


@dataclass(frozen=True)
class Cost:
    size: int  # bytes
    tokens: int
    duplicate: int | None = None  # index of the text block that structuredContent repeats (counted once)


def looks_like_json(text: str) -> bool:
    head = text[:64].lstrip()
    tail = text[-64:].rstrip()
    return bool(head) and ((head[0] == "{" and tail.endswith("}")) or (head[0] == "[" and tail.endswith("]")))


def duplicated_text(structured: Any, texts: list[str], encoded: bytes | None = None) -> int | None:
    """The index of the text block that `structuredContent` repeats: the same JSON (any spacing), or an
    object one of whose string values is that text (`{"content": <the text>}`, as the filesystem server
    sends). None when it carries something of its own."""
    if not texts or structured is None:
        return None
    if isinstance(structured, dict):
        for value in structured.values():
            if isinstance(value, str):
                for i, text in enumerate(texts):
                    if len(value) == len(text) and value == text:
                        return i
    if encoded is None:
        encoded = pydantic_core.to_json(structured)
    for i, text in enumerate(texts):
        if len(encoded) == len(text) and encoded.decode() == text:
            return i
        if looks_like_json(text) and 0.8 * len(encoded) <= len(text) <= 1.6 * len(encoded) <= DUPLICATE_CHECK_LIMIT:
            try:
                if json.loads(text) == structured:
                    return i
            except ValueError:
                continue
    return None


def _text_cost(text: str) -> tuple[int, int]:
    if (part := spill.of(text)) is not None:  # still on disk: its figures were taken as it was written
        return part.size, part.tokens
    return utf8_size(text), estimate_tokens(text)


def tokens_over(result: types.CallToolResult, limit: int) -> bool:
    """Whether the result surely costs more than `limit` tokens, told from a prefix of its longest text
    block in memory: counting a 341 KB log whole took ~0.1 s with the real tokenizers, its first 40 KB
    tell the same. With the real tokenizers, the prefix's count (the cut may add a few tokens); with
    the built-in rates, the least they give any text that begins so (`TokenEstimator.at_least`: the
    prefix's own rate may be above the whole's, as a review showed). Not above `SAMPLE_ABOVE`, where
    the whole is estimated from slices. False when the prefix does not tell (a short text, one of long
    runs): the whole count decides then."""
    texts = [b.text for b in result.content if isinstance(b, types.TextContent) and spill.of(b.text) is None]
    if not texts:
        return False
    text = max(texts, key=len)
    cut = (limit + CUT_SLACK) * PREFIX_CHARS
    if not 2 * cut < len(text) <= SAMPLE_ABOVE:
        return False
    if ESTIMATOR.counting_exactly():
        return estimate_tokens(text[:cut]) > limit + CUT_SLACK
    return ESTIMATOR.at_least(text[:cut]) > limit


def _text_size(text: str) -> int:
    return part.size if (part := spill.of(text)) is not None else utf8_size(text)


def _block_cost(block: Any) -> tuple[int, int]:
    if isinstance(block, types.TextContent):
        return _text_cost(block.text)
    if isinstance(block, types.ImageContent):
        return len(block.data), image_tokens(block.data)
    if isinstance(block, types.AudioContent):
        return len(block.data), audio_tokens(block.data)
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return _text_cost(res.text)
        mime = res.mime_type or ""
        if mime.startswith("image/"):
            return len(res.blob), image_tokens(res.blob)
        if mime.startswith("audio/"):
            return len(res.blob), audio_tokens(res.blob)
        return len(res.blob), estimate_tokens(res.blob)  # shown as base64 text, if at all
    wire = block.model_dump_json(by_alias=True, exclude_none=True)  # resource links: small pointers
    return len(wire), estimate_tokens(wire)


def meta_size(meta: Any) -> int:
    """Bytes of a result's `_meta`: hosts do not show it to the model, but it travels to the host and
    is held there, so its bytes count toward the size limit (not toward tokens)."""
    if not meta:
        return 0
    return len(pydantic_core.to_json(meta)) + _on_disk(meta)[0]


def result_cost(result: types.CallToolResult, copy: int | EllipsisType | None = ...) -> Cost:
    """Bytes and tokens of what the model receives from this result (see the module docstring); a large
    `_meta` adds its bytes. `copy`: `duplicate_block(result)` when it is known (not looked for again)."""
    costs = [_block_cost(block) for block in result.content]
    size, tokens = sum(c[0] for c in costs) + meta_size(result.meta), sum(c[1] for c in costs)
    duplicate = None
    if result.structured_content is not None:
        text_blocks = [(i, b.text) for i, b in enumerate(result.content) if isinstance(b, types.TextContent)]
        known = copy if copy is ... or copy is None else [i for i, _ in text_blocks].index(copy)
        s_size, s_tokens, found = _structured_cost(result.structured_content, [t for _, t in text_blocks], known)
        if found is None:
            size, tokens = size + s_size, tokens + s_tokens
        else:
            duplicate = text_blocks[found][0]
            t_size, t_tokens = costs[duplicate]
            size += max(0, s_size - t_size)
            tokens += max(0, s_tokens - t_tokens)
    return Cost(size, tokens, duplicate)


def size_at_least(result: types.CallToolResult) -> int:
    """A lower bound of `result_cost(result).size` without counting a token or writing any JSON: the bytes
    of its content blocks' texts and media. A result above a size limit by this much is over it whatever
    its tokens (`result_cost` counts those, tens of milliseconds for a few MB)."""
    size = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            size += _text_size(block.text)
        elif isinstance(block, (types.ImageContent, types.AudioContent)):
            size += len(block.data)
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            size += _text_size(res.text) if isinstance(res, types.TextResourceContents) else len(res.blob)
    return size


def duplicate_block(result: types.CallToolResult) -> int | None:
    """`result_cost(result).duplicate` without counting tokens: the index of the text block its
    `structuredContent` repeats, if any."""
    if result.structured_content is None:
        return None
    text_blocks = [(i, b.text) for i, b in enumerate(result.content) if isinstance(b, types.TextContent)]
    texts = [t for _, t in text_blocks]
    structured = result.structured_content
    raw = spill.of_value(structured)
    found = _spilled_copy_of(raw, texts) if raw is not None else duplicated_text(structured, texts)
    return None if found is None else text_blocks[found][0]


def _structured_cost(
    structured: Any, texts: list[str], found: int | EllipsisType | None = ...
) -> tuple[int, int, int | None]:
    """Size and tokens of a structuredContent, and the text (of `texts`) it repeats, if any (`found`, when
    known already). Parts of it still on disk count at their own size (a spilled copy of a text has the
    text's own marker)."""
    if (raw := spill.of_value(structured)) is not None:
        return raw.size, raw.tokens, _spilled_copy_of(raw, texts) if found is ... else found
    data = pydantic_core.to_json(structured)
    extra_size, extra_tokens = _on_disk(structured)
    size = len(data) + extra_size
    if found is ...:
        found = duplicated_text(structured, texts, data)
    if found is not None and not extra_size and size <= utf8_size(texts[found]):
        # the text block says the same in as many bytes or more (a server's indented copy of its compact
        # structuredContent): it adds nothing, and its count is not needed (a small call's cost, saved)
        return size, 0, found
    return size, estimate_tokens(data.decode()) + extra_tokens, found


def _spilled_copy_of(raw: spill.Spilled, texts: list[str]) -> int | None:
    """The text block a structuredContent still on disk repeats, compared on disk."""
    for i, text in enumerate(texts):
        part = spill.of(text)
        if part is not None and 0.8 * raw.size <= part.size <= 1.6 * raw.size and spill.same_json(part, raw):
            return i
    return None


def _on_disk(value: Any) -> tuple[int, int]:
    """What the long strings the reader left on disk add to a value's figures: each marker's place
    holds the whole text (its bytes less the marker's, and its tokens)."""
    size = tokens = 0
    for key in set(spill.keys_in(value)):
        if (part := spill.of(spill.MARK + key)) is not None:
            size, tokens = size + part.size - len(spill.MARK + key), tokens + part.tokens
    return size, tokens
