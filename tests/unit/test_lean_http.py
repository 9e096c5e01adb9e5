"""The HTTP front's lean path, its pure parts: which bodies it reads for itself, which hosts it leaves
to the SDK, and that what it read reaches the SDK whole when it does not take a request."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings

import gateway.proxy.lean_http as lean_http
from gateway.compat import http_request_in_flight, http_session_transport
from gateway.proxy.lean_http import MAX_BODY, LeanHttpFront, _body, _may_ask, _message

pytestmark = pytest.mark.anyio

CALL = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"p__echo","arguments":{"text":"\\u00e9"}}}'


def test_only_one_json_rpc_message_of_its_own_methods_is_read() -> None:
    assert _message(CALL) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "p__echo", "arguments": {"text": "é"}},
    }
    cancel = b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}'
    assert _message(cancel) is not None
    left = [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',  # not a call
        b"[" + CALL + b"]",  # a batch
        CALL.replace(b'"2.0"', b'"1.0"'),
        CALL[:-1] + b',"extra":1}',  # a field beyond the envelope: the SDK judges it
        CALL[:-2],  # broken JSON: the SDK's parse error
        CALL.replace(b"\\u00e9", b"\\ud800"),  # a lone surrogate's escape: the SDK's parser refuses it
        CALL.replace(b"\\u00e9", b"\\uDBFF"),
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + b"[" * 5000 + b"]" * 5000 + b"}",
    ]
    assert [_message(body) for body in left] == [None] * len(left)


def test_hosts_that_may_be_asked_questions_are_told_apart() -> None:
    class Session:
        def __init__(self, caps: types.ClientCapabilities | None):
            self.client_capabilities = caps

    assert not _may_ask(Session(types.ClientCapabilities()))
    assert not _may_ask(Session(types.ClientCapabilities(roots=types.RootsCapability(list_changed=True))))
    assert _may_ask(Session(types.ClientCapabilities(elicitation=types.ElicitationCapability())))
    assert _may_ask(Session(types.ClientCapabilities(sampling=types.SamplingCapability())))
    assert _may_ask(Session(None))  # not known: as if it may


async def _replayed(events: list[dict[str, Any]]) -> tuple[bytes | None, list[dict[str, Any]]]:
    source = list(events)

    async def receive() -> dict[str, Any]:
        return source.pop(0)

    body, replay = await _body(receive)
    return body, [await replay() for _ in events]


async def test_a_body_read_is_replayed_whole_to_the_sdk() -> None:
    parts = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"c"}]
    assert await _replayed(parts) == (b"abc", parts)
    big = [{"type": "http.request", "body": b"x" * MAX_BODY, "more_body": True}] * 2 + [{"type": "http.request"}]
    assert await _replayed(big) == (None, big)  # over the limit: given on to the SDK as it was read
    gone = [{"type": "http.request", "body": b"a", "more_body": True}, {"type": "http.disconnect"}]
    assert await _replayed(gone) == (None, gone)


async def test_a_lean_call_holds_its_session_as_the_sdks_own_requests_do() -> None:
    """The SDK's transport ends a session after `idle_timeout` with no request in flight: a call served
    beside it stops that countdown while it runs and starts it again after (as `handle_request` does)."""
    transport = StreamableHTTPServerTransport(mcp_session_id="s1", idle_timeout=60)
    async with transport.connect():
        manager = type("Manager", (), {"_server_instances": {"s1": transport}})()
        assert http_session_transport(manager, "s1") is transport and http_session_transport(manager, "s2") is None
        assert transport.idle_scope is not None
        with http_request_in_flight(transport), http_request_in_flight(transport):
            assert transport.idle_scope.deadline == math.inf
        assert 59 < transport.idle_scope.deadline - anyio.current_time() <= 60
        transport.idle_scope.cancel()  # the idle period ran out: the SDK answers its requests now
        assert http_session_transport(manager, "s1") is None


ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}
MODERN_CALL = {
    "jsonrpc": "2.0",
    "id": 5,
    "method": "tools/call",
    "params": {"name": "p__slow", "arguments": {}, "_meta": ENVELOPE},
}


def _front(run_modern: Any) -> Any:
    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("handed to the SDK")

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return LeanHttpFront(sdk, None, security, lambda sid: None, None, run_modern, lambda name: None, None)  # type: ignore[arg-type]


def _receive(body: bytes, then: Any) -> Any:
    """An ASGI `receive` giving the request's body, then whatever `then` gives."""
    given = [{"type": "http.request", "body": body}]

    async def receive() -> dict[str, Any]:
        return given.pop() if given else await then()

    return receive


