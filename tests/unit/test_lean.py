"""The lean path's pure parts: which host requests it takes, and how raw upstream replies are matched."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from gateway.proxy.lean import CLOSED, Clock, LeanFront, RawRequests, parse_result, plain_call, wire_result
from gateway.services.json_wire import line


def test_only_plain_calls_are_taken() -> None:
    plain = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "a__b", "arguments": {"x": 1}}}
    assert plain_call(plain) == plain["params"]
    assert plain_call(plain | {"params": {"name": "a__b"}}) is not None  # no arguments at all
    assert plain_call(plain | {"params": {"name": "a", "_meta": {"trace": "t"}}}) is not None
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
    assert all(plain_call(r) is None for r in refused)


def test_a_call_without_an_id_is_left_to_the_sdk() -> None:
    """A `tools/call` sent as a notification (no id) is not taken, and taking it does not raise (the
    host's reader would stop)."""
    take = LeanFront(lambda: object(), None, None, None, None, None, None).intercept(None, None)  # type: ignore[arg-type]
    assert take({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "a__b"}}) is False
    assert take({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}) is False


def test_a_line_is_compact_utf8_json() -> None:
    out = line({"text": "한국어", "n": 1})
    assert out.endswith(b"\n") and json.loads(out) == {"text": "한국어", "n": 1}
    assert "한국어".encode() in out
    lone = line({"text": "a\ud800b"})  # a lone surrogate from an upstream's JSON escape: escaped again
    assert lone.decode("utf-8") and json.loads(lone) == {"text": "a\ud800b"}


def _recorded(behind: list[bool] | None = None) -> tuple[RawRequests, list[dict], list[dict]]:
    """Raw requests whose lines are kept, decoded: written at once, or sent once the peer caught up
    (while `behind[0]` is true the writer declines, as a full pipe's does)."""
    written: list[dict] = []
    sent: list[dict] = []

    async def send(data: bytes) -> None:
        sent.append(json.loads(data))

    def write(data: bytes) -> bool:
        if behind and behind[0]:
            return False
        written.append(json.loads(data))
        return True

    raw = RawRequests()
    raw.attach(send, write)
    return raw, written, sent


def test_raw_requests_match_replies_progress_and_errors() -> None:
    raw, written, _ = _recorded()
    progressed: list[int] = []
    results: dict[str, object] = {}
    ok = raw.start("tools/call", {"name": "ok"}, lambda o: results.__setitem__("ok", o), lambda: progressed.append(1))
    bad = raw.start("tools/call", {"name": "bad"}, lambda o: results.__setitem__("bad", o))
    assert [w["id"] for w in written] == [ok, bad] and all(i.startswith("gw-") for i in (ok, bad))  # type: ignore[union-attr]
    assert written[0]["params"]["_meta"]["progressToken"] == ok and "_meta" not in written[1]["params"]
    assert raw.intercept(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": ok, "progress": 1}}
    )
    assert not raw.intercept({"jsonrpc": "2.0", "id": 5, "result": {}})  # the SDK's own request: not ours
    assert raw.intercept({"jsonrpc": "2.0", "id": ok, "result": {"content": []}})
    assert raw.intercept({"jsonrpc": "2.0", "id": bad, "error": {"code": -32602, "message": "no"}})
    assert results["ok"] == {"content": []} and progressed == [1]
    assert isinstance(results["bad"], types.ErrorData) and results["bad"].code == -32602
    assert raw.intercept(
        {"jsonrpc": "2.0", "id": ok, "result": {}}
    )  # late, nothing pending: dropped here (with its spilled files)


