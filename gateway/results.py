"""Building tool results: the one place that shapes errors and JSON answers."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types


def error_result(message: str) -> types.CallToolResult:
    """An `isError` result the model can read and act on."""
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def json_result(payload: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    """JSON text for any host, and the same object as `structuredContent`."""
    return types.CallToolResult(
        content=[types.TextContent(text=dumps(payload))], structured_content=payload, is_error=is_error
    )


def dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str)


def result_text(result: types.CallToolResult) -> str:
    """All text blocks of a result, joined (for tests, logs and token counts)."""
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def human_size(n: int) -> str:
    """1.3 MB, 256.0 KB, 725 B: sizes as people read them."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
