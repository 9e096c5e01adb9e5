"""One upstream MCP server: start, initialize, supervise, reconnect, forward.

Each upstream has one long-lived owner task (`run`) that enters the transport and the
session and exits them itself (SDK pitfall 1). Other tasks only send requests.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from pydantic import ValidationError

import gateway.compat as compat
from gateway.progress import ProgressReporter, no_progress
from gateway.proxy.host_sessions import asks_nothing
from gateway.proxy.lean import Clock, Outcome, RawRequests, parse_result
from gateway.proxy.upstream_http import CONNECTIONS, SpoolingTransport
from gateway.proxy.upstream_lean_http import HttpRawRequests, relay
from gateway.proxy.upstream_spawn import Started, open_log
from gateway.proxy.upstream_stdio import linear_stdio_client
from gateway.results import error_result
from gateway.services.spill import Spiller
from gateway.settings import ConfigError, ServerConfig

log = logging.getLogger("gateway.upstream")

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 60.0  # a connection that lived this long resets the backoff
LOG_GRACE = 1.0  # s a call counts as in flight after its reply, for the log lines relayed behind it
# calls (and forwarded requests) one caller may have in flight on one HTTP upstream at once (of the
# CONNECTIONS the gateway opens to it), and the last places, which only a caller with nothing in flight
# there may take: so one caller's long calls, or two callers' at their shares, never hold every
# connection a third needs; more wait in turn (`_Places`)
CALLER_SHARE = 50
RESERVED = 10
CLIENT_INFO = types.Implementation(name="mcp-context-gateway", version="0.1.0")
SESSIONLESS_TOOLS = 64  # a server listing more tools (or in pages) keeps its calls on the session

PROCESS_EXITED = "the server process exited or closed its stdout"
EXITED_AT_START = "the server exited during start-up"
# stderr lines that never say why: npm's pointers to its own log and its generic advice
STDERR_BOILERPLATE = re.compile(
    r"complete log of this run|^npm (?:error|ERR!)(?: code \S+| 404)?\s*$|^npm (?:error|ERR!) 404 (?:Note that|tarball)"
    r"|^npm (?:notice|warn)",
    re.I,
)
State = Literal["starting", "ok", "failed", "stopped"]


class ConnectionLost(Exception):
    pass


class _Places:
    """Calls and forwarded requests in flight on one upstream, per caller (`held`), and who may start
    one. On an HTTP upstream (`limited`: CONNECTIONS per leg) a caller has at most CALLER_SHARE in
    flight, and one that has any takes none of the last RESERVED places, so a caller with nothing in
    flight finds one even while two others hold their shares. More wait in arrival order per caller; a
    place that comes free goes to a waiter of the caller whose call ended, else to the first waiter of
    another caller that may take it, the callers in turn."""

    def __init__(self, limited: bool) -> None:
        self.limited = limited
        self.held: Counter[str] = Counter()
        self.total = 0
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def _may_take(self, caller: str) -> bool:
        own = self.held[caller]
        return own < CALLER_SHARE and (own == 0 or self.total < CONNECTIONS - RESERVED)

    def has_room(self, caller: str) -> bool:
        return not self.limited or (caller not in self.waiting and self._may_take(caller))

    def take(self, caller: str) -> None:
        self.held[caller] += 1
        self.total += 1

    def queue(self, caller: str) -> asyncio.Future[None]:
        """A waiter for `caller`'s next place: done once the place is taken for it."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(caller, deque()).append(waiter)
        return waiter

    def give_back(self, caller: str) -> None:
        self.held[caller] -= 1
        self.total -= 1
        if self.held[caller] <= 0:
            del self.held[caller]
        if self.waiting:
            self._hand_out(caller)

    def _hand_out(self, first: str) -> None:
        callers = [first, *(c for c in self.waiting if c != first)] if first in self.waiting else list(self.waiting)
        for caller in callers:
            queue = self.waiting[caller]
            while queue and self._may_take(caller):
                waiter = queue.popleft()
                if not waiter.done():
                    self.take(caller)
                    waiter.set_result(None)
            del self.waiting[caller]
            if queue:  # still waiting: behind the others next time
                self.waiting[caller] = queue


@dataclass(eq=False)  # each call its own: found by identity (compared field by field, a landing among
class _InFlight:  # 5,000 calls in flight took 0.7 ms)
    host_session: Any
    request_id: Any
    scope: anyio.CancelScope | Clock  # the call's clock; both move by `deadline`
    timeout: float
    exchange: Any = None  # a 2026 host: its questions go out as `input_required` (proxy/exchanges.py)
    namespace: str = ""  # the token the call came with (whose logs the upstream sends meanwhile)
    questions: int = 0  # out at once, the clock stopped for them all

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The call's clock stopped while the host (a user, a model) answers an upstream's question; it
        starts again once the last question out is answered."""
        self.questions += 1
        self.scope.deadline = math.inf
        try:
            yield
        finally:
            self.questions -= 1
            if not self.questions:
                self.scope.deadline = anyio.current_time() + self.timeout

    async def ask_by_exchange(self, request: Any) -> Any:
        """Put an upstream's question to a 2026 host through the exchange, the call's clock paused."""
        with self.paused():
            return await self.exchange.ask(request)


def maps_headers(schema: Any) -> bool:
    """A tool's input schema names arguments a 2026-era call also sends as `Mcp-Param-*` headers."""
    return find_invalid_x_mcp_header(schema) is not None or bool(x_mcp_header_map(schema))


