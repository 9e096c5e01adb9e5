"""The plugin interface and the ordered pipeline that runs plugins.

Every hook is declared here, once, with its contract. Built-in features (`plugins/`) are
registered through the same entry-point group third parties use, so `gateway/` never
imports them. `CTX_TRACE_PLUGINS=1` logs every hook call with its arguments and result.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mcp_types as types

from gateway.args import Args, ToolInputError
from gateway.results import error_result, json_result

if TYPE_CHECKING:
    from gateway.catalog import Catalog
    from gateway.llm import LLMClient
    from gateway.settings import Settings

log = logging.getLogger("gateway.plugins")
ENTRY_POINT_GROUP = "mcp_context_gateway.plugins"
TRACE = os.environ.get("CTX_TRACE_PLUGINS", "") not in ("", "0")

DEFAULT_BUDGET = 4000

ProgressReporter = Callable[[float, float | None, str | None], Awaitable[None]]


async def _no_progress(progress: float, total: float | None = None, message: str | None = None) -> None:
    return None


@dataclass
class ToolCall:
    """One tool call as the pipeline sees it."""

    name: str  # the name the host used (`fs__read_file`, `response_outline`)
    arguments: dict[str, Any]
    server: str | None = None  # upstream name; None for the gateway's own tools
    tool: str = ""  # the upstream's own tool name
    session_id: str = "stdio"  # the host connection this call came from
    report_progress: ProgressReporter = _no_progress
    started: float = field(default_factory=time.monotonic)
    host_session: Any = None  # the host's session and request id: an upstream's elicitation goes there
    request_id: Any = None


ToolHandler = Callable[[ToolCall], Awaitable[types.CallToolResult]]


@dataclass
class PluginTool:
    """A tool a plugin contributes: its definition and an async handler."""

    tool: types.Tool
    handler: ToolHandler


@dataclass
class GatewayContext:
    """What a plugin may use of the gateway: its public interface."""

    settings: Settings
    catalog: Catalog
    llm: LLMClient
    pipeline: Pipeline | None = None

    def status(self, session_id: str) -> dict[str, Any]:
        """Every plugin's figures for one host connection (for context_status)."""
        return self.pipeline.status(session_id) if self.pipeline else {}

    @property
    def workspace(self) -> Path:
        return self.settings.gateway.workspace

    def window(self) -> int:
        """The model's window: the setting, else discovered from the endpoint, else 2 x budget."""
        cfg = self.settings.gateway
        return cfg.context_window or self.llm.window or 2 * (cfg.budget or DEFAULT_BUDGET)

    def budget(self) -> int:
        """The token budget: the setting, else half the (set or discovered) window, else 4000."""
        cfg = self.settings.gateway
        if cfg.budget:
            return cfg.budget
        window = cfg.context_window or self.llm.window
        return window // 2 if window else DEFAULT_BUDGET

    def max_response_tokens(self, server: str | None) -> int:
        """Results above this many tokens are offloaded: the per-server or global setting, else budget / 2."""
        return self.settings.limit_for(server, "max_response_tokens") or self.budget() // 2

    def max_response_size(self, server: str | None) -> int:
        return self.settings.limit_for(server, "max_response_size")


class Plugin:
    """Base class; override what you need. Hooks run in the order of `[gateway] plugins`."""

    name: str = "plugin"

    def tools(self) -> Sequence[PluginTool]:
        """Tools this plugin adds to the host's list."""
        return ()

    async def start(self, ctx: GatewayContext) -> None:
        """Open stores, clean up, start background work. Must not block serving for long."""

    async def stop(self) -> None:
        """Close what `start` opened."""

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        """The merged list about to go to a host connection; return it (changed or not)."""
        return tools

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        """A result (upstream or gateway-owned) about to go to the host; return it (replaced or not)."""
        return result

    def status(self, session_id: str) -> dict[str, Any]:
        """A few figures for `context_status` and `inspect`."""
        return {}


class PluginError(Exception):
    pass


def tool(
    name: str,
    description: str,
    handler: ToolHandler,
    properties: dict[str, Any] | None = None,
    required: Sequence[str] = (),
) -> PluginTool:
    """A gateway-owned tool: a one- or two-sentence description and the properties of its arguments."""
    schema = {"type": "object", "properties": properties or {}, "required": list(required)}
    return PluginTool(types.Tool(name=name, description=description, input_schema=schema), handler)


def guarded(
    fn: Callable[[Args, ToolCall], Awaitable[dict[str, Any]]], expected: tuple[type[Exception], ...] = ()
) -> ToolHandler:
    """A tool handler around `fn(args, call) -> payload`: every failure becomes an `isError` result that
    says what to do, never a protocol error or a traceback; the payload goes out as JSON."""

    async def handler(call: ToolCall) -> types.CallToolResult:
        try:
            payload = await fn(Args(call.arguments, call.name), call)
        except (ToolInputError, *expected) as exc:
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


def load_plugins(names: Sequence[str]) -> list[Plugin]:
    """Instantiate the named plugins from the entry-point group, in the given order."""
    available = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    plugins: list[Plugin] = []
    for name in names:
        ep = available.get(name)
        if ep is None:
            known = ", ".join(sorted(available)) or "none installed"
            raise PluginError(f"plugin {name!r} is not installed (known plugins: {known})")
        factory = ep.load()
        plugin = factory()
        plugin.name = name
        plugins.append(plugin)
    return plugins


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class Pipeline:
    """Runs the hooks of every plugin in order. A failing hook is logged and skipped."""

    def __init__(self, plugins: Sequence[Plugin]):
        self.plugins = list(plugins)

    def tools(self) -> dict[str, PluginTool]:
        out: dict[str, PluginTool] = {}
        for plugin in self.plugins:
            for spec in plugin.tools():
                if spec.tool.name in out:
                    raise PluginError(f"two plugins define the tool {spec.tool.name!r}")
                out[spec.tool.name] = spec
        return out

    async def start(self, ctx: GatewayContext) -> None:
        for plugin in self.plugins:
            await plugin.start(ctx)

    async def stop(self) -> None:
        for plugin in reversed(self.plugins):
            try:
                await plugin.stop()
            except Exception:
                log.exception("plugin %s failed to stop", plugin.name)

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        for plugin in self.plugins:
            try:
                tools = await plugin.on_tools_listed(tools, session_id)
            except Exception:
                log.exception("plugin %s failed in on_tools_listed; list passed on unchanged", plugin.name)
            if TRACE:
                log.warning("trace %s.on_tools_listed(session=%s) -> %d tools", plugin.name, session_id, len(tools))
        return tools

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        for plugin in self.plugins:
            try:
                result = await plugin.on_tool_result(call, result)
            except Exception:
                log.exception("plugin %s failed in on_tool_result for %s; result passed on", plugin.name, call.name)
            if TRACE:
                log.warning(
                    "trace %s.on_tool_result(%s, %s) -> %s",
                    plugin.name,
                    call.name,
                    _short(call.arguments),
                    _short(result),
                )
        return result

    def status(self, session_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for plugin in self.plugins:
            try:
                if figures := plugin.status(session_id):
                    out[plugin.name] = figures
            except Exception:
                log.exception("plugin %s failed in status", plugin.name)
        return out
