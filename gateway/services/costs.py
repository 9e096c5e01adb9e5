"""What things cost in the model's context, counted one way for every part that reports it."""

from __future__ import annotations

from collections.abc import Sequence

import mcp_types as types
import pydantic_core

from gateway.services.text import utf8_size
from gateway.services.tokens import estimate_tokens


def definition_tokens(tools: Sequence[types.Tool]) -> int:
    """Tokens of tool definitions as they go over the wire (compact JSON): one figure for every report."""
    return sum(estimate_tokens(tool.model_dump_json(by_alias=True, exclude_none=True)) for tool in tools)


def result_cost(result: types.CallToolResult) -> tuple[int, int]:
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
