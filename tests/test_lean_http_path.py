"""The lean path on the HTTP front (`gateway/proxy/lean_http.py`): plain `tools/call` of session-bound
hosts answered beside the SDK's transport and server.

Seen from the host's side, a gateway process with `lean_path` on answers what it answers with it off
(as JSON instead of an SSE stream), for every content kind and failure; a cancel, an upstream's
question, the SDK's checks of a request and the hosts it must leave to the SDK behave as through it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from conftest import PY, eventually, http_gateway, probe, text_of
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from test_lean_path import (
    BARE_ENVELOPE,
    CALLS,
    ENVELOPE,
    EVERY_PLUGIN,
    SESSIONLESS,
    WIRE,
    probe_over_http,
    sessionless_soon,
)

pytestmark = pytest.mark.anyio

HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
VERSION = "2025-11-25"
MODERN = {"mcp-protocol-version": "2026-07-28"}


def routed(tool: str) -> dict[str, str]:
    """The headers a 2026-era host sends with a call: the version, the method and the tool's name."""
    return MODERN | {"mcp-method": "tools/call", "mcp-name": tool}


class HttpHost:
    """A host posting JSON-RPC to a gateway's Streamable HTTP front, one session, no GET stream."""

    def __init__(self, http: httpx2.AsyncClient, url: str):
        self.http, self.url = http, url
        self.session = ""
        self._next = 100

    def headers(self, **extra: str) -> dict[str, str]:
        session = {"mcp-session-id": self.session, "mcp-protocol-version": VERSION} if self.session else {}
        return HEADERS | session | extra

    async def post(self, message: dict, **headers: str) -> httpx2.Response:
        return await self.http.post(self.url, content=json.dumps(message).encode(), headers=self.headers(**headers))

    async def request(self, method: str, params: dict | None = None, rid: Any = None) -> tuple[str, dict]:
        """The answer to one request, and the content type it came as (or its HTTP status, when not 200)."""
        if rid is None:
            self._next += 1
            rid = self._next
        response = await self.post({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        if response.status_code != 200:
            return f"status {response.status_code}", response.json()
        return response.headers["content-type"], answer_in(response.text, rid)

    async def call(self, name: str, arguments: Any = None, **params: Any) -> tuple[str, dict]:
        body = {"name": name, **params}
        if arguments is not None:
            body["arguments"] = arguments
        return await self.request("tools/call", body)


def answer_in(body: str, rid: Any) -> dict:
    """The JSON-RPC answer to `rid` in a JSON body or an SSE stream."""
    if body.lstrip().startswith("{"):
        return json.loads(body)
    for line in body.replace("\r\n", "\n").split("\n"):  # not splitlines: U+2028 inside a string
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if message.get("id") == rid and "method" not in message:
                return message
    raise AssertionError(f"no answer to {rid} in {body[:300]!r}")


@asynccontextmanager
async def http_host(url: str, capabilities: dict | None = None) -> AsyncIterator[HttpHost]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
        host = HttpHost(http, url)
        init = {
            "protocolVersion": VERSION,
            "capabilities": capabilities or {},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        opened = await host.post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        host.session = opened.headers["mcp-session-id"]
        assert (await host.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status_code == 202
        await host.request("tools/list")
        yield host


async def _answers(tmp_path: Path, lean: bool) -> tuple[list[dict], list[str], list[dict]]:
    servers = {"p": probe("p", env=WIRE)}
    (tmp_path / str(lean)).mkdir()
    answers, kinds = [], []
    flag = f"--lean-path={str(lean).lower()}"
    with http_gateway(tmp_path / str(lean), flag, "--plugins", ",".join(EVERY_PLUGIN), servers=servers) as url:
        async with http_host(url) as host:
            for name, arguments, extra in CALLS:
                kind, answer = await host.call(name, arguments, **extra)
                kinds.append(kind)
                answers.append({k: v for k, v in answer.items() if k != "id"})
            ids = [(await host.call("p__request_id", {}))[1]["result"] for _ in range(2)]
    return answers, kinds, ids


async def test_lean_http_answers_exactly_as_the_sdk_path(tmp_path: Path) -> None:
    lean, lean_kinds, lean_ids = await _answers(tmp_path, True)
    sdk, sdk_kinds, sdk_ids = await _answers(tmp_path, False)
    for (name, _, _), a, b in zip(CALLS, lean, sdk, strict=True):
        assert a == b, name
    assert lean[0]["result"]["structuredContent"]["nested"] == {"list": [1, 2.5, None, True]}
    assert lean[8]["error"]["code"] == -32602  # params that are not an object: the SDK's own answer
    # a lone surrogate's escape is refused by the SDK's JSON parser on this transport, on both paths
    assert lean_kinds[10] == sdk_kinds[10] == "status 400"
    # the lean path really was taken: answered as JSON, and a stdio upstream got it the lean way too
    plain = [i for i, (_, arguments, extra) in enumerate(CALLS[:10]) if arguments != "not an object" and not extra]
    assert {lean_kinds[i] for i in plain} == {"application/json"}
    assert set(sdk_kinds[:10]) == {"text/event-stream"}
    assert lean_ids[0]["content"][0]["text"].startswith("str:gw-")
    assert sdk_ids[0]["content"][0]["text"].startswith("int:")


async def test_arguments_nested_past_the_sdks_parser_are_refused_on_both_paths(tmp_path: Path) -> None:
    """The SDK's JSON parser on this transport refuses a body nested ~200 levels deep (a parse error,
    status 400); the lean path's reads ~1,000: it leaves such a body to the SDK instead of calling the
    tool with it. A body with many brackets that is not deep still reaches the tool on both paths."""
    outcomes = []
    for lean in (True, False):
        (tmp_path / str(lean)).mkdir()
        flag = f"--lean-path={str(lean).lower()}"
        with http_gateway(tmp_path / str(lean), flag, servers={"p": probe("p", env=WIRE)}) as url:
            async with http_host(url) as host:
                deep = await host.call("p__echo", {"text": "x", "deep": json.loads("[" * 300 + "]" * 300)})
                wide = await host.call("p__echo", {"text": "[" * 300})
        outcomes.append((deep[0], deep[1]["error"]["code"], wide[1]["result"]["content"][0]["text"]))
    assert outcomes[0] == outcomes[1] == ("status 400", types.PARSE_ERROR, "[" * 300), outcomes


@pytest.mark.parametrize("lean", [True, False])
async def test_a_cancelled_lean_http_call_is_answered_as_cancelled_and_stops_at_the_upstream(
    tmp_path: Path, lean: bool
) -> None:
    marker = tmp_path / "cancel.txt"
    servers = {"p": probe("p", env=WIRE | {"PROBE_CANCEL_MARKER": str(marker)})}
    flag = f"--lean-path={str(lean).lower()}"
    with http_gateway(tmp_path, flag, servers=servers) as url:
        async with http_host(url) as host, anyio.create_task_group() as tg:
            answers: list[tuple[str, dict]] = []

            async def slow() -> None:
                answers.append(await host.request("tools/call", {"name": "p__slow", "arguments": {"seconds": 60}}, 7))

            tg.start_soon(slow)
            await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call to start")
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            assert (await host.post(cancel)).status_code == 202
            await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
            await eventually(lambda: bool(answers), 20, "the cancelled call's answer")
            after = await host.call("p__echo", {"text": "still here"})
    ((kind, answer),) = answers
    assert answer["error"] == {"code": -32800, "message": "Request cancelled"}
    assert kind == ("application/json" if lean else "text/event-stream")
    assert after[1]["result"]["content"][0]["text"] == "still here"


@pytest.mark.parametrize("lean", [True, False])
async def test_an_upstream_question_during_a_lean_http_call_reaches_the_host(tmp_path: Path, lean: bool) -> None:
    """The SDK's client holds the session's GET stream open: the question goes there on the lean path."""
    kinds: list[str] = []
    listening: list[int] = []

    async def seen(response: httpx2.Response) -> None:
        if response.request.method == "GET":  # the session's GET stream is open (its headers arrived)
            listening.append(response.status_code)
        elif b"p__ask" in response.request.content:
            kinds.append(response.headers.get("content-type", ""))

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    flag = f"--lean-path={str(lean).lower()}"
    with http_gateway(tmp_path, flag, servers={"p": probe("p", env=WIRE)}) as url:
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(60), event_hooks={"response": [seen]}) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write, elicitation_callback=elicit) as session,
        ):
            await session.initialize()
            await session.list_tools()
            await eventually(lambda: listening == [200], 20, "the host's GET stream")
            answer = await session.call_tool("p__ask", {})
    assert text_of(answer) == "accept:Ada"
    assert kinds == (["application/json"] if lean else ["text/event-stream"])


async def test_a_host_that_may_be_asked_but_holds_no_get_stream_is_left_to_the_sdk(tmp_path: Path) -> None:
    """Without a POST stream of its own, a lean call's questions could reach only a GET stream."""
    with http_gateway(tmp_path, "--lean-path=true", servers={"p": probe("p")}) as url:
        async with http_host(url, {"elicitation": {"form": {}}}) as asks, http_host(url) as plain:
            assert (await asks.call("p__echo", {"text": "a"}))[0] == "text/event-stream"
            assert (await plain.call("p__echo", {"text": "b"}))[0] == "application/json"


@pytest.mark.parametrize("lean", [True, False])
async def test_the_sdks_checks_of_a_request_hold_on_the_lean_path(tmp_path: Path, lean: bool) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": "p__echo", "arguments": {"text": "x"}},
    }
    flag = f"--lean-path={str(lean).lower()}"
    with http_gateway(tmp_path, flag, servers={"p": probe("p")}) as url:
        async with http_host(url) as host:
            statuses = [
                (await host.post(call, origin="http://evil.example")).status_code,
                (await host.post(call, accept="application/json")).status_code,
                (await host.post(call, **{"content-type": "text/plain"})).status_code,
                (await host.post(call, **{"mcp-session-id": "not-a-session"})).status_code,
            ]
            ok = await host.post(call)
            assert (await host.http.delete(url, headers=host.headers())).status_code == 200
            ended = await host.post(call)
    assert statuses == [403, 406, 400, 404]  # the same on both paths: the SDK answers them
    assert answer_in(ok.text, 9)["result"]["content"][0]["text"] == "x"
    assert ended.status_code == 404  # a session the host ended is not served on either path


