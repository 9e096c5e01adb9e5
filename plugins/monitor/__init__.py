"""Context monitor: a ledger of what the gateway put into each host connection's context (tool
definitions and results, after offload) against the model's window, and an advisory note on a
tool result when the window runs low.

It cannot see the conversation itself, only what passes through the gateway, so its figure is a
lower bound. Where a host reports the real figure through a statusline bridge file (Claude Code),
that figure replaces the ledger.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from gateway.plugin import GatewayContext, Plugin, ToolCall
from gateway.services.context_levels import Debounce, bridge_path, fresh_bridges, level_for, note_text, read_bridge
from gateway.services.costs import definition_tokens
from gateway.services.tokens import estimate_tokens

log = logging.getLogger("plugins.monitor")
LEDGER_SOURCE = "gateway estimate: tool traffic only"
BRIDGE_SOURCE = "reported by the host"
BRIDGE_RECHECK_SECONDS = 1.0


@dataclass
class Ledger:
    definitions: int = 0
    results: int = 0
    calls: int = 0
    debounce: Debounce = field(default_factory=Debounce)

    @property
    def used(self) -> int:
        return self.definitions + self.results


def result_tokens(result: types.CallToolResult) -> int:
    total = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            total += estimate_tokens(block.text)
        else:
            total += estimate_tokens(block.model_dump_json())
    if result.structured_content is not None:
        total += estimate_tokens(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return total


class MonitorPlugin(Plugin):
    name = "monitor"
    order = 900  # last: it counts what the host really receives, after offload replaced a result

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.ledgers: dict[str, Ledger] = {}
        self._bridge_checked = -BRIDGE_RECHECK_SECONDS
        self._bridge_value: float | None = None

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    def _ledger(self, session_id: str) -> Ledger:
        return self.ledgers.setdefault(session_id, Ledger())

    def _host_figure(self) -> float | None:
        """The host's own remaining %, from a fresh statusline bridge file for the session we serve:
        the one named by CTX_HOST_SESSION_ID, else the only fresh one. Looked up at most once a second
        (listing the temp folder on every call cost more than the rest of the monitor)."""
        now = time.monotonic()
        if now - self._bridge_checked < BRIDGE_RECHECK_SECONDS:
            return self._bridge_value
        wanted = os.environ.get("CTX_HOST_SESSION_ID")
        if wanted:
            value = read_bridge(bridge_path(wanted))
        else:
            fresh = fresh_bridges()
            value = fresh[0][1] if len(fresh) == 1 else None
        self._bridge_checked, self._bridge_value = now, value
        return value

    def measure(self, session_id: str) -> tuple[float, str, int]:
        """(remaining %, source, window)."""
        assert self.ctx is not None
        window = self.ctx.window.size()
        host = self._host_figure()
        if host is not None:
            return host, BRIDGE_SOURCE, window
        used = self._ledger(session_id).used
        return max(0.0, 100.0 * (1 - used / window)), LEDGER_SOURCE, window

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        # The host replaces its list on every tools/list, so definitions are counted once, not summed.
        self._ledger(session_id).definitions = definition_tokens(tools)
        return tools

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        try:
            ledger = self._ledger(call.session_id)
            ledger.calls += 1
            ledger.results += result_tokens(result) + estimate_tokens(json.dumps(call.arguments, default=str))
            remaining, source, window = self.measure(call.session_id)
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
            "remaining_pct": round(remaining, 1),
            "level": level_for(remaining) or "ok",
            "source": source,
        }
