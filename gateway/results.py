"""Building tool results: the one place that shapes errors and JSON answers."""

from __future__ import annotations

from typing import Any

import mcp_types as types

from gateway.services.text import dumps


def error_result(message: str) -> types.CallToolResult:
    """An `isError` result the model can read and act on."""
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def json_result(payload: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    """JSON text for any host, and the same object as `structuredContent`."""
    return types.CallToolResult(
        content=[types.TextContent(text=dumps(payload))], structured_content=payload, is_error=is_error
    )


def result_text(result: types.CallToolResult) -> str:
    """All text blocks of a result, joined (for tests, logs and token counts)."""
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
