"""Finding, configuring and running plugins: the ordered pipeline of hooks.

Every installed plugin (entry-point group `mcp_context_gateway.plugins`) is enabled unless named in
`[gateway] disabled_plugins`; `[gateway] plugins = [...]` instead names exactly which run, in that
order. A failing hook is logged and skipped, a plugin whose `start` fails is left out, and the
gateway keeps serving. `CTX_TRACE_PLUGINS=1` logs every hook call with its arguments and result.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import mcp_types as types
from pydantic import ValidationError

from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.services import spill

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger("gateway.plugins")
ENTRY_POINT_GROUP = "mcp_context_gateway.plugins"


def tracing() -> bool:
    return os.environ.get("CTX_TRACE_PLUGINS", "") not in ("", "0")


class PluginError(Exception):
    """A plugin that cannot be found or configured; the message says what to change."""


def installed_plugins() -> dict[str, Any]:
    """name -> entry point, for every plugin installed in this environment."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_plugins(names: Sequence[str] | None = None, disabled: Sequence[str] = ()) -> list[Plugin]:
    """Instantiate plugins: the named ones in the given order, or every installed one ordered by
    `Plugin.order`; minus the disabled ones."""
    available = installed_plugins()
    for name in disabled:
        if name not in available:
            log.warning("disabled_plugins names %r, which is not installed (installed: %s)", name, ", ".join(available))
    chosen = list(names) if names is not None else list(available)
    plugins: list[Plugin] = []
    for name in chosen:
        if name in disabled:
            continue
        ep = available.get(name)
        if ep is None:
            known = ", ".join(sorted(available)) or "none installed"
            raise PluginError(f"plugin {name!r} is not installed (known plugins: {known})")
        try:
            plugin = ep.load()()
        except Exception as exc:
            log.exception("plugin %s failed to load; the gateway serves without it", name)
            if names is not None:
                raise PluginError(f"plugin {name!r} failed to load: {type(exc).__name__}: {exc}") from None
            continue
        plugin.name = name
        plugins.append(plugin)
    if names is None:
        plugins.sort(key=lambda p: (p.order, p.name))
    return plugins


def configure(plugins: Sequence[Plugin], tables: dict[str, Any]) -> None:
    """Give each plugin its validated `[plugins.<name>]` table. Raises PluginError naming the bad key."""
    names = {p.name for p in plugins}
    for name in tables:
        if name not in names:
            log.warning("[plugins.%s] is set but no such plugin runs; its settings are ignored", name)
    for plugin in plugins:
        table = tables.get(plugin.name) or {}
        model = plugin.settings_model
        if model is None:
            if table:
                raise PluginError(f"[plugins.{plugin.name}]: this plugin takes no settings (got {', '.join(table)})")
            continue
        try:
            plugin.settings = model.model_validate(table)
        except ValidationError as exc:
            lines = [f"[plugins.{plugin.name}]:"]
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"])
                lines.append(f"  {where}: {err['msg'].removeprefix('Value error, ')}")
            raise PluginError("\n".join(lines)) from None


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


@functools.cache
def _result_hook(kind: type[Plugin]) -> str:
    """How a plugin class takes results: "now" (it has `on_tool_result_now`), "async" (only
    `on_tool_result`), or "none" (neither: the base class's pass-through)."""
    if kind.on_tool_result_now is not Plugin.on_tool_result_now:
        return "now"
    return "async" if kind.on_tool_result is not Plugin.on_tool_result else "none"


class Pipeline:
    """Runs the hooks of every plugin in order. A failing hook is logged and skipped."""

    def __init__(self, plugins: Sequence[Plugin]):
        self.plugins = list(plugins)
        self.failed: dict[str, str] = {}  # plugins left out at start, and why
        self.tracing = tracing()  # read once: the environment is read per hook otherwise (every call)

    def tools(self) -> dict[str, PluginTool]:
        out: dict[str, PluginTool] = {}
        for plugin in self.plugins:
            for spec in plugin.tools():
                if spec.tool.name in out:
                    raise PluginError(f"two plugins define the tool {spec.tool.name!r}")
                out[spec.tool.name] = spec
        return out

    async def start(self, ctx: GatewayContext) -> None:
        """Start each plugin; one that fails is logged and left out of every hook."""
        running = []
        for plugin in self.plugins:
            try:
                await plugin.start(ctx)
            except Exception as exc:
                log.exception("plugin %s failed to start; the gateway serves without it", plugin.name)
                self.failed[plugin.name] = f"{type(exc).__name__}: {exc}"
                continue
            running.append(plugin)
        self.plugins = running

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
            if self.tracing:
                log.warning("trace %s.on_tools_listed(session=%s) -> %d tools", plugin.name, session_id, len(tools))
        return tools

    @property
    def reads_spilled(self) -> bool:
        """Whether any plugin takes results whose long texts stay on disk (then upstreams spill them)."""
        return any(plugin.reads_spilled for plugin in self.plugins)

    async def on_tool_result(
        self, call: ToolCall, result: types.CallToolResult, start: int = 0
    ) -> types.CallToolResult:
        """Every plugin's `on_tool_result` in order (from the `start`-th on: the ones before it ran
        in `on_tool_result_now`)."""
        for plugin in self.plugins[start:]:
            if not plugin.reads_spilled and spill.pending():
                result = await anyio.to_thread.run_sync(spill.restore, result)
            try:
                result = await plugin.on_tool_result(call, result)
            except Exception:
                log.exception("plugin %s failed in on_tool_result for %s; result passed on", plugin.name, call.name)
            self._trace(plugin, call, result)
        return result

    def on_tool_result_now(self, call: ToolCall, result: types.CallToolResult) -> tuple[types.CallToolResult, int]:
        """The plugins that can decide without waiting, in order, up to the first that cannot (the lean
        path runs this inside the loop's read callback, no task): the result so far, and the index of
        that plugin (`len(plugins)` when all ran), from which `on_tool_result` goes on. A result whose
        long texts are still on disk is left to `on_tool_result` whole."""
        if spill.pending():
            return result, 0
        for index, plugin in enumerate(self.plugins):
            way = _result_hook(type(plugin))
            if way == "none":
                continue
            if way == "async":
                return result, index
            try:
                decided = plugin.on_tool_result_now(call, result)
            except Exception:
                log.exception("plugin %s failed in on_tool_result for %s; result passed on", plugin.name, call.name)
                decided = result
            if decided is None:
                return result, index
            result = decided
            self._trace(plugin, call, result)
        return result, len(self.plugins)

    def _trace(self, plugin: Plugin, call: ToolCall, result: types.CallToolResult) -> None:
        if self.tracing:
            log.warning(
                "trace %s.on_tool_result(%s, %s) -> %s", plugin.name, call.name, _short(call.arguments), _short(result)
            )

    def status(self, session_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for plugin in self.plugins:
            try:
                if figures := plugin.status(session_id):
                    out[plugin.name] = figures
            except Exception:
                log.exception("plugin %s failed in status", plugin.name)
        return out


def build_pipeline(settings: Settings, plugins: Sequence[Plugin] | None = None) -> Pipeline:
    """The configured pipeline for these settings (or for the given plugin instances)."""
    cfg = settings.gateway
    chosen = load_plugins(cfg.plugins, cfg.disabled_plugins) if plugins is None else list(plugins)
    configure(chosen, settings.plugins)
    return Pipeline(chosen)
