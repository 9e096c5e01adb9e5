"""The plugin interface: every hook declared once, with its contract.

Built-in features (`plugins/`) register through the same entry-point group third parties use, so
`gateway/` never imports them. The pipeline that runs the hooks is `gateway.pipeline`; the helpers
for building tools are `gateway.handlers`, `gateway.args` and `gateway.results`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import mcp_types as types
from pydantic import BaseModel

from gateway.progress import ProgressReporter, no_progress
from gateway.services import activity, shares
from gateway.services.costs import COUNT_APART_ABOVE, Cost, result_cost, size_at_least, tokens_over
from gateway.services.responses import ResponseStore, seen_on_host
from gateway.services.storage import Storage
from gateway.services.tokens import json_tokens

if TYPE_CHECKING:  # types only: services the context hands out (no cycle: services never import the plugin API)
    from gateway.services.model_endpoint import ModelEndpoint
    from gateway.services.tokens import TokenEstimator
    from gateway.services.window import ContextWindow
    from gateway.settings import Settings

T = TypeVar("T")


@dataclass
class ToolCall:
    """One tool call as the pipeline sees it."""

    name: str  # the name the host used (`fs__read_file`, `response_outline`)
    arguments: dict[str, Any]
    server: str | None = None  # upstream name; None for the gateway's own tools
    tool: str = ""  # the upstream's own tool name
    session_id: str = "stdio"  # the host connection this call came from
    report_progress: ProgressReporter = no_progress
    started: float = field(default_factory=activity.call_started)
    host_session: Any = None  # the host's session and request id: an upstream's elicitation goes there
    request_id: Any = None
    meta: dict[str, Any] = field(default_factory=dict)  # the host's `_meta`, minus its own progress token
    namespace: str = ""  # whose data this call may see: the HTTP token's name; "" = the one local user
    exchange: Any = None  # for a 2026 host: how an upstream's questions reach it (`input_required`)
    lean: bool = False  # taken by the lean path (`gateway/proxy/lean.py`): a stdio upstream gets it the same way
    _costs: dict[int, tuple[Any, Cost]] = field(default_factory=dict, init=False, repr=False)
    _argument_tokens: int | None = field(default=None, init=False, repr=False)

    def argument_tokens(self) -> int:
        """Tokens of the arguments as the model wrote them (compact JSON), counted once. The lean path
        counts them while the upstream works (`proxy/lean.py`), off the caller's wait."""
        if self._argument_tokens is None:
            self._argument_tokens = json_tokens(self.arguments)
        return self._argument_tokens

    def counted(self, result: types.CallToolResult) -> bool:
        """Whether `cost_of(result)` is known already (it costs nothing then)."""
        found = self._costs.get(id(result))
        return found is not None and found[0] is result

    async def cost_apart(self, result: types.CallToolResult) -> Cost:
        """`cost_of(result)` for a caller on the event loop: a long result not counted yet is counted in a
        thread of this caller's share of counts (the loop only waits), here when none is free for minutes."""
        return await self._apart(result, self.cost_of, result)

    async def fits_apart(self, result: types.CallToolResult, max_size: int, max_tokens: int) -> bool:
        """Whether `result` is within both limits, decided as `cost_apart` counts: one whose text is surely
        over `max_tokens` (`costs.tokens_over`) is not counted whole to tell it."""

        def fits() -> bool:
            if tokens_over(result, max_tokens):
                return False
            cost = self.cost_of(result)
            return cost.size <= max_size and cost.tokens <= max_tokens

        return await self._apart(result, fits)

    async def _apart(self, result: types.CallToolResult, count: Callable[..., T], *args: Any) -> T:
        """`count(*args)` in a thread of this caller's share of counts when `result` is long and not counted
        yet (the loop only waits), here when it is short or no place is free for minutes."""
        if not self.counted(result) and size_at_least(result) > COUNT_APART_ABOVE:
            with contextlib.suppress(shares.Busy):
                return await shares.count_pool().run(self.namespace, count, *args)
        return count(*args)

    def cost_of(self, result: types.CallToolResult, copy: int | EllipsisType | None = ...) -> Cost:
        """What `result` costs in the context (`costs.result_cost`), counted once per result object of
        this call: offload, the monitor and the gateway's usage figures share the count. `copy`: the text
        block its structuredContent repeats, when the caller has looked already."""
        found = self._costs.get(id(result))
        if found is None or found[0] is not result:
            found = self._costs[id(result)] = (result, result_cost(result, copy))
        return found[1]