PARAM_HEADERS = [
    ("p__routed", "eu-west", {"mcp-param-region": "eu-west"}),
    ("p__routed", "eu-west", {"mcp-param-region": "us-east"}),
    ("p__routed", "eu-west", {}),
    ("p__echo", None, {"mcp-param-region": "eu-west"}),
]


async def _modern_answers(tmp_path: Path, lean: bool) -> tuple[list[tuple[int, dict]], list[dict]]:
    """A 2026-era host's calls over HTTP: no session, the envelope in every request's `_meta`."""
    (tmp_path / str(lean)).mkdir()
    flag = f"--lean-path={str(lean).lower()}"
    servers = {"p": probe("p", env=WIRE)}
    answers = []
    with http_gateway(tmp_path / str(lean), flag, "--plugins", ",".join(EVERY_PLUGIN), servers=servers) as url:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
            host = HttpHost(http, url)

            async def call(
                rid: int, name: str, arguments: Any, headers: dict[str, str] | None = None, **extra: Any
            ) -> httpx2.Response:
                params = {"name": name, **extra, "_meta": {**extra.get("_meta", {}), **ENVELOPE}}
                if arguments is not None:
                    params["arguments"] = arguments
                return await host.post(
                    {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params},
                    **routed(name),
                    **(headers or {}),
                )

            for rid, (name, arguments, extra) in enumerate(CALLS):
                response = await call(rid, name, arguments, **extra)
                answers.append((response.status_code, response.json()))
            # Mcp-Param headers against the tool's schema: matching, not matching, missing; and one the
            # tool's schema does not name (nothing to check)
            for rid, (name, region, headers) in enumerate(PARAM_HEADERS, 50):
                response = await call(rid, name, {"region": region} if region else {"text": "x"}, headers)
                answers.append((response.status_code, response.json()))
            ids = [(await call(99, "p__request_id", {})).json()["result"] for _ in range(2)]
    return answers, ids


