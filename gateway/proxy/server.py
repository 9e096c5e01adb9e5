"""The front MCP server the host talks to: routes calls to upstreams or to plugin tools."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged

from gateway.pipeline import build_pipeline
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.proxy.catalog_mode import CatalogMode
from gateway.proxy.exchanges import Exchange, Exchanges
from gateway.proxy.host_sessions import (
    HostConnections,
    client_name,
    forwardable_meta,
    is_modern,
    namespace_of,
    session_id_of,
)
from gateway.proxy.lean import LeanFront, spawn, wire_result
from gateway.proxy.notices import Notices
from gateway.proxy.reload import STOP_WAIT, Plan
from gateway.proxy.routing import URI_SEP, Route, RoutingTable
from gateway.proxy.upstream import Upstream, maps_headers
from gateway.proxy.upstream_spawn import Started
from gateway.results import error_result
from gateway.services import heap, process_tree, spill
from gateway.services.context_levels import HostBridge
from gateway.services.costs import definition_tokens
from gateway.services.model_endpoint import ModelEndpoint
from gateway.services.responses import (
    PIECE_BYTES,
    RESPONSE_SCHEME,
    ResponseStore,
    StoreError,
    read_piece,
    response_uri,
    saved_kind,
    seen_on_host,
)
from gateway.services.spill import Spiller
from gateway.services.stats import FLUSH_SECONDS, Row, Stats, replica_name
from gateway.services.storage import Storage
from gateway.services.window import ContextWindow
from gateway.settings import ServerConfig, Settings

log = logging.getLogger("gateway.server")

PAGE_SIZE = 100
READY_WAIT_CAP = 30.0  # longest a tools/list waits for slow upstreams; later arrivals are pushed by list_changed


class GatewayServer(Server[Any]):
    """Advertises `listChanged` on every transport (the HTTP manager passes no options)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> Any:
        return super().create_initialization_options(
            notification_options
            or NotificationOptions(tools_changed=True, resources_changed=True, prompts_changed=True),
            experimental_capabilities,
            extensions,
        )