@pytest.mark.anyio
async def test_a_closed_connection_fails_waiting_requests_and_cancel_is_sent() -> None:
    behind = [False]
    raw, written, sent = _recorded(behind)
    outcomes: list[object] = []
    assert raw.start("tools/call", {"name": "t"}, outcomes.append) is not None
    raw.detach()
    assert outcomes == [CLOSED] and not raw.ready
    assert raw.start("tools/call", {"name": "t"}, outcomes.append) is None  # detached: nothing can be sent

    raw, written, sent = _recorded(behind)
    rid = raw.start("tools/call", {"name": "slow"}, outcomes.append)
    assert rid is not None
    raw.cancel(rid)  # the caller gives up: the upstream hears a cancel for that id, and no outcome comes
    assert written[-1]["method"] == "notifications/cancelled" and written[-1]["params"]["requestId"] == rid
    raw.intercept({"jsonrpc": "2.0", "id": rid, "result": {}})  # a late reply: dropped
    assert outcomes == [CLOSED]
    rid = raw.start("tools/call", {"name": "slow"}, outcomes.append)
    behind[0] = True  # a peer that is behind: no new request is written, a cancel waits its turn
    assert raw.start("tools/call", {"name": "later"}, outcomes.append) is None
    raw.cancel(rid)  # type: ignore[arg-type]
    with anyio.fail_after(5):
        while not sent:
            await anyio.sleep(0)
    assert sent == [
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": rid, "reason": "caller cancelled"},
        }
    ]
    assert outcomes == [CLOSED]


@pytest.mark.anyio
async def test_the_clock_fires_once_moves_later_and_pauses() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    clock = Clock(0.05, lambda: fired.append(loop.time()))
    began = loop.time()
    clock.deadline = loop.time() + 0.15  # progress: later
    with anyio.fail_after(5):
        while not fired:
            await anyio.sleep(0.01)
    assert fired[0] - began >= 0.15 and not clock.running
    clock.deadline = loop.time()  # a stopped clock never fires again
    await anyio.sleep(0.05)
    assert len(fired) == 1

    paused = Clock(0.02, lambda: fired.append(-1))
    paused.deadline = math.inf  # an upstream's question to the user: the clock waits
    await anyio.sleep(0.06)
    assert len(fired) == 1 and paused.running
    paused.deadline = loop.time() + 0.01  # answered: it runs again
    with anyio.fail_after(5):
        while len(fired) < 2:
            await anyio.sleep(0.01)
    stopped = Clock(0.01, lambda: fired.append(-2))
    stopped.stop()
    await anyio.sleep(0.05)
    assert fired[1:] == [-1]


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
    {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"a": 1.5, "b": [1, None, True], "c": "한"}},
    {"content": [{"type": "text", "text": "x"}], "structuredContent": {"n": {"deep": [{"x": -0.0}]}}, "isError": True},
    {"content": [{"type": "text", "text": "x"}], "structuredContent": [1, 2]},
    {"content": [{"type": "text", "text": "x"}], "structuredContent": None},
    {"structuredContent": {"a": 1}},
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
    assert parse_result(version, raw) == _sdk_read(version, raw)  # the same model, as plugins see it
    assert line({"result": wire_result(version, parse_result(version, raw))}) == expected


@pytest.mark.parametrize("raw", SHAPES)
def test_results_for_a_2026_host_are_written_as_the_sdk_writes_them(raw: dict[str, Any]) -> None:
    """Upstreams speak the handshake era; a 2026-era host gets the result in its own (resultType added)."""
    try:
        result = _sdk_read("2025-11-25", raw)
    except ValueError:
        return
    expected = line({"result": _sdk_write("2026-07-28", result)})
    assert line({"result": wire_result("2026-07-28", result)}) == expected
    assert wire_result("2026-07-28", result)["resultType"] == "complete"


class _Host:
    protocol_version = "2025-11-25"


def _front(finish: Any, start_now: bool = True) -> tuple[LeanFront, dict[str, Any]]:
    """A lean front whose upstream is a dict: `started` holds each call's `done`, `cancelled` the calls
    given up; with `start_now` off every call goes the waiting way (`run`)."""
    seen: dict[str, Any] = {"started": {}, "cancelled": [], "ran": [], "recorded": []}

    def start(call: Any, done: Any) -> Any:
        if not start_now:
            return None
        seen["started"][call.arguments["n"]] = done
        return lambda: seen["cancelled"].append(call.arguments["n"])

    async def run(call: Any) -> types.CallToolResult:
        seen["ran"].append(call.arguments["n"])
        return types.CallToolResult(content=[types.TextContent(text=f"ran {call.arguments['n']}")])

    def record(call: Any, result: types.CallToolResult, reply: types.CallToolResult) -> None:
        seen["recorded"].append(call.arguments["n"])

    def start_modern(call: Any, done: Any, asked: Any) -> Any:
        seen["asked"] = asked
        return start(call, done)

    return LeanFront(lambda: _Host(), run, start, finish, record, run, start_modern), seen


