"""The lean path (`gateway/proxy/lean.py`): plain `tools/call` over stdio below the SDK's sessions, and
its leg to Streamable HTTP upstreams (`gateway/proxy/upstream_lean_http.py`).

Seen from the host's side of the wire, a gateway process with `lean_path` on answers exactly what it
answers with it off, for every content kind and every failure; cancellation, timeouts, a crashing
upstream and an upstream's question to the user behave as through the SDK.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import PROBE, PY, eventually, free_port, gateway_process, probe, serving, write_config

pytestmark = pytest.mark.anyio

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
WIRE = {"PROBE_WIRE_TOOLS": "1"}
EVERY_PLUGIN = ["offload", "memory", "documents", "monitor"]


class RawHost:
    """A host speaking JSON lines to a gateway process; it answers the gateway's requests with `answers`."""

    def __init__(self, process: Any, answers: dict[str, Callable[[dict], dict]]):
        self.process = process
        self.answers = answers
        self.seen: list[dict] = []
        self._next = 100

    async def send(self, message: dict) -> None:
        await self.process.stdin.send(json.dumps(message).encode() + b"\n")

    async def read(self) -> None:
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                message = json.loads(line)
                self.seen.append(message)
                if "method" in message and "id" in message:  # the gateway asks the host
                    answer = self.answers[message["method"]](message.get("params") or {})
                    await self.send({"jsonrpc": "2.0", "id": message["id"], "result": answer})

    def answer_to(self, rid: Any) -> dict | None:
        return next((m for m in self.seen if m.get("id") == rid and "method" not in m), None)

    async def request(self, method: str, params: dict | None = None, rid: Any = None) -> dict:
        if rid is None:
            self._next += 1
            rid = self._next
        message = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)
        await eventually(lambda: self.answer_to(rid) is not None, 30, f"the answer to {method} {rid}")
        return self.answer_to(rid)  # type: ignore[return-value]

    async def call(self, name: str, arguments: Any = None, **params: Any) -> dict:
        body = {"name": name, **params}
        if arguments is not None:
            body["arguments"] = arguments
        return await self.request("tools/call", body)


@asynccontextmanager
async def raw_host(
    tmp_path: Path,
    servers: dict[str, Any],
    capabilities: dict | None = None,
    answers: Any = None,
    handshake: bool = True,
    **gateway: Any,
) -> AsyncIterator[RawHost]:
    """A gateway process and a raw host on its stdio; `handshake=False`: a 2026-era host (no initialize)."""
    cfg = write_config(tmp_path, servers, **gateway)
    process = await gateway_process(cfg, tmp_path / "gw.err")
    async with process, anyio.create_task_group() as tg:
        host = RawHost(process, answers or {})
        tg.start_soon(host.read)
        if handshake:
            await host.request("initialize", INIT | {"capabilities": capabilities or {}}, rid=1)
            await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await host.request("tools/list")
        yield host
        await process.stdin.aclose()
        tg.cancel_scope.cancel()


CALLS: list[tuple[str, Any, dict]] = [
    ("p__kinds", {}, {}),
    ("p__add", {"a": 2, "b": 3.5}, {}),
    ("p__multi", {}, {}),
    ("p__image", None, {}),
    ("p__echo", {"text": '안녕하세요 \\n "quoted" \u2028'}, {"_meta": {"trace": "t1"}}),
    ("p__fail", {}, {}),
    ("p__rpc_error", {}, {}),
    ("p__no_such_tool", {}, {}),
    ("p__echo", "not an object", {}),  # invalid params: the SDK's error either way
    ("p__echo", {"text": "x"}, {"unknownField": 1}),
    ("p__echo", {"text": "\ud800"}, {}),  # a lone surrogate is refused before it reaches the upstream
]


ENVELOPE = {  # what a 2026-07-28 host sends with every request, instead of a handshake
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}
# a 2026-era host that can be asked nothing: its calls may reach an upstream of its era sessionless
BARE_ENVELOPE = ENVELOPE | {"io.modelcontextprotocol/clientCapabilities": {}}
# ... when the tool is declared read-only (or idempotent) and its server lists its tools in one page
SESSIONLESS = {"PROBE_READ_ONLY": "1", "PROBE_PAGE_SIZE": "100"}


