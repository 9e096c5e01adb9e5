"""The lean path on the HTTP front: a plain `tools/call` answered at the ASGI layer, beside the SDK's
transport and server, for hosts of both eras.

Through the SDK, a session-bound (handshake-era) host's POST opens memory streams, a task group and an
SSE response on the way in and out, and a 2026-era host's runs the SDK's whole server runner; here the
body is read once, routed as `Gateway.call` routes it, and the answer written as the SDK's server
writes it (`lean.answered`). A server may answer any POST with JSON instead of SSE (the Streamable
HTTP transport leaves the choice to it), and the hosts' SDKs read either.

Only what the SDK would take the same way is taken; everything else is handed to it unchanged, body
and all: a request failing the SDK's checks (Host/Origin, Accept, Content-Type, a session it does not
hold; for a 2026-era host its envelope, routing headers and `Mcp-Param-*` headers), an unknown
protocol version, a body over `MAX_BODY`, anything but one plain call (`lean.plain_call`: progress
asked for, a log level, a retry with answers, more params), a session-bound host that has not spoken
yet, and one that may be asked questions (sampling, elicitation) but holds no GET stream they could
reach it on (on this path a call has no SSE stream of its own; the SDK sends such questions on the
session's GET stream). The SDK's idle accounting holds a session while its call runs. A session-bound
host's `notifications/cancelled` stops the call, which is then answered `REQUEST_CANCELLED` as the
SDK answers a cancelled request of that era (the notification goes on to the SDK, which acknowledges
it); a 2026-era host cancels by closing the response stream, and a call of its that runs past
`KEEPALIVE` is answered on an SSE stream with pings meanwhile, as the SDK's single-exchange handler
does. An upstream's question to a 2026-era host becomes its `input_required` answer, as there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.streamable_http import CONTENT_TYPE_JSON, REQUEST_CANCELLED, check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request

import gateway.compat as compat
from gateway.plugin import ToolCall
from gateway.proxy.host_sessions import forwardable_meta, http_session_id, is_modern, scope_namespace
from gateway.proxy.lean import Modern, Stamp, answered, plain_call
from gateway.services.json_wire import line as json_line
from gateway.services.json_wire import strict_loads

log = logging.getLogger("gateway.lean_http")

MAX_BODY = 1024 * 1024  # a larger body goes to the SDK (its own limit answers what is too large)
ENVELOPE = frozenset(("jsonrpc", "id", "method", "params"))
# pydantic's JSON parser, the SDK's on this transport, refuses a body nested deeper than this (a parse
# error); msgspec reads ~1,000 levels: a body with more brackets than this (in strings too) is the SDK's
SDK_DEPTH = 200
KEEPALIVE = 15.0  # seconds before a 2026-era answer becomes an SSE stream with pings (the SDK's interval)
# seconds before a 2026-era call starts watching for its host leaving: a small call has its answer sooner,
# and a watch per call (a task, its cancel) was ~5 % of such a call's CPU; a host that left earlier is
# seen at once when the watch starts
WATCH_AFTER = 0.1
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]
Host = Callable[[str], Any]  # the host's SDK session of an HTTP session id, once it has spoken
Run = Callable[[ToolCall], Awaitable[types.CallToolResult]]
Schema = Callable[[str], Any]


class LeanHttpFront:
    """ASGI: plain `tools/call` POSTs (of hosts of both eras) answered here, the rest by `app` (the SDK's)."""

    def __init__(
        self,
        app: Any,
        manager: Any,
        security: TransportSecuritySettings,
        host: Host,
        run: Run,
        run_modern: Modern,
        schema: Schema,
        stamp: Stamp,
    ):
        self.app = app
        self.manager = manager
        self.security = TransportSecurityMiddleware(security)
        self.host = host
        self.run = run
        self.run_modern = run_modern
        self.schema = schema  # a tool's input schema, for a 2026 host's Mcp-Param headers
        self.stamp = stamp  # the gateway's serverInfo, as 2026-era results carry it
        self._flights: dict[tuple[str, str | int], anyio.CancelScope] = {}  # (session, request id) -> its call

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if version in MODERN_PROTOCOL_VERSIONS:
            await self._modern(scope, receive, send, headers)
            return
        transport = compat.http_session_transport(self.manager, sid) if sid else None
        if transport is None or (version and version not in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.app(scope, receive, send)
            return
        message, replay = await self._read(Request(scope), receive, headers)
        if message is None:
            await self.app(scope, replay, send)
            return
        if message.get("method") == "notifications/cancelled":
            self._cancel(sid, message.get("params"))
            await self.app(scope, replay, send)  # the SDK acknowledges it (and knows no such request)
            return
        params = plain_call(message) if message.get("method") == "tools/call" else None
        session = self.host(sid) if params is not None else None
        rid = message.get("id")
        if params is None or session is None or is_modern(session) or (sid, rid) in self._flights:
            await self.app(scope, replay, send)
            return
        if _may_ask(session) and not compat.http_session_listening(transport):
            await self.app(scope, replay, send)  # its questions could reach the host only on the POST's stream
            return
        call = self._call(params, session, sid, scope)
        answer: dict[str, Any] | None = None
        with compat.http_request_in_flight(transport), anyio.CancelScope() as flight:
            self._flights[(sid, rid)] = flight
            try:
                answer = await answered(rid, call.name, session, self.run(call))
            finally:
                self._flights.pop((sid, rid), None)
        if answer is None:  # cancelled by the host: answered as the SDK answers a cancelled request
            error = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
            answer = {"jsonrpc": "2.0", "id": rid, "error": error}
        await _json(send, 200, answer, [(b"mcp-session-id", sid.encode())])

    async def _modern(self, scope: dict[str, Any], receive: Any, send: Any, headers: dict[bytes, bytes]) -> None:
        """A 2026-era request (no session: each carries its envelope). Taken after the checks of the SDK's
        single-exchange handler; a host that closes the response stream cancels the call, and one that
        runs past `KEEPALIVE` seconds is answered on an SSE stream with pings meanwhile, as there."""
        request = Request(scope)
        message, replay = await self._read(request, receive, headers)
        params = plain_call(message) if message is not None and message.get("method") == "tools/call" else None
        if message is None or params is None:
            await self.app(scope, replay, send)
            return
        fields = request.headers
        route = None
        if find_duplicated_routing_header(fields.items()) is None:
            route = classify_inbound_request(message, headers=dict(fields))
        arguments = params.get("arguments") or {}
        schema = self.schema(params["name"]) if arguments or any(k.startswith(b"mcp-param-") for k in headers) else None
        if not isinstance(route, InboundModernRoute) or (
            schema is not None and validate_mcp_param_headers(schema, arguments, fields) is not None
        ):
            await self.app(scope, replay, send)  # the SDK tells the host what is wrong
            return
        session = Connection.from_envelope(route.protocol_version, route.client_info, route.client_capabilities)
        call = self._call(params, session, http_session_id(None, scope_namespace(scope)), scope)
        rid = message["id"]
        # the call runs in this task; what a long one needs (the host leaving, pings) starts only when it
        # is still running WATCH_AFTER seconds in (`_Guard`)
        guard = _Guard(receive, send, asyncio.current_task())
        timer = asyncio.get_running_loop().call_later(WATCH_AFTER, guard.start)
        try:
            answer = await answered(rid, call.name, session, self.run_modern(call), self.stamp)
        except asyncio.CancelledError:
            # the guard's own cancel (the host left, nobody to answer) ends the call quietly; any other
            # cancel that came with it goes on
            if not guard.left or guard.task.uncancel() > 0:
                raise
            return
        finally:
            timer.cancel()
            guard.stop()
        if guard.streaming:
            data = b"event: message\r\ndata: " + json_line(answer).rstrip(b"\n") + b"\r\n\r\n"
            await send({"type": "http.response.body", "body": data})
            return
        await _json(send, ERROR_CODE_HTTP_STATUS.get(answer.get("error", {}).get("code"), 200), answer)

    def _call(self, params: dict[str, Any], session: Any, sid: str, scope: dict[str, Any]) -> ToolCall:
        return ToolCall(
            name=params["name"],
            arguments=params.get("arguments") or {},
            session_id=sid,
            host_session=session,
            # no request stream of its own: an upstream's question goes on the session's GET stream (a
            # 2026-era host's becomes its input_required answer)
            request_id=None,
            meta=forwardable_meta(params.get("_meta")),
            namespace=scope_namespace(scope),
            lean=True,  # no progress to relay: a stdio upstream gets it the lean way too
        )

    async def _read(
        self, request: Request, receive: Any, headers: dict[bytes, bytes]
    ) -> tuple[dict[str, Any] | None, Any]:
        """The request's one JSON-RPC message of this path's methods, once it passed the SDK's checks of
        a POST; None otherwise. And a `receive` that gives the SDK whatever was read."""
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = MAX_BODY + 1
        if length > MAX_BODY or not await self._acceptable(request):
            return None, receive
        body, replay = await _body(receive)
        return (_message(body) if body is not None else None), replay

    async def _acceptable(self, request: Request) -> bool:
        """The SDK's checks of a POST, before its body is read: Host and Origin, Accept, Content-Type."""
        if await self.security.validate_request(request, is_post=True) is not None:
            return False
        has_json, has_sse = check_accept_headers(request)
        kinds = request.headers.get("content-type", "").split(";")[0].split(",")
        return has_json and has_sse and any(kind.strip() == CONTENT_TYPE_JSON for kind in kinds)

    def _cancel(self, sid: str, params: Any) -> None:
        rid = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(rid, (str, int)) and not isinstance(rid, bool):
            flight = self._flights.get((sid, rid))
            if flight is not None:
                flight.cancel()


async def _json(
    send: Any, status: int, answer: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json_line(answer)
    start = [(b"content-type", CONTENT_TYPE_JSON.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class _Guard:
    """What a 2026-era call still running after WATCH_AFTER seconds needs beside it: a host that closes
    the response stream cancels the call (at the upstream too: its task is cancelled, `left` says why),
    and past KEEPALIVE seconds the answer becomes an SSE stream with a ping every KEEPALIVE seconds
    (`streaming`: the call's own task then writes its answer as the stream's event), as the SDK's
    single-exchange handler does. A host gone while pinged stops the call too."""

    def __init__(self, receive: Any, send: Any, task: asyncio.Task[Any] | None) -> None:
        assert task is not None
        self.receive, self.send, self.task = receive, send, task
        self.left = False
        self.streaming = False
        self._running: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._running = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        """The call is over: no more pings; its answer (if any) is written after this, by its own task."""
        if self._running is not None:
            self._running.cancel()

    async def _watch(self) -> None:
        gone = asyncio.ensure_future(self._disconnect())
        try:
            wait = max(0.0, KEEPALIVE - WATCH_AFTER)
            while not (await asyncio.wait((gone,), timeout=wait))[0]:
                if not self.streaming:
                    await self.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                    # uvicorn's send waits for the buffer before it writes, never after, and the front's
                    # middlewares pass sends straight on: a `stop` cannot fall between the write and here
                    self.streaming = True
                await self.send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
                wait = KEEPALIVE
        except asyncio.CancelledError:
            raise
        except Exception:  # the host gone while pinged: the call stops with it
            pass
        finally:
            gone.cancel()
        self.left = True
        self.task.cancel()

    async def _disconnect(self) -> None:
        while (await self.receive()).get("type") != "http.disconnect":
            pass


def _may_ask(session: Any) -> bool:
    """Whether an upstream's question may be relayed to this host (it declared sampling or elicitation)."""
    caps = getattr(session, "client_capabilities", None)
    return caps is None or caps.sampling is not None or caps.elicitation is not None


def _message(body: bytes) -> dict[str, Any] | None:
    """One JSON-RPC message as the SDK would read it for this path, or None (the SDK reads it)."""
    if b'"tools/call"' not in body and b'"notifications/cancelled"' not in body:
        return None
    if body.count(b"[") + body.count(b"{") > SDK_DEPTH:  # maybe nested past what the SDK's parser reads
        return None
    try:  # what msgspec refuses (a lone surrogate, NaN, invalid UTF-8) the SDK's parser reads its way
        message = strict_loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not ENVELOPE.issuperset(message):
        return None
    return message


async def _body(receive: Any) -> tuple[bytes | None, Any]:
    """The request's body (None when over `MAX_BODY` or the client left), and a `receive` that gives
    the SDK what was read, then the rest."""
    read: list[dict[str, Any]] = []
    size, whole = 0, True
    while True:
        event = await receive()
        read.append(event)
        if event["type"] != "http.request":
            whole = False
            break
        size += len(event.get("body", b""))
        if size > MAX_BODY:
            whole = False
            break
        if not event.get("more_body"):
            break

    async def replay() -> Any:
        return read.pop(0) if read else await receive()

    body = b"".join(e.get("body", b"") for e in read) if whole else None
    return body, replay