def _request(rid: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "a__b", "arguments": {"n": rid}}}


def _text(n: int) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=f"result {n}")])


@pytest.mark.anyio
async def test_the_front_answers_in_the_callback_waits_only_when_it_must_and_never_answers_a_cancel() -> None:
    async def later(result: types.CallToolResult) -> types.CallToolResult:
        await anyio.sleep(0)
        return _text(99)

    def finish(call: Any, result: types.CallToolResult) -> Any:
        if call.arguments["n"] == 5:
            raise RuntimeError("a plugin broke")
        return later(result) if call.arguments["n"] == 2 else result

    front, seen = _front(finish)
    written: list[dict] = []
    sent: list[dict] = []
    behind = [False]

    def write(data: bytes) -> bool:
        if behind[0]:
            return False
        written.append(json.loads(data))
        return True

    async def send(data: bytes) -> None:
        sent.append(json.loads(data))

    take = front.intercept(send, write)
    assert all(take(_request(n)) for n in (1, 2, 3, 4, 5))
    assert not take(_request(1))  # an id already in flight: the SDK answers that one
    seen["started"][1](_text(1))  # answered inside the callback: written at once
    assert written == [
        {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"text": "result 1", "type": "text"}], "isError": False}}
    ]
    seen["started"][5](_text(5))  # a bug on the way: answered as the SDK answers a handler that raised
    assert written.pop() == {"jsonrpc": "2.0", "id": 5, "error": {"code": 0, "message": "a plugin broke"}}
    seen["started"][2](_text(2))  # a plugin must wait: answered from a task
    assert take({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}})
    assert seen["cancelled"] == [3]
    seen["started"][3](_text(3))  # a reply after the cancel: never answered
    behind[0] = True
    seen["started"][4](_text(4))  # the host is behind: the answer waits its turn
    with anyio.fail_after(5):
        while len(sent) < 2:
            await anyio.sleep(0)
    assert sorted((m["id"], m["result"]["content"][0]["text"]) for m in sent) == [(2, "result 99"), (4, "result 4")]
    assert len(written) == 1 and not front._flights
    assert seen["recorded"] == [1, 4]  # the two answered in the callback (the task's path records its own)


@pytest.mark.anyio
async def test_a_call_that_cannot_start_at_once_runs_the_waiting_way() -> None:
    front, seen = _front(lambda call, result: result, start_now=False)
    sent: list[dict] = []

    async def send(data: bytes) -> None:
        sent.append(json.loads(data))

    take = front.intercept(send, lambda data: True)
    assert take(_request(5))
    with anyio.fail_after(5):
        while not sent:
            await anyio.sleep(0)
    assert seen["ran"] == [5] and sent[0]["id"] == 5 and sent[0]["result"]["content"][0]["text"] == "ran 5"


def test_a_late_reply_leaves_no_spilled_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reply to a cancelled lean call arrives after all (40 MB, spilled): dropped with its files, so
    nothing stays pending until the 15-minute sweep."""
    from gateway.services import spill

    monkeypatch.setattr(spill, "KEEP", 16)
    raw, _, _ = _recorded()
    rid = raw.start("tools/call", {"name": "big"}, lambda o: None)
    spooled = tmp_path / "line"
    spooled.write_text(
        json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "x" * 500}]}})
    )
    raw.cancel(rid)
    value = spill.Spiller(tmp_path / "spill").read(spooled)
    assert spill.pending()
    assert raw.intercept(value)
    assert not spill.pending() and not list((tmp_path / "spill").iterdir())