async def sessionless_soon(call: Callable[..., Any]) -> int:
    """Wait until the gateway has heard that its HTTP upstream `p` speaks the 2026 era (`server/discover`,
    asked once the upstream is up): a bare 2026-era host's call then arrives there as that era's. The
    calls it took."""
    calls = 1
    with anyio.fail_after(20):
        while (await call("p__era", {}))["result"]["content"][0]["text"] != "2026-07-28":
            calls += 1
            await anyio.sleep(0.05)
    return calls


@contextmanager
def probe_over_http(name: str, env: dict[str, str], **cfg: Any) -> Iterator[dict[str, Any]]:
    """The probe server over Streamable HTTP on 127.0.0.1, as a `[servers.X]` table."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with serving([PY, PROBE, "--name", name, "--http", str(port)], url, {**os.environ, **env}):
        yield {"url": url, **cfg}


@contextmanager
def upstream_probe(transport: str, name: str, env: dict[str, str], **cfg: Any) -> Iterator[dict[str, Any]]:
    if transport == "http":
        with probe_over_http(name, env, **cfg) as server:
            yield server
    else:
        yield probe(name, env=env, **cfg)


async def _answers(
    tmp_path: Path, lean: bool, era: str = "2025", upstream: str = "stdio", waited: int = 0
) -> tuple[list[dict], list[dict]]:
    with upstream_probe(upstream, "p", WIRE | (SESSIONLESS if era == "2026-bare" else {})) as server:
        return await _answers_from(tmp_path, lean, era, {"p": server}, waited)


async def _answers_from(
    tmp_path: Path, lean: bool, era: str, servers: dict[str, Any], waited: int = 0
) -> tuple[list[dict], list[dict]]:
    """The answers to `CALLS` and a few more; `waited`: calls to make first (the other path's wait)."""
    (tmp_path / str(lean)).mkdir()
    modern = era.startswith("2026")
    envelope = BARE_ENVELOPE if era == "2026-bare" else ENVELOPE if modern else {}

    async def call(name: str, arguments: Any = None, **extra: Any) -> dict:
        if modern:
            extra["_meta"] = {**extra.get("_meta", {}), **envelope}
        return await host.call(name, arguments, **extra)

    settings = {"lean_path": lean, "plugins": EVERY_PLUGIN, "handshake": not modern}
    async with raw_host(tmp_path / str(lean), servers, **settings) as host:
        if modern:
            await host.request("tools/list", {"_meta": envelope})
        if era == "2026-bare" and lean:
            waited = await sessionless_soon(call)
        for _ in range(waited if not lean else 0):  # the same calls as the lean path's wait, for the ledger
            await call("p__era", {})
        answers = []
        for name, arguments, extra in CALLS:
            answer = await call(name, arguments, **extra)
            answers.append({k: v for k, v in answer.items() if k != "id"})
        # the monitor's ledger: both paths count the same
        status = await call("context_status", {"session_id": "lean"})
        ledger = {k: status["result"]["structuredContent"]["gateway"]["monitor"][k] for k in ("results", "level")}
        ids = [await call("p__request_id", {}) for _ in range(2)]
        # above the 4 MB spool threshold: the reply is read from disk with its long strings left there (a
        # 3 MB body is a ~6.7 MB line, text and structuredContent; 6 MB took twice the time for the same path)
        big = await call("p__big", {"size": 3_000_000, "kind": "structured"})
        tools = ("p__era", "p__mrtr", "p__routed", "p__era_rw")
        eras = [(await call(name, {"region": "eu"}))["result"] for name in tools]
    return answers, [ids[0]["result"], ids[1]["result"], big["result"], ledger, *eras, waited]


@pytest.mark.parametrize(
    ("era", "upstream"), [("2025", "stdio"), ("2026", "stdio"), ("2025", "http"), ("2026-bare", "http")]
)
async def test_lean_path_answers_exactly_as_the_sdk_path(tmp_path: Path, era: str, upstream: str) -> None:
    lean, lean_extra = await _answers(tmp_path, True, era, upstream)
    sdk, sdk_extra = await _answers(tmp_path, False, era, upstream, lean_extra[-1])
    for (name, _, _), a, b in zip(CALLS, lean, sdk, strict=True):
        assert a == b, name
    kinds = lean[0]["result"]
    assert [c["type"] for c in kinds["content"]] == ["text", "image", "audio", "resource_link", "resource", "resource"]
    assert kinds["structuredContent"]["nested"] == {"list": [1, 2.5, None, True]} and kinds["_meta"]
    # the upstream's JSON-RPC error comes back as an error result naming it
    assert lean[6]["result"]["isError"] and "error -32602: rpc_error always refuses" in str(lean[6]["result"])
    assert lean[8]["error"]["code"] == -32602  # params that are not an object: the SDK's own answer
    assert "lone surrogate" in str(lean[10]["result"])
    # the lean path really was taken: the upstream saw the gateway's own string ids, not the SDK's numbers
    assert lean_extra[0]["content"][0]["text"].startswith("str:gw-")
    assert sdk_extra[0]["content"][0]["text"].startswith("int:")
    # a huge result is offloaded on both paths alike
    assert lean_extra[2]["content"][0]["text"].split("resp_")[0] == sdk_extra[2]["content"][0]["text"].split("resp_")[0]
    assert lean_extra[2].get("structuredContent") == sdk_extra[2].get("structuredContent")
    # both paths count the same tokens into the monitor's ledger
    assert lean_extra[3] == sdk_extra[3] and lean_extra[3]["results"] > 0, (lean_extra[3], sdk_extra[3])
    # a bare 2026-era host's call of a read-only tool reached the HTTP upstream as that era's request, and
    # nothing else did; a tool that answers input_required there, maps arguments to headers or is not
    # declared read-only was called on the session
    eras = [[r["content"][0]["text"] for r in extra[4:-1]] for extra in (lean_extra, sdk_extra)]
    sessionless = era == "2026-bare" and upstream == "http"
    handshake = "2025-11-25"
    assert eras[0] == ["2026-07-28" if sessionless else handshake, "answered on the session", handshake, handshake]
    assert eras[1] == [handshake, "answered on the session", handshake, handshake]


async def test_lean_calls_are_cancelled_and_timed_out_at_the_upstream(tmp_path: Path) -> None:
    marker, slow_marker = tmp_path / "cancel.txt", tmp_path / "timeout.txt"
    servers = {
        "p": probe("p", env=WIRE | {"PROBE_CANCEL_MARKER": str(marker)}),
        "q": probe("q", env=WIRE | {"PROBE_CANCEL_MARKER": str(slow_marker)}, timeout_seconds=1),
    }
    async with raw_host(tmp_path, servers) as host:
        await host.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "p__slow", "arguments": {"seconds": 60}},
            }
        )
        await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call to start")
        await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
        await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
        timed_out = await host.call("q__slow", {"seconds": 60})
        after = await host.call("p__echo", {"text": "still here"})
        await eventually(lambda: slow_marker.read_text() == "cancelled", 20, "the timed-out call to be cancelled")
        assert host.answer_to(7) is None  # a cancelled request is never answered
    assert (
        timed_out["result"]["isError"]
        and "did not answer 'slow' within 1 s" in timed_out["result"]["content"][0]["text"]
    )
    assert after["result"]["content"][0]["text"] == "still here"


