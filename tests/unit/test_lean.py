"""The lean path's pure parts: which host requests it takes, and how raw upstream replies are matched."""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from gateway.proxy.lean import CLOSED, LeanFront, RawRequests, _plain_call, parse_result, wire_result
from gateway.proxy.stdio_lines import json_line as line


def test_only_plain_calls_are_taken() -> None:
    plain = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "a__b", "arguments": {"x": 1}}}
    assert _plain_call(plain) == plain["params"]
    assert _plain_call(plain | {"params": {"name": "a__b"}}) is not None  # no arguments at all
    assert _plain_call(plain | {"params": {"name": "a", "_meta": {"trace": "t"}}}) is not None
    refused = [
        plain | {"id": True},  # not a JSON-RPC id
        plain | {"id": None},
        plain | {"params": "x"},
        plain | {"params": {"name": 3}},
        plain | {"params": {"name": "a", "arguments": [1]}},
        plain | {"params": {"name": "a", "_meta": {"progressToken": 1}}},  # progress: the SDK relays it
        plain | {"params": {"name": "a", "task": {}}},  # anything beyond name/arguments/_meta
        plain | {"params": {"name": "a", "_meta": "x"}},
    ]
    assert all(_plain_call(r) is None for r in refused)


def test_a_call_without_an_id_is_left_to_the_sdk() -> None:
    """A `tools/call` sent as a notification (no id) is not taken, and taking it does not raise (the
    host's reader would stop)."""
    take = LeanFront(lambda: object(), None).intercept(None)  # type: ignore[arg-type]
    assert take({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "a__b"}}) is False
    assert take({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}) is False


def test_a_line_is_compact_utf8_json() -> None:
    out = line({"text": "한국어", "n": 1})
    assert out.endswith(b"\n") and json.loads(out) == {"text": "한국어", "n": 1}
    assert "한국어".encode() in out
    lone = line({"text": "a\ud800b"})  # a lone surrogate from an upstream's JSON escape: escaped again
    assert lone.decode("utf-8") and json.loads(lone) == {"text": "a\ud800b"}


def _recorded() -> tuple[RawRequests, list[dict], Any]:
    """Raw requests whose lines are kept, decoded, in the list."""
    written: list[dict] = []
    raw = RawRequests()

    async def send(data: bytes) -> None:
        written.append(json.loads(data))

    raw.attach(send)
    return raw, written, send


@pytest.mark.anyio
async def test_raw_requests_match_replies_progress_and_errors() -> None:
    raw, written, _ = _recorded()
    progressed: list[int] = []
    results: dict[str, object] = {}

    async def ask(key: str) -> None:
        try:
            results[key] = await raw.request("tools/call", {"name": key}, lambda: progressed.append(1))
        except MCPError as exc:
            results[key] = exc.error.code

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, "ok")
        tg.start_soon(ask, "bad")
        with anyio.fail_after(5):
            while len(written) < 2:
                await anyio.sleep(0)
        ids = {w["params"]["name"]: w["id"] for w in written}
        assert all(isinstance(i, str) and i.startswith("gw-") for i in ids.values())
        assert written[0]["params"]["_meta"]["progressToken"] == written[0]["id"]
        progress = {"progressToken": ids["ok"], "progress": 1}
        assert raw.intercept({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress})
        assert not raw.intercept({"jsonrpc": "2.0", "id": 5, "result": {}})  # the SDK's own request: not ours
        assert raw.intercept({"jsonrpc": "2.0", "id": ids["ok"], "result": {"content": []}})
        assert raw.intercept({"jsonrpc": "2.0", "id": ids["bad"], "error": {"code": -32602, "message": "no"}})
    assert results == {"ok": {"content": []}, "bad": -32602} and progressed == [1]
    assert not raw.intercept({"jsonrpc": "2.0", "id": ids["ok"], "result": {}})  # nothing pending: not taken


@pytest.mark.anyio
async def test_a_closed_connection_fails_waiting_requests_and_cancel_is_sent() -> None:
    raw, written, send = _recorded()
    outcome: dict[str, object] = {}

    async def ask() -> None:
        try:
            await raw.request("tools/call", {"name": "t"})
        except MCPError as exc:
            outcome["code"] = exc.error.code

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        with anyio.fail_after(5):
            while not written:
                await anyio.sleep(0)
        raw.detach()
    assert outcome["code"] == CLOSED.code
    with pytest.raises(MCPError):  # detached: nothing can be sent
        await raw.request("tools/call", {"name": "t"})

    raw.attach(send)
    with anyio.move_on_after(0.05):  # the caller gives up: the upstream hears a cancel for that id
        await raw.request("tools/call", {"name": "slow"})
    assert written[-1]["method"] == "notifications/cancelled"
    assert written[-1]["params"]["requestId"] == written[-2]["id"]


def test_results_are_read_and_written_as_the_sdk_does() -> None:
    version = "2025-11-25"
    result = parse_result(version, {"content": [{"type": "text", "text": "hi"}], "ttlMs": 5, "extra": 1})
    assert result.content[0].text == "hi"  # a later revision's field is dropped, as the SDK's client does
    wire = wire_result(version, result)
    assert wire["content"] == [{"type": "text", "text": "hi"}] and "ttlMs" not in wire
    with pytest.raises(ValueError):
        parse_result(version, {"content": "not a list"})
    assert wire_result(version, types.CallToolResult(content=[], is_error=True))["isError"] is True


HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
SHAPES: list[dict[str, Any]] = [
    {"content": [{"type": "text", "text": "hi"}]},
    {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "한국어 \ud800"}], "isError": True},
    {"content": [], "isError": False},
    {"content": [{"type": "text", "text": "hi", "annotations": {"priority": 0.5}}]},
    {"content": [{"type": "text", "text": "hi", "_meta": {"k": 1}}]},
    {"content": [{"type": "text", "text": "hi", "extra": 1}]},
    {"content": [{"type": "text", "text": "hi"}], "extra": 1},
    {"content": [{"type": "text", "text": "{}"}], "structuredContent": {}},
    {"content": [{"type": "text", "text": "hi"}], "_meta": {"k": 1}},
    {"content": [{"type": "image", "text": "hi"}]},
    {"content": [{"type": "text", "text": 5}]},
    {"content": [{"type": "text", "text": "hi"}], "isError": None},
]


def _sdk_read(version: str, raw: dict[str, Any]) -> types.CallToolResult:
    import contextlib

    from mcp_types import methods as surfaces

    import gateway.compat as compat

    with contextlib.suppress(KeyError):
        surfaces.validate_server_result("tools/call", version, raw)
    foreign = compat.later_revision_fields("tools/call", version)
    return types.CallToolResult.model_validate({k: v for k, v in raw.items() if k not in foreign}, by_name=False)


def _sdk_write(version: str, result: types.CallToolResult) -> dict[str, Any]:
    from mcp_types import methods as surfaces

    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return surfaces.serialize_server_result("tools/call", version, dumped)


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
@pytest.mark.parametrize("raw", SHAPES)
def test_plain_text_results_take_a_shortcut_to_the_same_bytes(version: str, raw: dict[str, Any]) -> None:
    try:
        expected = line({"result": _sdk_write(version, _sdk_read(version, raw))})
    except ValueError as exc:  # the SDK refuses it: so does the lean path, with the same error kind
        with pytest.raises(type(exc)):
            parse_result(version, raw)
        return
    assert line({"result": wire_result(version, parse_result(version, raw))}) == expected