async def test_a_2026_hosts_lean_http_calls_are_answered_as_the_sdk_answers_them(tmp_path: Path) -> None:
    lean, lean_ids = await _modern_answers(tmp_path, True)
    sdk, sdk_ids = await _modern_answers(tmp_path, False)
    names = [name for name, _, _ in CALLS + PARAM_HEADERS]
    for name, a, b in zip(names, lean, sdk, strict=True):
        assert a == b, name
    assert lean[0][1]["result"]["structuredContent"]["nested"] == {"list": [1, 2.5, None, True]}
    assert lean[0][1]["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-context-gateway"
    assert lean[8][0] == 400 and lean[8][1]["error"]["code"] == -32602  # the SDK's own answer, status and all
    headed = lean[len(CALLS) :]
    assert [status for status, _ in headed] == [200, 400, 400, 200]  # refused where the SDK refuses
    assert headed[1][1]["error"]["code"] == types.HEADER_MISMATCH
    # the lean path really was taken: the stdio upstream got the call the lean way too
    assert lean_ids[0]["content"][0]["text"].startswith("str:gw-") and sdk_ids[0]["content"][0]["text"].startswith(
        "int:"
    )


@pytest.mark.parametrize("lean", [True, False])
async def test_a_2026_host_that_closes_the_stream_cancels_the_call_at_the_upstream(tmp_path: Path, lean: bool) -> None:
    marker = tmp_path / "cancel.txt"
    servers = {"p": probe("p", env=WIRE | {"PROBE_CANCEL_MARKER": str(marker)})}
    params = {"name": "p__slow", "arguments": {"seconds": 60}, "_meta": ENVELOPE}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()
    with http_gateway(tmp_path, f"--lean-path={str(lean).lower()}", servers=servers) as url:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: http.post(url, content=body, headers=HEADERS | routed("p__slow")))
                await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call")
                tg.cancel_scope.cancel()  # the host gives up: its connection closes
            await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
            echo = {"name": "p__echo", "arguments": {"text": "still here"}, "_meta": ENVELOPE}
            after = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": echo},
                headers=HEADERS | routed("p__echo"),
            )
    assert after.json()["result"]["content"][0]["text"] == "still here"