async def test_a_crash_during_a_lean_call_is_an_error_and_the_gateway_recovers(tmp_path: Path) -> None:
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE)}) as host:
        crashed = await host.call("p__crash", {})
        assert crashed["result"]["isError"]
        assert "went away during 'crash'" in crashed["result"]["content"][0]["text"]
        with anyio.fail_after(30):
            while True:  # the upstream is restarted; calls go through again
                again = await host.call("p__request_id", {})
                if not again["result"].get("isError"):
                    break
                await anyio.sleep(0.2)
        assert again["result"]["content"][0]["text"].startswith("str:gw-")


@pytest.mark.parametrize(("lean", "upstream"), [(True, "stdio"), (False, "stdio"), (True, "http")])
async def test_an_upstream_question_during_a_lean_call_reaches_the_host(
    tmp_path: Path, lean: bool, upstream: str
) -> None:
    asked: list[dict] = []

    def elicit(params: dict) -> dict:
        asked.append(params)
        return {"action": "accept", "content": {"name": "Ada"}}

    capabilities = {"elicitation": {"form": {}}}
    answers = {"elicitation/create": elicit}
    with upstream_probe(upstream, "p", WIRE) as server:
        async with raw_host(tmp_path, {"p": server}, capabilities, answers, lean_path=lean) as host:
            answer = await host.call("p__ask", {})
            ids = await host.call("p__request_id", {})
    assert answer["result"]["content"][0]["text"] == "accept:Ada"
    assert ids["result"]["content"][0]["text"].startswith("str:gw-" if lean else "int:")
    assert asked and asked[0]["message"] == "What is your name?"


