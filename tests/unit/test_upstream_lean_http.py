"""The HTTP leg (`proxy/upstream_lean_http`): its SSE reading (events as the SSE format defines them);
which calls may go sessionless, and how a 2026-era result is read as the session's."""

from __future__ import annotations

import mcp_types as types
from mcp.server.connection import Connection

from gateway.proxy.host_sessions import asks_nothing
from gateway.proxy.upstream import SESSIONLESS_TOOLS, maps_headers, sessionless_tools
from gateway.proxy.upstream_lean_http import _as_session_result, _Event


def _events(*lines: bytes) -> list[bytes]:
    event, out = _Event(), []
    for line in lines:
        if (data := event.feed(line)) is not None:
            out.append(data)
    return out


def test_an_event_is_taken_at_its_blank_line_with_its_data_lines_joined() -> None:
    assert _events(b'data: {"a":\n', b"data: 1}\n", b"\n") == [b'{"a":\n1}']
    assert _events(b'data:{"id":1}\r\n', b"\r\n") == [b'{"id":1}']  # CRLF, no space after the colon


def test_ids_comments_and_other_event_types_are_not_messages() -> None:
    lines = (b": keep-alive\n", b"id: 7\n", b'data: {"x":1}\n', b"\n", b"event: ping\n", b"data: {}\n", b"\n")
    assert _events(*lines) == [b'{"x":1}']
    assert _events(b"event: message\n", b'data: {"y":2}\n', b"\n") == [b'{"y":2}']


def test_a_blank_line_without_data_dispatches_nothing() -> None:
    assert _events(b"\n", b"id: 3\n", b"\n") == []


def test_only_a_2026_host_that_declared_no_questions_asks_nothing() -> None:
    def host(caps: types.ClientCapabilities, version: str = "2026-07-28") -> Connection:
        return Connection.from_envelope(version, None, caps)

    assert asks_nothing(host(types.ClientCapabilities()))
    assert asks_nothing(host(types.ClientCapabilities(experimental={"x": {}})))
    for caps in (
        types.ClientCapabilities(elicitation=types.ElicitationCapability()),
        types.ClientCapabilities(sampling=types.SamplingCapability()),
        types.ClientCapabilities(roots=types.RootsCapability()),
    ):
        assert not asks_nothing(host(caps)), caps
    assert not asks_nothing(host(types.ClientCapabilities(), "2025-11-25"))
    assert not asks_nothing(None)


def test_a_tool_mapping_arguments_to_headers_is_told_apart() -> None:
    assert not maps_headers({"type": "object", "properties": {"q": {"type": "string"}}})
    assert maps_headers({"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "Region"}}})
    assert maps_headers({"type": "object", "properties": {"r": {"type": "object", "x-mcp-header": "Bad"}}})


def test_only_read_only_or_idempotent_tools_of_a_short_one_page_listing_go_sessionless() -> None:
    def tool(name: str, **notes: bool) -> types.Tool:
        schema = {"type": "object", "properties": {"q": {"type": "string"}}}
        return types.Tool(name=name, input_schema=schema, annotations=types.ToolAnnotations(**notes) if notes else None)

    headed = types.Tool(
        name="headed",
        input_schema={"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    tools = [
        tool("read", read_only_hint=True),
        tool("again", idempotent_hint=True),
        tool("writes", read_only_hint=False),
        tool("says_nothing"),
        headed,
    ]
    # a tool made again on the session after it asked has run twice up to its question: only one that
    # changes nothing, or nothing more the second time, may
    assert sessionless_tools(tools, 1) == {"read", "again"}
    assert sessionless_tools(tools, 2) == frozenset()  # a paging server lists them again for every call
    many = [tool(f"t{i}", read_only_hint=True) for i in range(SESSIONLESS_TOOLS + 1)]
    assert sessionless_tools(many, 1) == frozenset()


def test_a_2026_result_is_read_without_the_eras_fields_and_the_upstreams_server_info() -> None:
    info = types.SERVER_INFO_META_KEY
    result = {"content": [], "isError": False, "resultType": "complete", "_meta": {info: {"name": "up"}}}
    _as_session_result(result)
    assert result == {"content": [], "isError": False}
    kept = {"content": [], "resultType": "complete", "_meta": {info: {"name": "up"}, "trace": 1}}
    _as_session_result(kept)
    assert kept == {"content": [], "_meta": {"trace": 1}}