@pytest.mark.parametrize("lean", [True, False])
async def test_a_question_that_cannot_be_written_to_a_2026_host_over_http_ends_its_call(
    tmp_path: Path, lean: bool
) -> None:
    """An upstream's question nested too deeply to write out: the host's call is answered with an error
    and, on the lean path, the upstream call stops at once (it hears a cancel) instead of waiting for an
    answer that cannot come."""
    raw = {"command": PY, "args": [str(Path(__file__).parent / "servers" / "raw_server.py"), "--ask-deep"]}
    params = {"name": "raw__ask_deep", "arguments": {"depth": 950}, "_meta": ENVELOPE}
    with http_gateway(tmp_path, f"--lean-path={str(lean).lower()}", servers={"raw": raw}) as url:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
            deep = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
                headers=HEADERS | routed("raw__ask_deep"),
            )
            if lean:
                log = tmp_path / "ws" / "logs" / "raw.log"
                await eventually(lambda: "cancelled gw-" in log.read_text(), 20, "the upstream to hear the cancel")
            echo = {"name": "raw__legacy_echo", "arguments": {"text": "still here"}, "_meta": ENVELOPE}
            after = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": echo},
                headers=HEADERS | routed("raw__legacy_echo"),
            )
    assert "error" in answer_in(deep.text, 1), deep.text[:300]
    assert answer_in(after.text, 2)["result"]["content"][0]["text"] == "legacy_echo:still here"