async def test_a_host_asking_for_progress_goes_through_the_sdk_and_gets_it(tmp_path: Path) -> None:
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE)}) as host:
        via_sdk = await host.call("p__request_id", {}, _meta={"progressToken": "tok"})
        done = await host.call("p__progress", {"steps": 3, "delay": 0.01}, _meta={"progressToken": "tok2"})
        progress = [m for m in host.seen if m.get("method") == "notifications/progress"]
    assert via_sdk["result"]["content"][0]["text"].startswith("int:")
    assert done["result"]["content"][0]["text"] == "done after 3 steps"
    assert [m["params"]["progress"] for m in progress if m["params"]["progressToken"] == "tok2"] == [1, 2, 3]


async def test_a_2026_host_on_stdio_takes_the_lean_path_unless_it_sets_a_log_level(tmp_path: Path) -> None:
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE)}, handshake=False) as host:
        listed = await host.request("tools/list", {"_meta": ENVELOPE})
        called = [await host.call("p__request_id", {}, _meta=ENVELOPE) for _ in range(2)]
        logged = await host.call("p__request_id", {}, _meta=ENVELOPE | {"io.modelcontextprotocol/logLevel": "info"})
    assert listed["result"]["resultType"] == "complete"
    for answer in called:  # the era's envelope on the reply; the upstream saw the gateway's own ids
        assert answer["result"]["resultType"] == "complete"
        assert answer["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-context-gateway"
        assert answer["result"]["content"][0]["text"].startswith("str:gw-")
    # a log level of its own: the SDK's path, which scopes the upstream's log messages to the request
    assert logged["result"]["content"][0]["text"].startswith("int:")


@pytest.mark.parametrize("lean", [True, False])
async def test_a_lone_surrogate_in_a_result_reaches_the_host_as_valid_json(tmp_path: Path, lean: bool) -> None:
    raw = {"command": PY, "args": [str(Path(__file__).parent / "servers" / "raw_server.py"), "--surrogate"]}
    async with raw_host(tmp_path, {"raw": raw, "p": probe("p", env=WIRE)}, lean_path=lean) as host:
        odd = await host.call("raw__lone_surrogate", {})
        after = await host.call("p__echo", {"text": "still serving"})
    assert "a" in str(odd["result"]) and odd["result"]["content"][0]["text"].startswith("a")
    assert after["result"]["content"][0]["text"] == "still serving"


@pytest.mark.parametrize("lean", [True, False])
async def test_a_large_result_holding_a_lone_surrogate_is_offloaded(tmp_path: Path, lean: bool) -> None:
    """The token estimate used to raise on a lone surrogate, and offload passed such a result on whole."""
    raw = {"command": PY, "args": [str(Path(__file__).parent / "servers" / "raw_server.py"), "--surrogate"]}
    async with raw_host(tmp_path, {"raw": raw}, lean_path=lean, plugins=["offload"], max_response_size=4096) as host:
        big = await host.call("raw__lone_surrogate", {"rows": 50_000})
    text = big["result"]["content"][0]["text"]
    assert len(text) < 4096 and "fileRef" in text
    saved = Path(json.loads(text)["fileRef"]["path"]).read_text(encoding="utf-8", errors="surrogateescape")
    assert saved.startswith("arow row") and saved.endswith("b") and len(saved) > 200_000


async def test_an_upstreams_progress_keeps_a_lean_call_alive_past_its_timeout(tmp_path: Path) -> None:
    """The host asked for no progress, so the call takes the lean path; the gateway still asks the
    upstream for it, and each report moves the call's clock on."""
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE, timeout_seconds=0.6)}) as host:
        # 6 steps x 0.3 s = 1.8 s, three times the timeout
        done = await host.call("p__progress", {"steps": 6, "delay": 0.3})
        slow = await host.call("p__slow", {"seconds": 30})
        ids = await host.call("p__request_id", {})
    assert done["result"]["content"][0]["text"] == "done after 6 steps"
    assert not [m for m in host.seen if m.get("method") == "notifications/progress"]  # none was asked for
    assert slow["result"]["isError"] and "within 1 s" in slow["result"]["content"][0]["text"]
    assert ids["result"]["content"][0]["text"].startswith("str:gw-")  # the lean path it was


