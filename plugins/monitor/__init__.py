"""Context monitor: a ledger of what the gateway put into each host connection's context (tool
definitions and results, after offload) against the model's window, and an advisory note on a
tool result when the window runs low.

It cannot see the conversation itself, only what passes through the gateway, so its figure is a
lower bound. Where a host reports the real figure through a statusline bridge file (Claude Code),
that figure replaces the ledger.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from gateway.plugin import GatewayContext, Plugin, ToolCall
from gateway.services.context_levels import Debounce, level_for, note_text
from gateway.services.costs import COUNT_APART_ABOVE, definition_tokens, size_at_least
from gateway.services.namespaced import PerNamespace
from gateway.services.tokens import estimate_tokens

log = logging.getLogger("plugins.monitor")
MAX_LEDGERS = 1024  # per namespace (HTTP token): one tenant's sessions never push out another's
LEDGER_SOURCE = "gateway estimate{}: tool traffic only"  # for which tokenizer
BRIDGE_SOURCE = "reported by the host"


@dataclass
class Ledger:
    definitions: int = 0
    results: int = 0
    calls: int = 0
    debounce: Debounce = field(default_factory=Debounce)

    @property
    def used(self) -> int:
        return self.definitions + self.results


class MonitorPlugin(Plugin):
    name = "monitor"
    order = 900  # last: it counts what the host really receives, after offload replaced a result

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.ledgers: PerNamespace[Ledger] = PerNamespace(MAX_LEDGERS)  # host connection -> its ledger

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def _ledger(self, session_id: str, namespace: str | None = None) -> Ledger:
        """The connection's ledger; a call names its namespace, and the ledger is filed under it."""
        ledger = self.ledgers.get(session_id)
        if ledger is None or namespace is not None:
            ledger = ledger or Ledger()
            owner = self.ledgers.namespace.get(session_id, "") if namespace is None else namespace
            self.ledgers.put(owner, session_id, ledger)  # HTTP sessions come and go: keep the newest
        return ledger

    def measure(self, session_id: str) -> tuple[float | None, str, int | None]:
        """(remaining % or None when the window is unknown, source, window)."""
        assert self.ctx is not None
        window = self.ctx.window.for_session(session_id)
        host = self.ctx.window.bridge.current()
        if host is not None:
            return host.remaining_pct, BRIDGE_SOURCE, host.window or window.tokens
        if window.tokens is None:
            return None, "window unknown", None
        used = self._ledger(session_id).used
        source = LEDGER_SOURCE.format(" for " + self.ctx.tokens.short_label())
        return max(0.0, 100.0 * (1 - used / window.tokens)), source, window.tokens

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        # The host replaces its list on every tools/list, so definitions are counted once, not summed.
        self._ledger(session_id).definitions = definition_tokens(tools)
        return tools

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        with contextlib.suppress(Exception):  # a result that cannot be counted: `_noted` says so
            await call.cost_apart(result)
        return self._noted(call, result)

    def on_tool_result_now(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult | None:
        # a long result not counted yet (a server whose results are never offloaded, the gateway's own
        # tools) is counted in a thread
        if not call.counted(result) and size_at_least(result) > COUNT_APART_ABOVE:
            return None
        return self._noted(call, result)

    def _noted(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        try:
            ledger = self._ledger(call.session_id, call.namespace)
            ledger.calls += 1
            ledger.results += call.cost_of(result).tokens + call.argument_tokens()
            remaining, source, window = self.measure(call.session_id)
            if remaining is None:  # an unknown window: say nothing rather than invent one
                return result
            level = level_for(remaining)
            if not ledger.debounce.should_warn(level) or level is None:
                return result
            note = types.TextContent(text=note_text(level, remaining, window, source))
            ledger.results += estimate_tokens(note.text)
            return result.model_copy(update={"content": [*result.content, note]})
        except Exception:  # the monitor never fails a call
            log.exception("context monitor failed; the result goes out unchanged")
            return result

    def status(self, session_id: str) -> dict[str, Any]:
        remaining, source, window = self.measure(session_id)
        ledger = self._ledger(session_id)
        return {
            "used_tokens": ledger.used,
            "definitions": ledger.definitions,
            "results": ledger.results,
            "window": window,
            "window_source": self.ctx.window.for_session(session_id).source if self.ctx else "",
            "remaining_pct": None if remaining is None else round(remaining, 1),
            "level": "unknown" if remaining is None else (level_for(remaining) or "ok"),
            "source": source,
        }