def sessionless_tools(tools: list[types.Tool], pages: int) -> frozenset[str]:
    """The tools whose calls may go to their server as 2026-era requests: none when the server pages its
    tools or lists many (the SDK's server builds that listing again for every such call with arguments,
    to check its Mcp-Param headers, unless it has a schema lookup of its own)."""
    if pages != 1 or len(tools) > SESSIONLESS_TOOLS:
        return frozenset()
    return frozenset(t.name for t in tools if _may_go_sessionless(t))


def _may_go_sessionless(tool: types.Tool) -> bool:
    """A tool whose calls may go to its server as 2026-era requests (`upstream_lean_http`): one its server
    declares read-only or idempotent, as a call made again on the session after it asked (or failed)
    there has run twice up to that point; and not one whose arguments go into headers too."""
    notes = tool.annotations
    safe = notes is not None and (notes.read_only_hint is True or notes.idempotent_hint is True)
    return safe and not maps_headers(tool.input_schema)


def _not_answered(what: str) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message=f"{what}: the host did not answer in time")


def describe(exc: BaseException) -> str:
    """One readable line for any failure, including nested ExceptionGroups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, httpx2.ConnectError):
        return f"cannot connect: {exc}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url}"
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."


class Upstream:
    def __init__(
        self,
        name: str,
        config: ServerConfig,
        log_dir: Path,
        on_change: Callable[[Upstream], Awaitable[None]] | None = None,
        spiller: Spiller | None = None,
        on_notice: Callable[[Upstream, Any], Awaitable[None]] | None = None,
        roots_host: Callable[[str | None], Any] | None = None,
        started: Started | None = None,
    ):
        self.name = name
        self._started = started  # its process, started ahead (`upstream_spawn.prestart`): the first attempt's
        self.on_notice = on_notice  # log messages and resource updates, relayed to the hosts
        # the host to ask for roots outside a call (the one that declared them; of a namespace, when given)
        self.roots_host = roots_host
        self.spiller = spiller  # long replies of a stdio or HTTP server are spooled to disk (bounded memory)
        self._spooling: SpoolingTransport | None = None  # an HTTP upstream's transport, while connected
        self._http_refused = 0  # the first 4xx status an HTTP upstream answered a POST with, this connection
        self.config = config
        self.log_path = log_dir / f"{name}.log"
        self.on_change = on_change
        self.state: State = "starting"
        self.error = ""
        self.session: ClientSession | None = None
        self.server_info: types.Implementation | None = None
        self.instructions: str | None = None
        self.tools: list[types.Tool] = []
        self.sessionless: frozenset[str] = frozenset()  # tools whose calls may go as 2026-era requests
        # tools that asked their client when called so: kept on the session (the HTTP leg's, per connection,
        # fills and reads it; held here so that it outlives the connection)
        self.asking: set[str] = set()
        self.resources: list[types.Resource] = []
        self.templates: list[types.ResourceTemplate] = []
        self.prompts: list[types.Prompt] = []
        self.restarts = 0
        self.stdout_noise = ""  # a line on stdout that is not JSON-RPC, while starting
        self.config_broken = False  # failed for a config error (`${VAR}` not set): restarting cannot help
        self.next_retry_at: float | None = None
        self.ready = anyio.Event()  # set after the first attempt, whatever its outcome
        self.finished = anyio.Event()  # set when the owner task has stopped the server
        self._stopping = False
        self._wake = anyio.Event()
        self._dead_reason = ""
        self._refresh = False
        self._log_mark = 0
        self._in_flight: dict[_InFlight, None] = {}  # oldest first
        self._places = _Places(bool(config.url))  # calls and forwarded requests in flight, per caller
        self._landed_at: dict[str, float] = {}  # namespace -> when its latest call here ended
        self._ping: tuple[anyio.CancelScope, float] | None = None  # the health check in flight, its timeout
        # lean-path calls beside the SDK's session: written to a stdio pipe, or POSTed to a Streamable HTTP upstream
        self.raw: RawRequests | HttpRawRequests = RawRequests()

    @property
    def transport(self) -> str:
        return self.config.transport

    # -- signals from other tasks -------------------------------------------------------

    def _signal(self) -> None:
        self._wake.set()

    def mark_dead(self, reason: str) -> None:
        if not self._dead_reason:
            self._dead_reason = reason
        self._signal()

    def request_refresh(self) -> None:
        self._refresh = True
        self._signal()

    def stop(self) -> None:
        self._stopping = True
        self._signal()

    # -- the owner task -------------------------------------------------------------------

    async def run(self) -> None:
        backoff = BACKOFF_FIRST
        while not self._stopping:
            began = time.monotonic()
            try:
                await self._connect_and_serve()
            except ConfigError as exc:  # a `${VAR}` not set: no restart can fix that, only the config
                self.session = None
                await self._config_failed(str(exc))
                break
            except Exception as exc:  # includes ExceptionGroups from transport task groups
                reason = describe(exc)
                if reason.startswith("command not found"):  # say what to install
                    reason = self.config.command_problem() or reason
            else:
                reason = self._dead_reason or "connection closed"
            finally:
                self.session = None
            if self._stopping:
                break
            exited = reason.lower() in ("connection closed", PROCESS_EXITED)  # not a timeout or a refusal
            if self.state == "starting" and self.transport == "stdio" and exited:
                reason = EXITED_AT_START  # before it answered initialize
            if self.state == "starting":
                reason += self.stdout_note()
            if tail := self._stderr_tail():
                reason = f"{reason}; its stderr says: {tail}"
            if time.monotonic() - began > HEALTHY_AFTER:
                backoff = BACKOFF_FIRST
            self.state, self.error = "failed", reason
            self.next_retry_at = time.time() + backoff
            log.warning("upstream %s: %s; restarting in %.0f s (log: %s)", self.name, reason, backoff, self.log_path)
            self.ready.set()
            await self._notify()
            with anyio.move_on_after(backoff):
                while not self._stopping:
                    self._wake = anyio.Event()
                    await self._wake.wait()
            backoff = min(backoff * 2, BACKOFF_MAX)
            self.restarts += 1
        if self._started is not None:  # stopped before its first attempt
            started, self._started = self._started, None
            await started.aclose()
        self.state = "stopped"
        self.ready.set()
        self.finished.set()

    async def _config_failed(self, why: str) -> None:
        """Failed until the config changes (a reload replaces this upstream): no restart loop."""
        self.state, self.error, self.next_retry_at = "failed", f"fix the config: {why}", None
        self.config_broken = True
        log.warning("upstream %s: %s", self.name, self.error)
        self.ready.set()
        await self._notify()
        while not self._stopping:
            self._wake = anyio.Event()
            await self._wake.wait()

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        cfg = self.config.expanded()
        started, self._started = self._started, None
        if started is not None and started.config != cfg:  # configured otherwise since it was started
            await started.aclose()
            started = None
        if cfg.command:
            with started.errlog if started is not None else open_log(self.log_path) as errlog:
                self._log_mark = started.mark if started is not None else errlog.tell()
                async with linear_stdio_client(
                    cfg.command,
                    cfg.args,
                    cfg.env,
                    cfg.cwd or None,
                    errlog,
                    on_exit=self._on_stdout_closed,
                    on_bytes=self._heard,
                    spiller=self.spiller,
                    raw=self.raw,
                    process=started.process if started is not None else None,
                ) as streams:
                    yield streams
        else:
            self._spooling = SpoolingTransport(self.spiller, on_bytes=self._heard)
            self._http_refused = 0

            async def refused(response: httpx2.Response) -> None:
                if response.request.method == "POST" and 400 <= response.status_code < 500:
                    self._http_refused = self._http_refused or response.status_code

            def client(
                headers: dict[str, str] | None = None, timeout: Any = None, auth: httpx2.Auth | None = None
            ) -> httpx2.AsyncClient:
                # no read limit: a long call's response, or the SSE stream between two events, may be quiet for
                # long (the liveness ping notices a server that went away)
                return httpx2.AsyncClient(
                    headers=headers,
                    auth=auth,
                    timeout=httpx2.Timeout(30, read=None),
                    transport=self._spooling,
                    event_hooks={"response": [refused]},
                )

            if cfg.transport == "sse":  # the 2024-11-05 HTTP+SSE transport: a GET event stream, POSTs beside it
                compat.sse_client_events_unlimited()
                async with sse_client(cfg.url, headers=cfg.headers, httpx_client_factory=client) as streams:
                    yield streams
                return
            raw = HttpRawRequests(
                cfg.url,
                cfg.headers,
                self._spooling,
                self._heard,
                CLIENT_INFO.model_dump(mode="json", exclude_none=True),
                self.asking,
            )
            self.raw = raw
            sink, source = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            async with (
                client(cfg.headers) as http,
                streamable_http_client(cfg.url, http_client=http, max_sse_event_size=None) as (read, write),
                source,
                anyio.create_task_group() as tg,
            ):
                # the session reads the transport's messages through `sink`, where the lean leg puts the
                # messages it reads that are the session's (the server's questions and notifications)
                tg.start_soon(relay, read, sink)
                raw.attach(sink)
                try:
                    yield source, write
                finally:
                    raw.detach()
                    tg.cancel_scope.cancel()

    def _http_refusal(self) -> str | None:
        """Why an HTTP upstream refused the initialize POST (a 4xx, which the SDK reports only as an error
        response), with what to do; None when it did not."""
        status = self._http_refused
        if self.transport != "http" or not status:
            return None
        if status == 405 or urlparse(self.config.url).path.rstrip("/").endswith("/sse"):
            return (
                f"it answered HTTP {status} to a Streamable HTTP POST: it likely speaks only the older SSE "
                f'transport: set transport = "sse" in [servers.{self.name}]'
            )
        if status in (401, 403):
            return f"it answered HTTP {status} (not authorized): check the token in headers"
        return f"it answered HTTP {status} to a Streamable HTTP POST: check the url (it often ends in /mcp)"

    def _stderr_tail(self) -> str:
        """The most telling line the child wrote to stderr (the last that is not boilerplate such as npm's
        "A complete log of this run can be found in"), so a failed start explains itself."""
        if self.transport != "stdio" or not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(max(self._log_mark, self.log_path.stat().st_size - 4096))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        telling = [ln for ln in lines if not STDERR_BOILERPLATE.search(ln)] or lines
        return telling[-1][:200] if telling else ""

    def stdout_note(self) -> str:
        """What the server wrote to stdout that is not JSON-RPC (a banner), while starting: often why."""
        if not self.stdout_noise:
            return ""
        return f"; it wrote to stdout {self.stdout_noise} (an MCP server writes only JSON-RPC there, logs to stderr)"

    def _heard(self) -> None:
        """Bytes came from the server (any line, any part of one, any HTTP response bytes): it is alive. A
        ping waits behind the results queued before it on the pipe, so its deadline runs from the last
        bytes heard, not from when it was sent: a server busy sending a burst of large results is never
        taken for hung."""
        if self._ping is not None:
            scope, timeout = self._ping
            scope.deadline = asyncio.get_running_loop().time() + timeout

    def _on_stdout_closed(self) -> None:
        if not self._stopping:
            self.mark_dead(PROCESS_EXITED)

    async def _connect_and_serve(self) -> None:
        self._dead_reason, self._refresh, self.stdout_noise = "", False, ""
        self._wake = anyio.Event()
        self.state = "starting"
        async with (
            self._transport() as (read, write),
            ClientSession(
                read,
                write,
                message_handler=self._on_message,
                elicitation_callback=self._on_elicit,
                sampling_callback=self._on_sampling,
                list_roots_callback=self._on_roots,
                client_info=CLIENT_INFO,
            ) as session,
        ):
            try:
                with anyio.fail_after(self.config.init_timeout_seconds):
                    try:
                        init = await session.initialize()
                    except MCPError as exc:  # every MCP server answers initialize
                        if refusal := self._http_refusal():
                            raise ConnectionLost(refusal) from None
                        if exc.error.code != types.METHOD_NOT_FOUND:
                            raise
                        raise ConnectionLost(
                            "it does not speak MCP: it answered initialize with 'Method not found' (a program "
                            "that echoes its input, such as cat, sends the request back)"
                        ) from None
                    self.server_info, self.instructions = init.server_info, init.instructions
                    await self._list_all(session)
            except TimeoutError:
                raise ConnectionLost(
                    f"did not finish initialize and listing within {self.config.init_timeout_seconds:.0f} s "
                    "(a first npx run downloads packages: raise init_timeout_seconds)"
                ) from None
            self.session, self.state, self.error, self.next_retry_at = session, "ok", "", None
            awaits = functools.partial(compat.awaits_response, session)
            if isinstance(self.raw, HttpRawRequests):
                self.raw.session_ready()
            else:
                self.raw.sdk_awaits = awaits
            if self._spooling is not None:
                self._spooling.awaits = awaits
            log.info("upstream %s: ready, %d tools", self.name, len(self.tools))
            self.ready.set()
            await self._notify()
            await self._serve(session)

    async def _serve(self, session: ClientSession) -> None:
        interval = self.config.ping_seconds
        timeout = min(15.0, interval)
        next_ping = anyio.current_time() + interval
        while True:
            with anyio.move_on_after(max(0.0, next_ping - anyio.current_time())):
                await self._wake.wait()
            self._wake = anyio.Event()
            if self._stopping:
                return
            if self._dead_reason:
                raise ConnectionLost(self._dead_reason)
            if self._refresh:
                self._refresh = False
                await self._list_all(session)
                await self._notify()
            if anyio.current_time() >= next_ping:
                await self._health_check(session, timeout)
                next_ping = anyio.current_time() + interval

    async def _health_check(self, session: ClientSession, timeout: float) -> None:
        """A ping, answered within `timeout` of the last bytes the server sent (`_heard`)."""
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                self._ping = scope, timeout
                await session.send_ping()
        except MCPError as exc:
            if exc.error.code != types.METHOD_NOT_FOUND:
                raise ConnectionLost(f"ping failed: {exc.error.message}") from None
        finally:
            self._ping = None
        if scope.cancelled_caught:
            raise ConnectionLost(f"no answer to ping and no bytes from the server for {timeout:.0f} s (hung?)")

    async def _notify(self) -> None:
        if self.on_change is not None:
            try:
                await self.on_change(self)
            except Exception:
                log.exception("change callback failed for upstream %s", self.name)

    def declares(self, capability: str) -> bool:
        """Whether the running server declared a capability (`completions`, `logging`, `subscribe` for
        resource subscriptions, ...)."""
        caps = self.session.server_capabilities if self.session is not None and self.state == "ok" else None
        if capability == "subscribe":
            return caps is not None and caps.resources is not None and bool(caps.resources.subscribe)
        return caps is not None and getattr(caps, capability, None) is not None

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification | types.ResourceUpdatedNotification):
            if self.on_notice is not None:
                try:
                    await self.on_notice(self, message)
                except Exception:
                    log.exception("relaying %s from upstream %s failed", message.method, self.name)
            return
        if isinstance(
            message,
            types.ToolListChangedNotification
            | types.ResourceListChangedNotification
            | types.PromptListChangedNotification,
        ):
            self.request_refresh()
        elif isinstance(message, Exception):
            if self.state == "starting" and not self.stdout_noise:
                self.stdout_noise = describe(message).split(" (")[0]
            log.warning("upstream %s transport error: %s", self.name, describe(message))

    async def _list_all(self, session: ClientSession) -> None:
        caps = session.server_capabilities
        lists: dict[str, list[Any]] = {"tools": [], "resources": [], "resource_templates": [], "prompts": []}

        tool_pages = 0

        async def fill(kind: str, fetch: Callable[[Any], Awaitable[Any]]) -> None:
            lists[kind] = await _paginate(fetch, kind)

        async def tools_page(params: types.PaginatedRequestParams) -> types.ListToolsResult:
            nonlocal tool_pages
            tool_pages += 1
            return await _list_tools(session, params)

        async with anyio.create_task_group() as tg:  # at once: the first listing waits for the slowest
            if caps and caps.tools:
                tg.start_soon(fill, "tools", tools_page)
            if caps and caps.resources:
                tg.start_soon(fill, "resources", session.list_resources)
                tg.start_soon(fill, "resource_templates", session.list_resource_templates)
            if caps and caps.prompts:
                tg.start_soon(fill, "prompts", session.list_prompts)
        self.tools, self.resources = lists["tools"], lists["resources"]
        self.sessionless = sessionless_tools(self.tools, tool_pages)
        self.templates, self.prompts = lists["resource_templates"], lists["prompts"]

    # -- forwarding -------------------------------------------------------------------------

    def unavailable(self) -> str:
        retry = ""
        if self.next_retry_at is not None:
            retry = f"; the gateway restarts it in {max(0, self.next_retry_at - time.time()):.0f} s"
        if self.config_broken:
            return (
                f"Upstream server '{self.name}' cannot start: {self.error}. Retrying will not help until it is fixed."
            )
        state = "is still starting" if self.state == "starting" else f"is not available ({self.error})"
        return f"Upstream server '{self.name}' {state}{retry}. Try again shortly, or use another server's tools."

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None = None,
        progress: ProgressReporter = no_progress,
        timeout: float | None = None,
        host: tuple[Any, Any] = (None, None),
        exchange: Any = None,
        lean: bool = False,
        namespace: str = "",
    ) -> types.CallToolResult:
        """Forward a call; every failure comes back as an `isError` result naming this server. `lean`:
        written beside the SDK's session on a stdio upstream (`start_lean`), for a caller that relays
        no progress."""
        session = self.session
        if session is None or self.state != "ok":
            return error_result(self.unavailable())
        timeout = timeout or self.config.timeout_seconds
        if lean:
            answer: asyncio.Future[types.CallToolResult] = asyncio.get_running_loop().create_future()
            cancel = self.start_lean(
                tool,
                arguments,
                meta,
                lambda r: answer.done() or answer.set_result(r),
                host,
                timeout,
                exchange,
                namespace,
            )
            if cancel is not None:
                try:
                    return await answer
                finally:
                    # the caller gave up (its cancellation cancels the future it awaited): the upstream hears a cancel
                    if not answer.done() or answer.cancelled():
                        cancel()
        counted = not self.has_room(namespace)
        if counted:
            began = anyio.current_time()
            if not await self._wait_for_room(namespace, timeout):
                return error_result(self._no_room(tool, timeout))
            timeout = max(1.0, timeout - (anyio.current_time() - began))  # the wait was part of its time
        scope = anyio.CancelScope(deadline=anyio.current_time() + timeout)
        flight = _InFlight(host[0], host[1], scope, timeout, exchange, namespace)
        self._took_off(flight, counted)
        try:
            return await self._forward(session, tool, arguments, meta, progress, scope, timeout)
        finally:
            self._landed(flight)

    def start_lean(
        self,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        done: Callable[[types.CallToolResult], Any],
        host: tuple[Any, Any] = (None, None),
        timeout: float | None = None,
        exchange: Any = None,
        namespace: str = "",
    ) -> Callable[[], None] | None:
        """`call_tool` on the lean path without waiting (`proxy/lean.py`): the request is written now
        and `done` gets the result once, as `call_tool` would return it (from the read callback that
        brought the reply, or the clock's timer); the caller relays no progress, but progress still
        resets the clock. Returns how to give the call up (the upstream hears a cancel and `done` is
        never called), or None when it cannot start without waiting: then use `call_tool`."""
        session = self.session
        if session is None or self.state != "ok" or not self.raw.ready or not self.has_room(namespace):
            return None
        timeout = timeout or self.config.timeout_seconds
        rid: str | None = None

        def end() -> None:
            clock.stop()
            self._landed(flight)

        def settle(outcome: Outcome | None) -> None:  # None: the clock ran out
            end()
            try:
                result = self._lean_result(session, tool, outcome, timeout)
            except Exception as exc:  # a bug; the caller still gets an answer
                log.exception("reading the result of %s failed", tool)
                result = error_result(
                    f"The gateway failed while reading the result of '{tool}' from '{self.name}': {exc}."
                )
            done(result)

        def expired() -> None:
            if rid is not None:
                self.raw.cancel(rid, "timed out")
            settle(None)

        def progressed() -> None:
            clock.deadline = asyncio.get_running_loop().time() + timeout

        def cancel() -> None:
            if clock.running:
                end()
                if rid is not None:
                    self.raw.cancel(rid)

        params: dict[str, Any] = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        if meta:
            params["_meta"] = meta
        clock = Clock(timeout, expired)
        flight = _InFlight(host[0], host[1], clock, timeout, exchange, namespace)
        try:
            if isinstance(self.raw, HttpRawRequests):
                sessionless = tool in self.sessionless and asks_nothing(host[0])
                rid = self.raw.start("tools/call", params, settle, progressed, sessionless)
            else:
                rid = self.raw.start("tools/call", params, settle, progressed)
        except BaseException:  # nothing was sent: no timer may later answer for it
            clock.stop()
            raise
        if rid is None:
            clock.stop()
            return None
        self._took_off(flight)
        return cancel

    def _lean_result(
        self, session: ClientSession, tool: str, outcome: Outcome | None, timeout: float
    ) -> types.CallToolResult:
        if outcome is None:
            return self._timed_out(tool, timeout)
        if isinstance(outcome, types.ErrorData):
            return error_result(self._call_failed(tool, MCPError(outcome.code, outcome.message, outcome.data)))
        try:
            return parse_result(session.protocol_version or "2025-11-25", outcome)
        except ValidationError as exc:
            return self._malformed(tool, exc)

    async def _forward(
        self,
        session: ClientSession,
        tool: str,
        arguments: dict[str, Any] | None,
        meta: dict[str, Any] | None,
        progress: ProgressReporter,
        scope: anyio.CancelScope,
        timeout: float,
    ) -> types.CallToolResult:
        """The request through the SDK's session, its progress relayed (progress resets the clock)."""

        async def relay(value: float, total: float | None, message: str | None) -> None:
            scope.deadline = anyio.current_time() + timeout
            await progress(value, total, message)

        with scope:
            request = types.CallToolRequest(
                params=types.CallToolRequestParams(name=tool, arguments=arguments, _meta=meta or None)
            )
            try:
                return await session.send_request(request, types.CallToolResult, progress_callback=relay)
            except MCPError as exc:
                return error_result(self._call_failed(tool, exc))
            except ValidationError as exc:
                return self._malformed(tool, exc)
        return self._timed_out(tool, timeout)

    def _malformed(self, tool: str, exc: ValidationError) -> types.CallToolResult:
        return error_result(
            f"Upstream server '{self.name}' returned a malformed result for '{tool}': "
            f"{exc.error_count()} schema errors (first: {exc.errors()[0]['msg']})."
        )

    def _timed_out(self, tool: str, timeout: float) -> types.CallToolResult:
        return error_result(
            f"Upstream server '{self.name}' did not answer '{tool}' within {timeout:.0f} s (no progress either); "
            "the call was cancelled. Retry with smaller input, or raise timeout_seconds for this server."
        )

    def _asker(self) -> tuple[_InFlight | None, str]:
        """The call an upstream's question belongs to, or why it cannot be told. A question carries no
        request id to tie it to a call: it is the latest call in flight when every call in flight on
        this upstream comes from one host; with calls of several hosts in flight (or another caller's
        forwarded request) it could be any of theirs, and a prompt about one caller's data must never
        reach another, so it is declined."""
        # who the calls belong to: a handshake-era host by its connection, a 2026-era one (each call its own
        # exchange) by its namespace, the token it came with
        hosts = {
            ("host", id(f.host_session)) if f.exchange is None else ("ns", f.exchange.namespace)
            for f in self._in_flight
        }
        if len(hosts) > 1:
            return None, (
                f"calls of {len(hosts)} different hosts are in flight on the shared server '{self.name}', and "
                "its question carries nothing that tells whose call asked, so the gateway declines it"
            )
        if len(self._places.held) > 1:  # another caller's resource read, prompt or completion is in flight too
            return None, (
                f"requests of {len(self._places.held)} different callers are in flight on the shared server "
                f"'{self.name}', and its question carries nothing that tells whose request asked, so the "
                "gateway declines it"
            )
        if not self._in_flight:
            return None, ""
        return next(reversed(self._in_flight)), ""

    async def _on_elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        """An upstream asks the user something during a call: ask the host that made the call (the most
        recent one in flight), with the call's clock paused while the user answers; else decline."""
        flight, unclear = self._asker()
        if unclear:
            log.warning("upstream %s: elicitation declined: %s", self.name, unclear)
            return types.ElicitResult(action="decline")
        if flight is not None and flight.exchange is not None:
            answer = await flight.ask_by_exchange(types.ElicitRequest(params=params))
            return answer if answer is not None else types.ElicitResult(action="decline")
        caps = getattr(flight.host_session, "client_capabilities", None) if flight else None
        if flight is None or caps is None or caps.elicitation is None:
            return types.ElicitResult(action="decline")
        try:
            with flight.paused():
                if isinstance(params, types.ElicitRequestURLParams):
                    return await flight.host_session.elicit_url(
                        params.message, params.url, params.elicitation_id, related_request_id=flight.request_id
                    )
                return await flight.host_session.elicit_form(
                    params.message, params.requested_schema, related_request_id=flight.request_id
                )
        except Exception as exc:  # the host cannot be asked (no back-channel, gone): the upstream hears no
            log.info("upstream %s: elicitation not forwarded: %s", self.name, describe(exc))
            return types.ElicitResult(action="decline")

    async def _on_sampling(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        """An upstream asks for an LLM completion during a call: ask the host that made the call (its
        clock paused meanwhile), as for elicitation; an error the upstream can read when that host
        does not offer sampling."""
        flight, unclear = self._asker()
        if unclear:
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"sampling declined: {unclear}")
        if flight is not None and flight.exchange is not None:
            answer = await flight.ask_by_exchange(types.CreateMessageRequest(params=params))
            return answer if answer is not None else _not_answered("sampling")
        caps = getattr(flight.host_session, "client_capabilities", None) if flight else None
        if flight is None or caps is None or caps.sampling is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message="sampling is not available: the host using this gateway does not offer it",
            )
        with flight.paused():
            request = types.CreateMessageRequest(params=params)
            return await self._send_to_host(flight.host_session, request, types.CreateMessageResult, "sampling", flight)

    async def _on_roots(self, context: Any) -> Any:
        """roots/list from the upstream: the host that made the call in flight, if any; else (servers ask
        right after initialize and after roots/list_changed, outside any call) the most recent host that
        declared roots. Declined with an error the upstream can read when that host has none."""
        flight, unclear = self._asker()
        if unclear:
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"roots declined: {unclear}")
        if flight is not None and flight.exchange is not None:
            answer = await flight.ask_by_exchange(types.ListRootsRequest())
            return answer if answer is not None else _not_answered("roots")
        # outside any call: the one host that declared roots, of the caller whose request is in flight if any
        namespace = next(iter(self._places.held)) if self._places.held else None
        host = flight.host_session if flight else (self.roots_host(namespace) if self.roots_host else None)
        caps = getattr(host, "client_capabilities", None)
        if host is None or caps is None or caps.roots is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="roots are not available: the host using this gateway has none"
            )
        return await self._send_to_host(host, types.ListRootsRequest(), types.ListRootsResult, "roots/list", flight, 30)

    async def _send_to_host(
        self,
        host: Any,
        request: Any,
        result_type: type[Any],
        what: str,
        flight: _InFlight | None,
        limit: float | None = None,
    ) -> Any:
        """An upstream's request sent on to a host (on the stream of the call in flight, if any); its error,
        or the failure to reach the host (gone, or not answering within `limit` seconds), as an error the
        upstream can read."""
        try:
            with anyio.fail_after(limit):
                return await host.send_request(
                    request,
                    result_type,
                    metadata=ServerMessageMetadata(related_request_id=flight.request_id) if flight else None,
                )
        except MCPError as exc:
            return exc.error
        except Exception as exc:
            log.info("upstream %s: %s not forwarded: %s", self.name, what, describe(exc))
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"{what} failed: {describe(exc)}")

    def _took_off(self, flight: _InFlight, counted: bool = False) -> None:
        """`counted`: its place was taken already (handed over while it waited, `_wait_for_room`)."""
        self._in_flight[flight] = None
        if not counted:
            self._places.take(flight.namespace)

    def _landed(self, flight: _InFlight) -> None:
        """A call ended: its namespace is still counted in flight for `LOG_GRACE` seconds."""
        if self._in_flight.pop(flight, 0) is None:
            self._namespace_landed(flight.namespace)

    def _namespace_landed(self, namespace: str) -> None:
        self._landed_at[namespace] = time.monotonic()
        self._places.give_back(namespace)

    def has_room(self, namespace: str) -> bool:
        """Whether a call of `namespace` may start now (`_Places`)."""
        return self._places.has_room(namespace)

    async def _wait_for_room(self, namespace: str, timeout: float) -> bool:
        """Wait in turn for a place: True once this call holds it (taken already), False when `timeout`
        passed first."""
        waiter = self._places.queue(namespace)
        try:
            with anyio.move_on_after(timeout):
                await waiter
        except BaseException:  # the caller gave up: a place handed over meanwhile goes on to the next
            if waiter.done() and not waiter.cancelled():
                self._places.give_back(namespace)
            waiter.cancel()
            raise
        if waiter.done() and not waiter.cancelled():
            return True
        waiter.cancel()  # timed out: skipped when places are handed over
        return False

    def _no_room(self, what: str, timeout: float) -> str:
        return (
            f"'{what}' was not sent to '{self.name}': the places for calls to it were taken ({CALLER_SHARE} at "
            f"most per caller, {CONNECTIONS} in all) and none came free within {timeout:.0f} s. Try again when "
            "your calls to it finish."
        )

    def namespaces_in_flight(self) -> set[str]:
        """The namespaces (tokens) whose calls to this upstream are running, or ended within `LOG_GRACE`
        seconds: a log line the server wrote before its reply may be relayed after the reply landed."""
        since = time.monotonic() - LOG_GRACE
        for namespace in [n for n, at in self._landed_at.items() if at < since]:
            del self._landed_at[namespace]
        return set(self._places.held) | set(self._landed_at)

    def hosts_in_flight(self) -> list[tuple[Any, Any, str]]:
        """(host session, request id, namespace) of the calls to this upstream still running."""
        return [(f.host_session, f.request_id, f.namespace) for f in self._in_flight if f.host_session is not None]

    async def roots_changed(self) -> None:
        """Tell the upstream the roots changed (it asks for them again)."""
        if self.session is not None and self.state == "ok":
            try:
                await self.session.send_notification(types.RootsListChangedNotification())
            except Exception as exc:
                log.info("upstream %s: roots/list_changed not sent: %s", self.name, describe(exc))

    def _call_failed(self, what: str, exc: MCPError) -> str:
        code, message = exc.error.code, exc.error.message
        if code == types.CONNECTION_CLOSED or "Session terminated" in message:
            self.mark_dead(message)
            return (
                f"Upstream server '{self.name}' went away during '{what}' ({message}). "
                "The gateway is restarting it; try again in a few seconds."
            )
        return f"Upstream server '{self.name}' answered '{what}' with error {code}: {message}"

    async def request(
        self, request: Any, result_type: type[Any], what: str, namespace: str | None = None, gated: bool = True
    ) -> Any:
        """Forward a non-tool request (resources, prompts); raises MCPError with a clear message.
        `namespace`: whose request it is, counted in flight meanwhile as a call's is (the server's log
        messages are that caller's, `namespaces_in_flight`), and waiting for a place as a call does
        unless not `gated` (a quick control request: a log level)."""
        session = self.session
        if session is None or self.state != "ok":
            raise MCPError(types.INTERNAL_ERROR, self.unavailable())
        if namespace is not None:
            if not gated or self.has_room(namespace):
                self._places.take(namespace)
            elif not await self._wait_for_room(namespace, self.config.timeout_seconds):
                raise MCPError(types.INTERNAL_ERROR, self._no_room(what, self.config.timeout_seconds))
        try:
            with anyio.fail_after(self.config.timeout_seconds):
                return await session.send_request(request, result_type)
        except MCPError as exc:
            raise MCPError(exc.error.code, self._call_failed(what, exc)) from None
        except TimeoutError:
            raise MCPError(
                types.REQUEST_TIMEOUT, f"Upstream server '{self.name}' did not answer {what} in time"
            ) from None
        finally:
            if namespace is not None:
                self._namespace_landed(namespace)