def _scope(body: bytes) -> dict[str, Any]:
    headers = {
        b"content-type": b"application/json",
        b"accept": b"application/json, text/event-stream",
        b"content-length": str(len(body)).encode(),
        b"mcp-protocol-version": b"2026-07-28",
        b"mcp-method": b"tools/call",
        b"mcp-name": b"p__slow",
    }
    return {"type": "http", "method": "POST", "path": "/mcp", "headers": list(headers.items()), "query_string": b""}


async def test_a_2026_call_running_long_is_answered_on_an_event_stream_with_pings(monkeypatch: Any) -> None:
    """As the SDK's single-exchange handler does: past its keep-alive interval the answer is committed
    to `text/event-stream` and pinged, so a proxy's idle timeout cannot cut the call."""
    monkeypatch.setattr(lean_http, "KEEPALIVE", 0.02)
    release = anyio.Event()
    sent: list[dict[str, Any]] = []

    async def run_modern(call: Any) -> types.CallToolResult:
        await release.wait()
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"done {call.name}")])

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if sum(m.get("body") == b": ping\r\n\r\n" for m in sent) >= 2:
            release.set()

    body = json.dumps(MODERN_CALL).encode()

    async def never() -> dict[str, Any]:  # the host stays connected
        await anyio.sleep_forever()
        raise AssertionError

    with anyio.fail_after(10):
        await _front(run_modern)(_scope(body), _receive(body, never), send)
    assert sent[0]["type"] == "http.response.start" and (b"content-type", b"text/event-stream") in sent[0]["headers"]
    event = sent[-1]["body"].decode()
    assert event.startswith("event: message\r\ndata: ") and event.endswith("\r\n\r\n")
    answer = json.loads(event.split("data: ", 1)[1])
    assert answer["id"] == 5 and answer["result"]["content"][0]["text"] == "done p__slow"
    assert not sent[-1].get("more_body")


async def test_a_2026_host_that_disconnects_cancels_its_call_and_gets_no_answer() -> None:
    started, cancelled = anyio.Event(), anyio.Event()
    sent: list[dict[str, Any]] = []

    async def run_modern(call: Any) -> types.CallToolResult:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError

    body = json.dumps(MODERN_CALL).encode()

    async def leaves() -> dict[str, Any]:  # once the call runs
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(10):
        await _front(run_modern)(_scope(body), _receive(body, leaves), send)
    assert cancelled.is_set() and sent == []


async def test_a_shutdown_cancel_that_comes_with_the_hosts_leaving_still_stops_the_request(monkeypatch: Any) -> None:
    """The guard cancels the request's task when the host leaves, and that cancel ends the call quietly;
    another one in the same turn of the loop (the server shutting down) must still reach the task."""
    body = json.dumps(MODERN_CALL).encode()
    watch = lean_http._Guard._watch

    async def and_shutdown(guard: Any) -> None:
        await watch(guard)
        guard.task.cancel("server shutting down")

    monkeypatch.setattr(lean_http._Guard, "_watch", and_shutdown)

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def run_modern(call: Any) -> types.CallToolResult:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("answered a host that left")

    request = asyncio.ensure_future(_front(run_modern)(_scope(body), _receive(body, gone), send))
    with anyio.fail_after(10):
        await asyncio.wait((request,))
    assert request.cancelled()