@pytest.mark.parametrize("lean", [True, False])
async def test_a_2026_hosts_call_that_asks_answers_input_required_on_both_paths(tmp_path: Path, lean: bool) -> None:
    """An upstream's question during a 2026-era host's call becomes the call's `input_required` answer; the
    retry with the answer resumes the waiting upstream. The lean path takes the first call (the upstream
    sees the gateway's own ids), the retry (it carries answers) goes through the SDK."""
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE)}, handshake=False, lean_path=lean) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})
        asked = await host.call("p__ask", {}, _meta=ENVELOPE)
        result = asked["result"]
        assert result["resultType"] == "input_required", result
        ((key, question),) = result["inputRequests"].items()
        assert question["method"] == "elicitation/create" and question["params"]["message"] == "What is your name?"
        answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
        done = await host.call("p__ask", {}, _meta=ENVELOPE, inputResponses=answer, requestState=result["requestState"])
        ids = await host.call("p__request_id", {}, _meta=ENVELOPE)
    assert done["result"]["content"][0]["text"] == "accept:Ada" and done["result"]["resultType"] == "complete"
    assert ids["result"]["content"][0]["text"].startswith("str:gw-" if lean else "int:")


async def test_a_2026_hosts_open_questions_past_the_quota_close_its_oldest_round(tmp_path: Path) -> None:
    """The lean path runs a 2026-era host's call without a task; its rounds still count against the
    quota: the 65th open question closes the first round (its upstream call is cancelled), whose retry
    answers an error naming the quota, while the last round completes with its answer."""
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE)}, handshake=False) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})
        with anyio.fail_after(60):
            rounds = [(await host.call("p__ask", {}, _meta=ENVELOPE))["result"] for _ in range(65)]
        assert all(r["resultType"] == "input_required" for r in rounds)

        async def retry(result: dict) -> dict:
            ((key, _),) = result["inputRequests"].items()
            answer = {key: {"action": "accept", "content": {"name": "Ada"}}}
            done = await host.call(
                "p__ask", {}, _meta=ENVELOPE, inputResponses=answer, requestState=result["requestState"]
            )
            return done["result"]

        first, last = await retry(rounds[0]), await retry(rounds[-1])
        ids = await host.call("p__request_id", {}, _meta=ENVELOPE)
    assert first["isError"] and "64 questions" in first["content"][0]["text"], first
    assert last["content"][0]["text"] == "accept:Ada" and last["resultType"] == "complete"
    assert ids["result"]["content"][0]["text"].startswith("str:gw-")  # the lean path took the calls


@pytest.mark.parametrize("lean", [True, False])
async def test_a_2026_hosts_retry_given_up_stops_the_upstream_call(tmp_path: Path, lean: bool) -> None:
    """The host answers the question, then cancels its retry while the tool works on: the upstream hears
    the cancel (on the lean path the call has no task whose cancel would tell it)."""
    marker = tmp_path / "cancel.txt"
    servers = {"p": probe("p", env=WIRE | {"PROBE_CANCEL_MARKER": str(marker)})}
    async with raw_host(tmp_path, servers, handshake=False, lean_path=lean) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})
        asked = (await host.call("p__ask", {"then_sleep": 60}, _meta=ENVELOPE))["result"]
        ((key, _),) = asked["inputRequests"].items()
        params = {
            "name": "p__ask",
            "arguments": {"then_sleep": 60},
            "_meta": ENVELOPE,
            "inputResponses": {key: {"action": "accept", "content": {"name": "Ada"}}},
            "requestState": asked["requestState"],
        }
        await host.send({"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": params})
        await eventually(
            lambda: marker.exists() and marker.read_text() == "started", 20, "the answer to reach the tool"
        )
        await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 20}})
        await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
        assert host.answer_to(20) is None


