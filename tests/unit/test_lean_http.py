"""The HTTP front's lean path, its pure parts: which bodies it reads for itself, which hosts it leaves
to the SDK, and that what it read reaches the SDK whole when it does not take a request."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from gateway.proxy.lean_http import MAX_BODY, _body, _may_ask, _message

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
    import math

    import anyio
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    from gateway.compat import http_request_in_flight, http_session_transport

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
