"""Building gateway-owned tools: a short definition and a handler that never fails the protocol."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import mcp_types as types

from gateway.args import Args, ToolInputError
from gateway.plugin import PluginTool, ToolCall, ToolHandler
from gateway.results import error_result, json_result
from gateway.services.shares import Busy

log = logging.getLogger("gateway.handlers")


def tool(
    name: str,
    description: str,
    handler: ToolHandler,
    properties: dict[str, Any] | None = None,
    required: Sequence[str] = (),
) -> PluginTool:
    """A gateway-owned tool: a one- or two-sentence description and the properties of its arguments."""
    schema: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:  # an empty list says nothing, in every host's window
        schema["required"] = list(required)
    return PluginTool(types.Tool(name=name, description=description, input_schema=schema), handler)


def integer(description: str = "", default: int | None = None) -> dict[str, Any]:
    """An integer argument's schema: its default when fixed, else a few words on what it is and how its
    default is chosen (every word here is in every host's window, so no more than that)."""
    out: dict[str, Any] = {"type": "integer"}
    if description:
        out["description"] = description
    if default is not None:
        out["default"] = default
    return out


def guarded(
    fn: Callable[[Args, ToolCall], Awaitable[dict[str, Any]]], expected: tuple[type[Exception], ...] = ()
) -> ToolHandler:
    """A tool handler around `fn(args, call) -> payload`: every failure becomes an `isError` result that
    says what to do, never a protocol error or a traceback; the payload goes out as JSON."""

    async def handler(call: ToolCall) -> types.CallToolResult:
        try:
            payload = await fn(Args(call.arguments, call.name), call)
        except (ToolInputError, Busy, *expected) as exc:
            message = str(exc)
            return error_result(message if message.startswith(call.name) else f"{call.name}: {message}")
        except OSError as exc:
            log.exception("%s failed on the file system", call.name)
            return error_result(f"{call.name}: file system error ({exc.strerror or exc}); nothing was changed")
        except Exception as exc:
            log.exception("%s failed", call.name)
            return error_result(
                f"{call.name} failed: {type(exc).__name__}: {exc}. Check the arguments; the gateway keeps serving."
            )
        return json_result(payload)

    return handler