async def test_two_questions_out_at_once_keep_a_2026_hosts_call_clock_stopped(tmp_path: Path) -> None:
    """A tool asks two questions at once; the host answers the first at once and takes longer than the
    call's timeout over the second: the clock starts again only once both are answered."""
    async with raw_host(tmp_path, {"p": probe("p", env=WIRE, timeout_seconds=0.6)}, handshake=False) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})

        async def retry(result: dict) -> dict:
            ((key, _),) = result["inputRequests"].items()
            answer = {key: {"action": "accept", "content": {"name": key}}}
            return await host.call(
                "p__ask", {"twice": True}, _meta=ENVELOPE, inputResponses=answer, requestState=result["requestState"]
            )

        first = (await host.call("p__ask", {"twice": True}, _meta=ENVELOPE))["result"]
        second = (await retry(first))["result"]
        assert second["resultType"] == "input_required", second
        await anyio.sleep(1.2)  # the user: twice the call's timeout over the second question
        done = (await retry(second))["result"]
    assert not done.get("isError") and done["content"][0]["text"].count("accept:") == 2, done


async def test_a_question_that_cannot_be_written_to_a_2026_host_ends_its_call(tmp_path: Path) -> None:
    """An upstream's question nested too deeply to write out: the host's call is answered with an error
    (not left unanswered) and the gateway serves on."""
    raw = {"command": PY, "args": [str(Path(__file__).parent / "servers" / "raw_server.py"), "--ask-deep"]}
    async with raw_host(tmp_path, {"raw": raw}, handshake=False) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})
        deep = await host.call("raw__ask_deep", {"depth": 950}, _meta=ENVELOPE)
        log = tmp_path / "ws" / "logs" / "raw.log"
        await eventually(lambda: "cancelled gw-" in log.read_text(), 20, "the upstream to hear the cancel")
        after = await host.call("raw__legacy_echo", {"text": "still here"}, _meta=ENVELOPE)
    assert "error" in deep and "depth" in deep["error"]["message"], deep
    assert after["result"]["content"][0]["text"] == "legacy_echo:still here"


@pytest.mark.parametrize("lean", [True, False])
async def test_a_2026_hosts_call_is_cancelled_at_the_upstream(tmp_path: Path, lean: bool) -> None:
    marker = tmp_path / "cancel.txt"
    servers = {"p": probe("p", env=WIRE | {"PROBE_CANCEL_MARKER": str(marker)})}
    async with raw_host(tmp_path, servers, handshake=False, lean_path=lean) as host:
        await host.request("tools/list", {"_meta": ENVELOPE})
        params = {"name": "p__slow", "arguments": {"seconds": 60}, "_meta": ENVELOPE}
        await host.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params})
        await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call to start")
        await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}})
        await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
        after = await host.call("p__request_id", {}, _meta=ENVELOPE)
        assert host.answer_to(9) is None  # a cancelled request is never answered
    assert after["result"]["content"][0]["text"].startswith("str:gw-" if lean else "int:")


async def test_lean_calls_to_an_http_upstream_are_cancelled_timed_out_and_kept_alive_by_progress(
    tmp_path: Path,
) -> None:
    """The HTTP leg: a host's cancel and the call's clock reach the upstream as a cancel, and the
    upstream's progress (on the call's event stream) moves the clock on."""
    marker, slow_marker = tmp_path / "cancel.txt", tmp_path / "timeout.txt"
    with (
        upstream_probe("http", "p", WIRE | {"PROBE_CANCEL_MARKER": str(marker)}) as p,
        upstream_probe("http", "q", WIRE | {"PROBE_CANCEL_MARKER": str(slow_marker)}, timeout_seconds=0.8) as q,
    ):
        async with raw_host(tmp_path, {"p": p, "q": q}) as host:
            params = {"name": "p__slow", "arguments": {"seconds": 60}}
            await host.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
            await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call to start")
            await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
            await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
            timed_out = await host.call("q__slow", {"seconds": 60})
            await eventually(lambda: slow_marker.read_text() == "cancelled", 20, "the timed-out call to be cancelled")
            done = await host.call("q__progress", {"steps": 5, "delay": 0.3})  # 1.5 s, about twice the timeout
            ids = [await host.call(f"{s}__request_id", {}) for s in "pq"]
            assert host.answer_to(7) is None  # a cancelled request is never answered
    assert timed_out["result"]["isError"] and "within 1 s" in timed_out["result"]["content"][0]["text"]
    assert done["result"]["content"][0]["text"] == "done after 5 steps"
    assert all(i["result"]["content"][0]["text"].startswith("str:gw-") for i in ids)  # the lean leg it was
