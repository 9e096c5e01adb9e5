"""The lean path on the HTTP front: a plain `tools/call` of a session-bound (handshake-era) HTTP host,
answered at the ASGI layer as `application/json`, beside the SDK's transport and server.

Through the SDK, each such POST opens memory streams, a task group and an SSE response on the way in
and out; here the body is read once, routed as `Gateway.call` routes it, and the answer written as the
SDK's server writes it (`lean.answered`). A server may answer any POST with JSON instead of SSE (the
Streamable HTTP transport leaves the choice to it), and the host's SDK reads either.

Only what the SDK would take the same way is taken; everything else is handed to it unchanged, body
and all: a request failing the SDK's checks (Host/Origin, Accept, Content-Type, a session it does not
hold), a 2026-era or unknown protocol version, a body over `MAX_BODY`, anything but one plain call
(`lean.plain_call`: progress asked for, a log level, more params), a host that has not spoken yet,
and a host that may be asked questions (sampling, elicitation) but holds no GET stream they could
reach it on (on this path a call has no SSE stream of its own; the SDK sends such questions on the
session's GET stream). The SDK's idle accounting holds the session while a call runs. The host's
`notifications/cancelled` stops the call, which is then answered `REQUEST_CANCELLED` as the SDK
answers a cancelled request of this era; the notification goes on to the SDK, which acknowledges it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.streamable_http import CONTENT_TYPE_JSON, REQUEST_CANCELLED, check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request

import gateway.compat as compat
from gateway.plugin import ToolCall
from gateway.proxy.host_sessions import NAMESPACE_SCOPE_KEY, forwardable_meta, is_modern
from gateway.proxy.lean import answered, plain_call
from gateway.proxy.stdio_lines import json_line

log = logging.getLogger("gateway.lean_http")

MAX_BODY = 1024 * 1024  # a larger body goes to the SDK (its own limit answers what is too large)
ENVELOPE = frozenset(("jsonrpc", "id", "method", "params"))
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
Host = Callable[[str], Any]  # the host's SDK session of an HTTP session id, once it has spoken
Run = Callable[[ToolCall], Awaitable[types.CallToolResult]]


class LeanHttpFront:
    """ASGI: plain `tools/call` POSTs of session-bound hosts answered here, the rest by `app` (the SDK's)."""

    def __init__(self, app: Any, manager: Any, security: TransportSecuritySettings, host: Host, run: Run):
        self.app = app
        self.manager = manager
        self.security = TransportSecurityMiddleware(security)
        self.host = host
        self.run = run
        self._flights: dict[tuple[str, str | int], anyio.CancelScope] = {}  # (session, request id) -> its call

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        sid = headers.get(b"mcp-session-id", b"").decode("latin-1")
        version = headers.get(b"mcp-protocol-version")
        transport = compat.http_session_transport(self.manager, sid) if sid else None
        if transport is None or (version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS):
            await self.app(scope, receive, send)
            return
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = MAX_BODY + 1
        if length > MAX_BODY or not await self._acceptable(scope):
            await self.app(scope, receive, send)
            return
        body, replay = await _body(receive)
        message = _message(body) if body is not None else None
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
        call = ToolCall(
            name=params["name"],
            arguments=params.get("arguments") or {},
            session_id=sid,
            host_session=session,
            # no request stream of its own: an upstream's question goes on the session's GET stream
            request_id=None,
            meta=forwardable_meta(params.get("_meta")),
            namespace=str(scope.get(NAMESPACE_SCOPE_KEY) or ""),
            lean=True,  # no progress to relay: a stdio upstream gets it the lean way too
        )
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
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", CONTENT_TYPE_JSON.encode()), (b"mcp-session-id", sid.encode())],
            }
        )
        await send({"type": "http.response.body", "body": json_line(answer)})

    async def _acceptable(self, scope: dict[str, Any]) -> bool:
        """The SDK's checks of a POST, before its body is read: Host and Origin, Accept, Content-Type."""
        request = Request(scope)
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


def _may_ask(session: Any) -> bool:
    """Whether an upstream's question may be relayed to this host (it declared sampling or elicitation)."""
    caps = getattr(session, "client_capabilities", None)
    return caps is None or caps.sampling is not None or caps.elicitation is not None


def _message(body: bytes) -> dict[str, Any] | None:
    """One JSON-RPC message as the SDK would read it for this path, or None (the SDK reads it)."""
    if b'"tools/call"' not in body and b'"notifications/cancelled"' not in body:
        return None
    if b"\\u" in body and SURROGATE_ESCAPE.search(body):  # the SDK's parser refuses a lone one: it answers
        return None
    try:
        message = json.loads(body)
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