ToolHandler = Callable[[ToolCall], Awaitable[types.CallToolResult]]


@dataclass
class PluginTool:
    """A tool a plugin contributes: its definition and an async handler."""

    tool: types.Tool
    handler: ToolHandler


class Routes(Protocol):
    """What a plugin may know of the routing table: which host-facing tool names belong to an upstream."""

    tool_routes: Mapping[str, Any]


@dataclass
class GatewayContext:
    """What a plugin may use of the gateway: its services, by name."""

    settings: Settings
    routing: Routes  # which host-facing tool names belong to which upstream
    llm: ModelEndpoint  # the user's model endpoint: summaries, window discovery, calibration
    responses: ResponseStore  # the workspace folder of offloaded results
    tokens: TokenEstimator
    window: ContextWindow  # the model's window, the budget and the result limits derived from it
    storage: Storage = field(default_factory=Storage)  # SQLite files, or PostgreSQL shared by replicas
    status_of: Callable[[str], dict[str, Any]] = lambda _sid: {}

    @property
    def workspace(self) -> Path:
        return self.settings.gateway.workspace

    def namespace_dir(self, namespace: str = "") -> Path:
        """Where one namespace keeps its data: the workspace itself for the local user (stdio, a single
        token), `ns/<name>/` below it for each named HTTP token."""
        return self.workspace if not namespace else self.workspace / "ns" / namespace

    def namespaces(self) -> list[str]:
        """Every namespace that has data: "" and each `ns/<name>`."""
        folder = self.workspace / "ns"
        named = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        return ["", *named]

    def responses_for(self, namespace: str = "") -> ResponseStore:
        """The responses store of one namespace (the default one is `responses`)."""
        if not namespace:
            return self.responses
        folder = self.namespace_dir(namespace) / "responses"
        return ResponseStore(folder, seen_on_host(self.settings.gateway.workspace_on_host, self.workspace, folder))

    def status(self, session_id: str) -> dict[str, Any]:
        """Every plugin's figures for one host connection (for context_status)."""
        return self.status_of(session_id)


class Plugin:
    """Base class; override what you need.

    `order` places the plugin in the pipeline (lower runs first; ties by name): offload (100) must
    replace a result before the monitor (900) counts it. `settings_model` validates the plugin's
    `[plugins.<name>]` table; the validated instance is `self.settings` before `start` runs.
    `reads_spilled` marks a plugin whose `on_tool_result` understands results whose long texts are
    still on disk (`gateway.services.spill`); every other plugin is handed the text itself.
    """

    name: str = "plugin"
    order: ClassVar[int] = 500
    reads_spilled: ClassVar[bool] = False
    settings_model: ClassVar[type[BaseModel] | None] = None
    settings: Any = None

    def tools(self) -> Sequence[PluginTool]:
        """Tools this plugin adds to the host's list."""
        return ()

    async def start(self, ctx: GatewayContext) -> None:
        """Open stores, clean up, start background work. Must not block serving for long. A plugin
        whose start raises is logged and left out; the gateway serves without it."""

    async def stop(self) -> None:
        """Close what `start` opened."""

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        """The merged list about to go to a host connection; return it (changed or not)."""
        return tools

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        """A result (upstream or gateway-owned) about to go to the host; return it (replaced or not)."""
        return result

    def on_tool_result_now(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult | None:
        """`on_tool_result` without waiting, for a plugin that can usually decide at once: return the
        result (replaced or not), or None to have `on_tool_result` awaited instead. The lean path calls
        it inside the event loop's read callback, where there is no task: it must not need one (no
        awaiting, no anyio cancel scopes or thread calls). Every other path awaits `on_tool_result`
        as before, so the two must agree (`on_tool_result` can start by calling this one). A plugin
        that defines neither hook is skipped."""
        return None

    def status(self, session_id: str) -> dict[str, Any]:
        """A few figures for `context_status` and `inspect`."""
        return {}