def unencodable(value: Any, path: str = "arguments") -> str | None:
    """The path of the first string that cannot be encoded as UTF-8 (a lone surrogate), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = unencodable(key, path) if isinstance(key, str) else None
            found = found or unencodable(item, f"{path}.{key}" if path != "arguments" else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if found := unencodable(item, f"{path}.{i}"):
                return found
    return None


def _page(items: Sequence[Any], cursor: str | None) -> tuple[list[Any], str | None]:
    try:
        start = int(cursor or 0)
    except ValueError:
        raise MCPError(types.INVALID_PARAMS, f"invalid cursor {cursor!r}; list again without a cursor") from None
    if start < 0 or start > len(items):
        raise MCPError(types.INVALID_PARAMS, f"cursor {cursor!r} is out of range; list again without a cursor")
    end = start + PAGE_SIZE
    return list(items[start:end]), (str(end) if end < len(items) else None)


class Gateway:
    """Upstreams + routing table + plugin pipeline + the front `Server`."""

    def __init__(
        self, settings: Settings, plugins: Sequence[Plugin] | None = None, started: dict[str, Started] | None = None
    ):
        """`started`: upstream processes already started (`upstream_spawn.prestart`), taken by their upstreams."""
        self.settings = settings
        workspace = settings.gateway.workspace
        self.pipeline = build_pipeline(settings, plugins)
        # a plugin that takes results with their long texts on disk lets upstreams spool huge replies
        self.spiller = Spiller(workspace / "spill") if self.pipeline.reads_spilled else None
        self.upstreams = {
            name: self._new_upstream(name, cfg, (started or {}).get(name))
            for name, cfg in settings.enabled_servers.items()
        }
        self._tg: anyio.abc.TaskGroup | None = None  # where upstreams run (added ones too, on reload)
        storage = Storage(settings.storage)
        cfg = settings.gateway
        self.stats = Stats(workspace, storage, replica_name(cfg.replica_name, cfg.transport, cfg.port))
        self._closing = anyio.Event()
        self._list_costs: dict[tuple[Any, ...], tuple[int, int]] = {}  # listing -> (tokens shown, kept out)
        self.llm = ModelEndpoint(settings.llm, workspace)
        # the one estimator every figure uses
        self.llm.tokens.configure(settings.gateway.tokenizer, settings.gateway.exact_tokens)
        # a host's statusline figure applies to the gateways that host started (stdio); HTTP serves many hosts
        host = process_tree.host_pid() if settings.gateway.transport == "stdio" else None
        self.window = ContextWindow(settings, self.llm, HostBridge(host))
        self.routing = RoutingTable(settings, self.upstreams)
        self.routing.ledger.configure(settings)  # before any tool is listed: a changed entry is taken anew
        self.catalog_mode = CatalogMode(self.routing, self.call, self._auto_window, self.wait_ready)
        self.context = GatewayContext(
            settings=settings,
            routing=self.routing,
            llm=self.llm,
            responses=ResponseStore(
                settings.gateway.responses_dir,
                seen_on_host(
                    settings.gateway.workspace_on_host, settings.gateway.workspace, settings.gateway.responses_dir
                ),
            ),
            tokens=self.llm.tokens,
            window=self.window,
            storage=storage,
            status_of=self._status,
        )
        self.own_tools: dict[str, PluginTool] = {}
        self.meta_tools: dict[str, PluginTool] = {spec.tool.name: spec for spec in self.catalog_mode.tools()}
        self.local_tools: dict[str, PluginTool] = {}  # every tool the gateway answers itself: one dispatch
        self._collect_tools()
        self.hosts = HostConnections()
        self.notices = Notices(
            self.routing, self.hosts, self._remember_host, self._after_start, self.wait_ready, self._spawn
        )
        self.exchanges = Exchanges()  # 2026 hosts' calls that an upstream interrupted with a question
        self._exchange_tasks: set[asyncio.Task[None]] = set()  # their upstream calls, running
        self._listed: tuple[Any, ...] = ()
        self.server = self._build_server()
        # plain tools/call from a stdio host, below the SDK's server (proxy/lean.py)
        self.lean = LeanFront(
            lambda: self.hosts.get("stdio"),
            self._run_call,
            self._start_lean,
            self._finish_now,
            self._record_call,
            self._run_modern_call,
            self._start_lean_modern,
        )
        self.lean.server_info = self._server_info_stamp
        self._stamp: dict[str, Any] | None = None

    def _server_info_stamp(self) -> dict[str, Any]:
        """The gateway's `serverInfo` as a 2026-era result carries it, made once: the SDK's property copies it
        for every result, and the lean path only writes it out."""
        if self._stamp is None:
            self._stamp = self.server.server_info_stamp
        return self._stamp

    def _new_upstream(self, name: str, cfg: ServerConfig, started: Started | None = None) -> Upstream:
        return Upstream(
            name,
            cfg,
            self.settings.gateway.logs_dir,
            on_change=self._upstream_changed,
            spiller=self.spiller,
            # the notices room is made after the upstreams (it needs the routing table over them)
            on_notice=lambda upstream, message: self.notices.relay(upstream, message),
            roots_host=lambda namespace=None: self.notices.roots_host(namespace),
            started=started,
        )

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        """Start a task in the running gateway's task group (nothing happens when it is not running)."""
        if self._tg is not None:
            self._tg.start_soon(task)

    def _status(self, session_id: str) -> dict[str, Any]:
        """Every plugin's figures for a host connection, and its usage line (`context_status`)."""
        return self.pipeline.status(session_id) | {"usage": self.stats.session_line(session_id)}

    def _auto_window(self, session_id: str | None) -> int:
        """The window catalog mode `auto` compares against: the host's, else (unknown) twice the budget."""
        return self.window.size(session_id) or 2 * self.window.budget(session_id)

    def _collect_tools(self) -> None:
        """Plugin tools and catalog mode's meta-tools, dispatched the same way; their names are reserved."""
        self.own_tools = self.pipeline.tools()
        self.local_tools = self.own_tools | self.meta_tools
        self.routing.reserved = set(self.local_tools)
        self.routing.rebuild()

    # -- lifecycle ------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Start every upstream owner task and the plugins; stop them all (concurrently) on exit."""
        if self.spiller is not None:
            self.spiller.remove_stale()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for upstream in self.upstreams.values():
                tg.start_soon(upstream.run, name=f"upstream:{upstream.name}")
            llm_scope = anyio.CancelScope()

            async def start_llm() -> None:
                with llm_scope:
                    await self.llm.start()

            tg.start_soon(start_llm, name="llm:start")  # calibration never delays serving
            tg.start_soon(self._write_stats, name="stats:flush")
            try:
                await self.pipeline.start(self.context)
                if self.pipeline.failed:  # a plugin left out takes its tools with it
                    self._collect_tools()
                yield self
            finally:
                llm_scope.cancel()
                for task in list(self._exchange_tasks):
                    task.cancel()
                for upstream in self.upstreams.values():
                    upstream.stop()
                with anyio.CancelScope(shield=True):
                    await self.pipeline.stop()
                    await self.llm.aclose()
                    self._closing.set()  # the stats writer ends
                    # what is left is written here (on a signal the writer is cancelled with its task group)
                    await anyio.to_thread.run_sync(self.stats.flush)
                    await anyio.to_thread.run_sync(self.stats.close)
                    await anyio.to_thread.run_sync(self.routing.ledger.close)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every upstream (their process groups) and the plugins, without waiting on the host."""
        for upstream in self.upstreams.values():
            upstream.stop()
        with anyio.move_on_after(timeout):
            for upstream in list(self.upstreams.values()):  # a reload may change the dict meanwhile
                await upstream.finished.wait()
        await self.pipeline.stop()
        await anyio.to_thread.run_sync(self.stats.flush)

    async def _write_stats(self) -> None:
        while not self._closing.is_set():
            with anyio.move_on_after(FLUSH_SECONDS):
                await self._closing.wait()
            if self.stats.pending and not self._closing.is_set():  # the last rows: `running` writes them
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.stats.flush)

    async def reconfigure(self, new: Settings, change: Plan) -> None:
        """Apply a reloaded configuration (see `proxy/reload.py`): stop removed and changed servers
        (their processes end), start added and changed ones, update the rest in place, and tell every
        host its lists changed. The merged lists keep the new config's server order."""
        stopping = [self.upstreams[name] for name in change.removed + change.restarted]
        for upstream in stopping:
            upstream.stop()
        if stopping and heap.thaw():  # they were frozen at start: the collector may free them now
            asyncio.get_running_loop().call_later(heap.FREEZE_AFTER, heap.serving)
        with anyio.move_on_after(STOP_WAIT):
            for upstream in stopping:
                await upstream.finished.wait()
        self.settings.servers = new.servers  # shared with the plugins and the window: one assignment
        self.settings.hosts = new.hosts
        for key, value in change.live.items():
            setattr(self.settings.gateway, key, value)
        current = dict(self.upstreams)
        self.upstreams.clear()  # in place: the routing table holds this dict
        for name, cfg in new.enabled_servers.items():
            upstream = current.get(name)
            if upstream is None or name in change.restarted:
                upstream = self._new_upstream(name, cfg)
                assert self._tg is not None, "reconfigure needs a running gateway"
                self._tg.start_soon(upstream.run, name=f"upstream:{name}")
            else:
                upstream.config = cfg
            self.upstreams[name] = upstream
        self.notices.forget_servers(change.removed + change.restarted)  # the servers that sent updates are gone
        self.routing.ledger.configure(self.settings)  # an edited server entry: its definitions taken anew
        await self._upstream_changed(None)

    async def _after_start(self, lookup: Callable[[], Route | None]) -> Route | None:
        """`lookup()`, looked up again once the upstreams still starting are up: a request sent right
        after the gateway started names something an upstream has not listed (or cannot serve) yet."""
        found = lookup()
        if any(not u.ready.is_set() for u in self.upstreams.values()) and (
            found is None or not self.upstreams[found.server].ready.is_set()
        ):
            await self.wait_ready()
            found = lookup()
        return found

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every upstream finished its first start attempt (bounded)."""
        if timeout is None:
            timeout = min(
                READY_WAIT_CAP, max((u.config.init_timeout_seconds for u in self.upstreams.values()), default=0) + 1
            )
        with anyio.move_on_after(timeout):
            for upstream in list(self.upstreams.values()):  # a reload may change the dict meanwhile
                await upstream.ready.wait()

    # -- change propagation ---------------------------------------------------------------

    def _remember_host(self, ctx: ServerRequestContext[Any]) -> str:
        sid, namespace = session_id_of(ctx), namespace_of(ctx)
        self.window.note_host(sid, client_name(ctx), namespace)
        caps = getattr(ctx.session, "client_capabilities", None)
        if self.hosts.get(sid) is not ctx.session and caps is not None and caps.roots is not None:
            # a host with roots arrived after the upstreams asked (they start first): they ask again
            self.notices.roots_changed()
        self.hosts.put(namespace, sid, ctx.session)
        return sid

    def host_of(self, session_id: str) -> ServerSession | None:
        """The host session behind an HTTP session id, once it has spoken, kept among the most recent
        (as `_remember_host` keeps it for the SDK's path)."""
        return self.hosts.touch(session_id)

    def _snapshot(self) -> tuple[Any, ...]:
        return (
            tuple(t.model_dump_json() for t in self.visible_tools()),
            tuple(r.uri for r in self.routing.resources()),
            tuple(t.uri_template for t in self.routing.resource_templates()),
            tuple(self.routing.prompts),
        )

    async def _upstream_changed(self, upstream: Upstream | None) -> None:
        before = self._listed or self._snapshot()
        self.routing.rebuild()
        after = self._snapshot()
        self._listed = after
        if before[0] != after[0]:
            await self._broadcast("tools")
        if before[1:3] != after[1:3]:
            await self._broadcast("resources")
        if before[3] != after[3]:
            await self._broadcast("prompts")

    async def _broadcast(self, what: str) -> None:
        event = {"tools": ToolsListChanged, "resources": ResourcesListChanged, "prompts": PromptsListChanged}[what]
        try:
            await self.notices.bus.publish(event())
        except Exception:
            log.exception("publishing %s change to 2026-era hosts failed", what)
        for sid, session in self.hosts.items():
            try:
                await getattr(session, f"send_{what[:-1]}_list_changed")()
            except Exception as exc:  # a host that went away
                log.debug("dropping host %s: %s", sid, exc)
                self.hosts.pop(sid, None)

    # -- the front server -----------------------------------------------------------------

    def instructions(self) -> str:
        names = ", ".join(self.upstreams) or "no servers"
        text = (
            f"mcp-context-gateway fronts these MCP servers: {names}. Their tools are named "
            f"<server>{self.settings.gateway.separator}<tool>."
        )
        mode = self.settings.gateway.tool_mode
        if mode == "catalog":
            text += " Catalog mode: find upstream tools with tool_search, read tool_schema, call with tool_call."
        elif mode == "auto":
            text += (
                " Tool mode auto: if only tool_search/tool_schema/tool_call are listed, the upstream tools "
                "are behind that catalog (their definitions would take over 1/4 of the window)."
            )
        if self.own_tools:
            text += " Large results are saved to files and replaced by a fileRef; call context_guide for the workflow."
        return text

    def _build_server(self) -> GatewayServer:
        server = GatewayServer(
            "mcp-context-gateway",
            version="0.1.0",
            instructions=self.instructions(),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_subscriptions_listen=self.notices.listen,
            on_subscribe_resource=self.notices.subscribe,
            on_unsubscribe_resource=self.notices.unsubscribe,
            on_completion=self._complete,
            on_set_logging_level=self.notices.set_logging_level,
            on_roots_list_changed=self.notices.on_roots_list_changed,
            get_tool_input_schema=self._tool_input_schema,
        )
        # The default OpenTelemetry middleware costs ~0.1 ms a request, measured (bench/proxy_overhead.py),
        # on a hop whose whole budget is about that; tracing stays available on the upstreams themselves.
        server.middleware = []
        return server

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        """The schema the SDK checks a 2026-era HTTP host's `Mcp-Param-*` headers against. Without it the
        SDK ran the whole `tools/list` for every call with arguments (and the usage figures counted a
        listing per call). None for a tool whose schema maps no argument to a header: no request's
        headers can fail its check, which walked the schema twice per call."""
        spec = self.local_tools.get(name)
        if spec is not None:  # the gateway's own tools: few calls, each far costlier than the walk
            return spec.tool.input_schema if maps_headers(spec.tool.input_schema) else None
        tool = self.routing.tools.get(name)
        return tool.input_schema if tool is not None and name in self.routing.header_tools else None

    def visible_tools(self, session_id: str | None = None, mode: str | None = None) -> list[types.Tool]:
        """What the host is shown: the gateway's own tools, the catalog meta-tools when any upstream is
        behind the catalog, then the upstream tools listed directly (in `mode`, if given)."""
        behind_catalog, direct = self.catalog_mode.listing(session_id, mode)
        meta = [spec.tool for spec in self.meta_tools.values()] if behind_catalog else []
        return [spec.tool for spec in self.own_tools.values()] + meta + direct

    async def listed_tools(self, session_id: str, mode: str | None = None) -> list[types.Tool]:
        return await self.pipeline.on_tools_listed(self.visible_tools(session_id, mode), session_id)

    def _record_listing(self, session_id: str, tools: list[types.Tool]) -> None:
        """A tools/list in the usage figures: the definitions' tokens, and in catalog mode the tokens of
        the definitions behind the catalog minus its meta-tools'."""
        key = (self.routing.version, tuple(t.name for t in tools))
        if key not in self._list_costs:
            shown = definition_tokens(tools)
            kept = 0
            if any(t.name in self.meta_tools for t in tools):
                names = {t.name for t in tools}
                hidden = [t for name, t in self.routing.tools.items() if name not in names]
                meta = [spec.tool for spec in self.meta_tools.values()]
                kept = max(0, definition_tokens(hidden) - definition_tokens(meta))
            if len(self._list_costs) > 64:
                self._list_costs.clear()
            self._list_costs[key] = (shown, kept)
        shown, kept = self._list_costs[key]
        self.stats.record(
            Row(session_id, "gateway", "tools/list", "list", False, 0, shown, kept, "catalog" if kept else "")
        )

    def _record_call(self, call: ToolCall, result: types.CallToolResult, reply: types.CallToolResult) -> None:
        """One call in the usage figures; what the pipeline took off the result counts as kept out."""
        try:
            before, after = call.cost_of(result), call.cost_of(reply)
            upstream = call.server is not None
            via = "gateway" if not upstream else ("catalog" if call.name in self.meta_tools else "direct")
            saved = max(0, before.tokens - after.tokens) if reply is not result else 0
            self.stats.record(
                Row(
                    session=call.session_id,
                    server=call.server or "gateway",
                    tool=call.tool if upstream else call.name,
                    via=via,
                    error=bool(reply.is_error),
                    result_bytes=before.size if upstream else 0,
                    tokens_returned=after.tokens,
                    tokens_saved=saved,
                    saved_by="offload" if saved else "",
                    ms=(time.monotonic() - call.started) * 1000,
                )
            )
        except Exception:  # the figures never fail a call
            log.exception("recording usage of %s failed", call.name)

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        sid = self._remember_host(ctx)
        await self.wait_ready()
        listed = await self.listed_tools(sid)
        if not (params and params.cursor):
            self._record_listing(sid, listed)
        tools, cursor = _page(listed, params.cursor if params else None)
        return types.ListToolsResult(tools=tools, next_cursor=cursor)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        sid = self._remember_host(ctx)
        if params.request_state is not None and is_modern(ctx.session):  # a 2026 host answering our questions
            return await self._resume(ctx, params)
        arguments = params.arguments if isinstance(params.arguments, dict) else {}
        call = ToolCall(
            name=params.name,
            arguments=arguments,
            session_id=sid,
            report_progress=ctx.session.report_progress,
            host_session=ctx.session,
            request_id=ctx.request_id,
            meta=forwardable_meta(params.meta),
            namespace=namespace_of(ctx),
        )
        if is_modern(ctx.session) and self._tg is not None:
            return await self._run_modern_call(call)
        return await self._run_call(call)

    async def _run_modern_call(self, call: ToolCall) -> Any:
        """A call of a 2026-era host (the SDK's path and the lean one): an upstream's question cannot be sent
        to it, so it becomes an `input_required` answer; the upstream call runs on in the background."""
        exchange = self.exchanges.new(call.namespace)
        exchange.call, call.exchange = call, exchange
        # a plain asyncio task (an anyio task group's start_soon costs ~40 us, a sixth of such a call's
        # overhead); it ends with its exchange's scope, cancelled when the host gives up or leaves
        spawn(self._exchange_tasks, self._run_exchange(exchange, call))
        return await self._next(exchange, call)

    async def run_modern_lean(self, call: ToolCall) -> Any:
        """`_run_modern_call` for a lean caller that waits (the HTTP front): no task runs the upstream call
        (`_start_lean_modern`); its result, or its first question, is awaited here."""
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def settle(value: Any) -> bool:
            if outcome.done():  # given up meanwhile: nobody to ask
                return False
            outcome.set_result(value)
            return True

        try:
            stop = self._start_lean_modern(call, settle, settle)
        except Exception:  # the task's path answers it (and says what failed)
            stop = None
        if stop is None:
            return await self._run_modern_call(call)
        try:
            result = await outcome
        except BaseException:  # the host gave up (before any answer reached it): the upstream call stops too
            stop()
            raise
        if isinstance(result, types.InputRequiredResult):
            try:  # written next: a question that cannot be (nested too deeply) ends the call here
                wire_result(call.host_session.protocol_version, result)
            except Exception:
                stop()
                raise
            return result
        return await self._finish(call, result)

    async def _run_call(self, call: ToolCall) -> types.CallToolResult:
        """A call of a handshake-era host, start to end (the SDK's path and the lean one)."""
        return await self._finish(call, await self._guarded_call(call))

    async def _guarded_call(self, call: ToolCall) -> types.CallToolResult:
        try:
            return await self.call(call)
        except RecursionError:  # arguments nested nearly as deep as the parser goes: they cannot be sent on
            log.warning("tool %s: its arguments are nested too deeply to send on", call.name)
            return error_result(
                f"'{call.name}' was not called: its arguments are nested too deeply to send on (about 1,000 "
                "levels); flatten them"
            )
        except Exception as exc:
            log.exception("tool %s failed inside the gateway", call.name)
            return error_result(
                f"The gateway failed while handling '{call.name}': {exc}. This is a bug; "
                "the gateway keeps serving. Try again or use another tool."
            )

    async def _run_exchange(self, exchange: Exchange, call: ToolCall) -> None:
        with exchange.scope:
            await exchange.finish(await self._guarded_call(call))
        if exchange.evicted is not None and exchange.finished_at is None:  # closed by the quota: still answered
            await exchange.finish(error_result(exchange.evicted))

    async def _next(self, exchange: Exchange, call: ToolCall) -> Any:
        """The call's next question (the exchange stays open) or its result, through the pipeline."""
        exchange.busy = True
        try:
            outcome = await exchange.next_outcome()
        except anyio.get_cancelled_exc_class():
            exchange.busy = False
            if not exchange.waiting:  # the host gave up before any question: the upstream call stops too
                exchange.cancel()
                self.exchanges.close(exchange)
            else:  # left open for the retry: a result that came meanwhile is kept for it
                self.exchanges.kept(exchange)
            raise
        finally:
            exchange.busy = False
        if isinstance(outcome, types.InputRequiredResult):
            self.exchanges.kept(exchange)  # left open for the retry: a result that came meanwhile is kept
            return outcome
        self.exchanges.close(exchange)
        return await self._finish(call, outcome)

    async def _resume(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        """The retry of a call that answered `input_required`: its answers go to the waiting upstream."""
        exchange = self.exchanges.find(params.request_state or "", namespace_of(ctx))
        if exchange is None and self.exchanges.elsewhere(params.request_state or ""):
            raise MCPError(
                types.INVALID_PARAMS,
                "this requestState was issued by another gateway process (a replica behind the same address, or "
                "this one before a restart), which holds the round: send the retry there (a load balancer sticky "
                "per client does) or call the tool again without requestState",
            )
        if exchange is None or exchange.call is None or exchange.call.name != params.name:
            raise MCPError(types.INVALID_PARAMS, "Invalid or expired requestState: call the tool again without it")
        if exchange.busy:  # one retry at a time: a second would wait for an outcome that goes to the first
            raise MCPError(
                types.INVALID_PARAMS,
                "this requestState is being answered by another retry already; wait for its result",
            )
        # a round closed by the quota (or a call that finished meanwhile) asks nothing: its outcome answers
        asks = exchange.evicted is None and exchange.finished_at is None
        if asks and (problem := exchange.answer(params.input_responses)):
            raise MCPError(types.INVALID_PARAMS, f"{params.name}: {problem}")
        return await self._next(exchange, exchange.call)

    def _finish_now(self, call: ToolCall, result: types.CallToolResult) -> Any:
        """`_finish` without waiting, for the lean path: the reply, when every plugin decided at once
        (the caller records the usage figures once it is written); else `_finish` for the rest of
        them, to be awaited."""
        if spill.pending():  # long texts still on disk: `_finish` restores them
            return self._finish(call, result)
        reply, stopped = self.pipeline.on_tool_result_now(call, result)
        if stopped < len(self.pipeline.plugins):
            return self._finish(call, result, reply, stopped)
        return reply

    async def _finish(
        self, call: ToolCall, result: types.CallToolResult, partial: types.CallToolResult | None = None, start: int = 0
    ) -> Any:
        """The pipeline (offload, monitor), the usage figures, and long texts restored from disk.
        `partial`: the result after the plugins before the `start`-th ran (`_finish_now`)."""
        try:
            reply = await self.pipeline.on_tool_result(call, result if partial is None else partial, start)
            if spill.pending():
                self._record_call(call, result, reply)
            else:  # after the answer is written (the next turn of the loop), off the caller's wait
                asyncio.get_running_loop().call_soon(self._record_call, call, result, reply)
            # long texts still on disk (no plugin took them) go out as text
            return await anyio.to_thread.run_sync(spill.restore, reply) if spill.pending() else reply
        finally:
            if spill.pending():  # the spilled files of this call are settled: remove them
                spill.release(result)

    def _start_lean(self, call: ToolCall, done: Callable[[types.CallToolResult], Any]) -> Callable[[], None] | None:
        """`call` without waiting, for the lean path: routed and written to its upstream at once
        (`Upstream.start_lean`); None when `call` must decide: an own tool, a tool not served as
        listed, an upstream still starting, arguments it refuses."""
        route = None if call.name in self.local_tools else self.routing.tool_routes.get(call.name)
        if route is None:
            return None
        upstream = self.routing.upstream_for(route)
        if not upstream.ready.is_set() or self._refusal(call) is not None:
            return None
        call.server, call.tool = route.server, route.name
        host = (call.host_session, call.request_id)
        return upstream.start_lean(
            route.name, call.arguments, call.meta, done, host, exchange=call.exchange, namespace=call.namespace
        )

    def _start_lean_modern(
        self,
        call: ToolCall,
        done: Callable[[types.CallToolResult], Any],
        asked: Callable[[types.InputRequiredResult], bool],
    ) -> Callable[[], None] | None:
        """`_start_lean` for a 2026-era host: its exchange is opened as `_run_modern_call` opens it, but
        no task waits on it. The result goes to `done` as a 2025-era call's does, unless the upstream
        asked first: its first question goes to `asked` (the host's answer, `input_required`) and from
        then on the call is an exchange like any other (the result waits for the host's retry)."""
        exchange = self.exchanges.new(call.namespace)
        exchange.call, call.exchange = call, exchange

        def finished(result: types.CallToolResult) -> None:
            exchange.halt = None  # the upstream call is over
            if exchange.handover is None:  # a question answered the host's call: the retry takes the result
                exchange.finish_now(result)
                return
            exchange.handover = None
            self.exchanges.close(exchange)
            done(result)

        exchange.handover = asked
        cancel = None
        try:
            cancel = self._start_lean(call, finished)
        finally:
            if cancel is None:  # not started (or it raised): the task's path makes the call, and its exchange
                self.exchanges.close(exchange)
                exchange.handover, call.exchange = None, None
        if cancel is None:
            return None
        exchange.halt = cancel

        def stop() -> None:  # the host cancelled its call (or left) before any question reached it
            exchange.cancel()
            self.exchanges.close(exchange)

        return stop

    async def call(self, call: ToolCall) -> types.CallToolResult:
        """Run a tool by its host-facing name (own tool or upstream); fills in `call.server`/`call.tool`."""
        spec = self.local_tools.get(call.name)
        if spec is not None:
            return await spec.handler(call)
        route = await self._after_start(lambda: self.routing.tool_routes.get(call.name))
        if route is None:
            return error_result(self._unknown_tool(call.name))
        call.server, call.tool = route.server, route.name
        if (refusal := self._refusal(call)) is not None:
            return error_result(refusal)
        upstream = self.routing.upstream_for(route)
        return await upstream.call_tool(
            route.name,
            call.arguments,
            call.meta,
            call.report_progress,
            host=(call.host_session, call.request_id),
            exchange=call.exchange,
            lean=call.lean,
            namespace=call.namespace,
        )

    def _refusal(self, call: ToolCall) -> str | None:
        """Why a routed call must not reach its upstream, or None."""
        if self.routing.frozen and (change := self.routing.changed.get(call.name)):
            route = self.routing.tool_routes.get(call.name)
            server = route.server if route is not None else "SERVER"
            return (
                f"'{call.name}' was not called: {change} since it was first seen, and freeze_definitions is on, so "
                "the gateway keeps serving the first definition and refuses the changed tool. If the change is "
                f"expected, {self.routing.ledger.how_to_accept(server)} and restart the gateway."
            )
        if (where := unencodable(call.arguments)) is not None:
            # a lone surrogate cannot be written to the upstream as UTF-8; sent, it would tear down the
            # connection and every other call in flight on it
            return (
                f"'{call.name}': argument `{where}` holds text that is not valid Unicode (a lone surrogate such "
                "as \\ud800); send it as valid UTF-8 text. Nothing was sent to the server."
            )
        return None

    def _unknown_tool(self, name: str) -> str:
        server, sep, _ = name.partition(self.settings.gateway.separator)
        if sep and server in self.upstreams and self.upstreams[server].state != "ok":
            return self.upstreams[server].unavailable()
        return f"Unknown tool '{name}'. List the tools again (the upstream set may have changed)."

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        self._remember_host(ctx)
        await self.wait_ready()
        items, cursor = _page(self.routing.resources(), params.cursor if params else None)
        return types.ListResourcesResult(resources=items, next_cursor=cursor)

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> Any:
        await self.wait_ready()
        items, cursor = _page(self.routing.resource_templates(), params.cursor if params else None)
        return types.ListResourceTemplatesResult(resource_templates=items, next_cursor=cursor)

    async def _read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
        if str(params.uri).startswith(RESPONSE_SCHEME):
            return await anyio.to_thread.run_sync(self._read_response, str(params.uri), namespace_of(ctx))
        route = await self._after_start(lambda: self.routing.resource_route(params.uri))
        if route is None:
            raise MCPError(
                types.INVALID_PARAMS,
                f"Unknown resource {params.uri!r}: gateway resource URIs look like '<server>{URI_SEP}<uri>'; "
                "list resources to see them.",
            )
        upstream = self.routing.upstream_for(route)
        result = await upstream.request(
            types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=route.name)),
            types.ReadResourceResult,
            f"resources/read {route.name}",
            namespace_of(ctx),
        )
        if route.name == str(params.uri):  # asked by the server's own URI: answered the same way
            return result
        contents = [c.model_copy(update={"uri": f"{route.server}{URI_SEP}{c.uri}"}) for c in result.contents]
        return result.model_copy(update={"contents": contents})

    async def _complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> Any:
        """completion/complete for a prompt argument or a resource template, asked of the server that owns it."""
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            route = await self._after_start(lambda: self.routing.prompt_routes.get(ref.name))
            inner: Any = ref.model_copy(update={"name": route.name}) if route else None
        else:
            route = await self._after_start(lambda: self.routing.resource_route(ref.uri))
            inner = ref.model_copy(update={"uri": route.name}) if route else None
        if route is None:
            raise MCPError(types.INVALID_PARAMS, "Unknown prompt or resource template; list them to see the names.")
        upstream = self.routing.upstream_for(route)
        if not upstream.declares("completions"):
            return types.CompleteResult(completion=types.Completion(values=[]))
        # the host's `_meta` minus its 2026 envelope: the upstream session speaks its own era
        inner_params = params.model_copy(update={"ref": inner, "meta": forwardable_meta(params.meta) or None})
        request = types.CompleteRequest(params=inner_params)
        return await upstream.request(request, types.CompleteResult, "completion/complete", namespace_of(ctx))

    def _read_response(self, uri: str, namespace: str) -> types.ReadResourceResult:
        """A piece of an offloaded result (`gateway-response://resp_x?offset=N&length=M`, 64 KB by default);
        `_meta` gives the piece's range, the file's size and the next piece's URI."""
        rid, _, query = uri.removeprefix(RESPONSE_SCHEME).partition("?")
        args = dict(parse_qsl(query))
        try:
            offset, length = int(args.get("offset", 0)), int(args.get("length", PIECE_BYTES))
            path = self.context.responses_for(namespace).resolve(rid)
        except ValueError:
            raise MCPError(types.INVALID_PARAMS, f"{uri!r}: offset and length are byte counts") from None
        except StoreError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        data, start, end = read_piece(path, offset, length)
        size = path.stat().st_size
        meta: dict[str, Any] = {"offset": start, "length": end - start, "size": size}
        if end < size:
            meta["next"] = response_uri(rid, end)
        kind = saved_kind(path)
        if kind == "binary":
            contents: Any = types.BlobResourceContents(uri=uri, blob=base64.b64encode(data).decode(), _meta=meta)
        else:
            mime = "application/json" if kind == "json" else "text/plain"
            text = data.decode("utf-8", "replace")
            contents = types.TextResourceContents(uri=uri, text=text, mime_type=mime, _meta=meta)
        return types.ReadResourceResult(contents=[contents])

    async def _list_prompts(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await self.wait_ready()
        items, cursor = _page(list(self.routing.prompts.values()), params.cursor if params else None)
        return types.ListPromptsResult(prompts=items, next_cursor=cursor)

    async def _get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
        route = await self._after_start(lambda: self.routing.prompt_routes.get(params.name))
        if route is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt {params.name!r}; list prompts to see them.")
        return await self.routing.upstream_for(route).request(
            types.GetPromptRequest(params=types.GetPromptRequestParams(name=route.name, arguments=params.arguments)),
            types.GetPromptResult,
            f"prompts/get {route.name}",
            namespace_of(ctx),
        )