async def _list_tools(session: ClientSession, params: types.PaginatedRequestParams) -> types.ListToolsResult:
    """tools/list, tolerant of definitions the strict schema rejects (an `inputSchema` without `type`,
    common in older servers): one bad definition must not keep a whole server out."""
    try:
        return await session.list_tools(params=params)
    except ValidationError as exc:
        log.warning("tools/list did not fit the MCP schema (%s errors); repairing the definitions", exc.error_count())
    # The SDK validates every result against the schema; the raw page is repaired here the same way the
    # routing table repairs what it re-advertises.
    raw = await compat.send_raw_request(session, "tools/list", {"cursor": params.cursor} if params.cursor else None)
    tools = []
    for item in raw.get("tools") or []:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            continue
        schema = item.get("inputSchema") if isinstance(item.get("inputSchema"), dict) else {}
        item = {**item, "inputSchema": {**schema, "type": "object"}}
        try:
            tools.append(types.Tool.model_validate(item, by_name=False))
        except ValidationError as exc:
            log.warning("skipping tool %r: %s", item["name"], exc.errors()[0]["msg"])
    return types.ListToolsResult(tools=tools, next_cursor=raw.get("nextCursor"))


async def _paginate(method: Callable[..., Awaitable[Any]], field: str) -> list[Any]:
    """Every page of a list. A server that declares the capability but answers -32601 (it has no
    `resources/templates/list`, say) has an empty list, as for ping: never a reason to restart it."""
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(1000):  # a server that loops its cursor must not hang the gateway
        try:
            page = await method(params=types.PaginatedRequestParams(cursor=cursor))
        except MCPError as exc:
            if exc.error.code != types.METHOD_NOT_FOUND:
                raise
            log.info("upstream answered -32601 to its %s list: taken as empty", field)
            return items
        items += getattr(page, field)
        cursor = page.next_cursor
        if not cursor:
            break
    return items
