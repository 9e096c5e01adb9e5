"""mcp-context-gateway: one MCP entry that fronts many MCP servers and protects a small context window.

This package's top level is the public surface for plugins: the hook spec, the tool-building
helpers and the services. Names load on first use, so `import gateway` (which every command does)
costs nothing at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # the hook spec
    "Plugin": "gateway.plugin",
    "PluginTool": "gateway.plugin",
    "ToolCall": "gateway.plugin",
    "GatewayContext": "gateway.plugin",
    # building tools
    "tool": "gateway.handlers",
    "guarded": "gateway.handlers",
    "Args": "gateway.args",
    "ToolInputError": "gateway.args",
    "error_result": "gateway.results",
    "json_result": "gateway.results",
    "result_text": "gateway.results",
    # services
    "estimate_tokens": "gateway.services.tokens",
    "SearchIndex": "gateway.services.search_index",
    "JsonlLog": "gateway.services.jsonl_log",
    "ResponseStore": "gateway.services.responses",
    "LLMUnavailable": "gateway.services.model_endpoint",
    "dumps": "gateway.services.text",
    "human_size": "gateway.services.text",
}

__all__ = [  # noqa: RUF022 - grouped as above
    "__version__",
    "Plugin",
    "PluginTool",
    "ToolCall",
    "GatewayContext",
    "tool",
    "guarded",
    "Args",
    "ToolInputError",
    "error_result",
    "json_result",
    "result_text",
    "estimate_tokens",
    "SearchIndex",
    "JsonlLog",
    "ResponseStore",
    "LLMUnavailable",
    "dumps",
    "human_size",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
