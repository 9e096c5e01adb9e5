"""The HTTP leg's SSE reading (`proxy/upstream_lean_http._Event`): events as the SSE format defines them."""

from __future__ import annotations

from gateway.proxy.upstream_lean_http import _Event


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