async def test_a_2026_host_asking_nothing_reaches_an_http_upstream_of_its_era_without_a_session(tmp_path: Path) -> None:
    """Such a host's call goes on as that era's request (`server/discover` said the upstream speaks it),
    answered as the gateway's; a tool that asks still reaches the host as an input_required round;
    closing its stream still stops the call at the upstream."""
    marker = tmp_path / "cancel.txt"
    with (
        probe_over_http("p", WIRE | SESSIONLESS | {"PROBE_CANCEL_MARKER": str(marker)}) as upstream,
        http_gateway(tmp_path, "--lean-path=true", servers={"p": upstream}) as url,
    ):
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:

            def post(rid: int, name: str, arguments: dict) -> Any:
                params = {"name": name, "arguments": arguments, "_meta": BARE_ENVELOPE}
                message = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
                return http.post(url, json=message, headers=HEADERS | routed(name))

            async def call(name: str, arguments: dict) -> dict:
                return (await post(1, name, arguments)).json()

            await sessionless_soon(call)
            answer = await call("p__whoami", {})
            assert answer["result"]["content"][0]["text"] == "p"
            assert answer["result"]["_meta"] == {"io.modelcontextprotocol/serverInfo": (await _gateway_info(call))}
            # a tool that asks its client anything stopped at the question there: made again on the session,
            # whose question becomes this host's input_required round as before; answered, it completes
            asked = (await call("p__ask", {}))["result"]
            assert asked["resultType"] == "input_required", asked
            (key, question), *_ = asked["inputRequests"].items()
            assert question["params"]["message"] == "What is your name?"
            params = {
                "name": "p__ask",
                "arguments": {},
                "requestState": asked["requestState"],
                "inputResponses": {key: {"action": "accept", "content": {"name": "Mina"}}},
                "_meta": BARE_ENVELOPE,
            }
            message = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
            retried = await http.post(url, json=message, headers=HEADERS | routed("p__ask"))
            assert retried.json()["result"]["content"][0]["text"] == "accept:Mina"
            async with anyio.create_task_group() as tg:
                tg.start_soon(post, 2, "p__slow", {"seconds": 60})
                await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "the slow call")
                tg.cancel_scope.cancel()  # the host gives up: its connection closes, then the gateway's
            await eventually(lambda: marker.read_text() == "cancelled", 20, "the upstream to hear the cancel")
            assert (await call("p__echo", {"text": "still here"}))["result"]["content"][0]["text"] == "still here"


async def _gateway_info(call: Any) -> dict:
    """The serverInfo the gateway stamps on a 2026-era host's results (its own tool's answer carries it)."""
    status = await call("context_status", {})
    info = status["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]
    assert info["name"] == "mcp-context-gateway"
    return info


async def test_a_host_making_only_lean_calls_keeps_its_place_among_the_remembered_hosts(tmp_path: Path) -> None:
    """The gateway remembers its 64 most recent host connections (list_changed goes to them): a host
    whose calls all take the lean path is as recent as one whose calls go through the SDK."""
    with http_gateway(tmp_path, "--lean-path=true", servers={"p": probe("p")}) as url:
        async with http_host(url) as steady:
            for n in range(70):
                async with http_host(url):  # another host arrives (and lists the tools)
                    pass
                kind, answer = await steady.call("p__echo", {"text": f"still {n}"})
                assert answer["result"]["content"][0]["text"] == f"still {n}"
                assert kind == "application/json", n  # still known to the gateway: the lean path takes it
