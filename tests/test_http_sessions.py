"""Sessions on a shared HTTP front (named tokens, real Streamable HTTP on 127.0.0.1): each token's share
of sessions and of open question rounds, one reading of each checked header, and sessions that stay
their owner's for as long as they live."""

from __future__ import annotations

import contextlib
import json
import socket
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from conftest import (
    ALICE,
    BOB,
    free_port,
    gateway_env,
    make_settings,
    probe,
    serving,
    tenant_session,
    text_of,
    two_tenants,
)
from test_front_and_cli import INIT, JSON_HEADERS, _modern_tenants

pytestmark = pytest.mark.anyio

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LISTING = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def as_token(token: str, session: str = "") -> dict[str, str]:
    return JSON_HEADERS | {"authorization": f"Bearer {token}"} | ({"mcp-session-id": session} if session else {})


async def open_session(http: httpx2.AsyncClient, url: str, token: str) -> str:
    """A raw host's session: initialized, then left idle (no GET stream)."""
    opened = await http.post(url, json=INIT, headers=as_token(token))
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    assert (await http.post(url, json=INITIALIZED, headers=as_token(token, sid))).status_code == 202
    return sid


async def test_a_token_flooding_sessions_never_keeps_another_out(tmp_path: Path) -> None:
    """alice (a share of 5) opens 12 sessions she never ends: her idle ones are reclaimed, oldest first
    (404: her host initializes anew); with all 5 busy (GET streams open) her next is refused with 429
    naming the share. bob opens a session and calls a tool throughout."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [], max_sessions_per_token=5)
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http, AsyncExitStack() as streams:
            hers = [await open_session(http, url, ALICE) for _ in range(12)]
            statuses = [(await http.post(url, json=LISTING, headers=as_token(ALICE, s))).status_code for s in hers]
            assert statuses == [404] * 7 + [200] * 5
            async with tenant_session(url, BOB) as bob:
                assert text_of(await bob.call_tool("p__echo", {"text": "bob's"})) == "bob's"
            for sid in hers[7:]:  # a host listening on each: none of them is idle
                get = await streams.enter_async_context(
                    http.stream("GET", url, headers=as_token(ALICE, sid) | {"accept": "text/event-stream"})
                )
                assert get.status_code == 200
            refused = await http.post(url, json=INIT, headers=as_token(ALICE))
            assert refused.status_code == 429 and "max_sessions_per_token" in refused.json()["error"]["message"]
            assert "5" in refused.json()["error"]["message"]
            async with tenant_session(url, BOB) as bob:
                assert text_of(await bob.call_tool("p__echo", {"text": "still"})) == "still"
            listed = await http.post(url, json=LISTING, headers=as_token(ALICE, hers[-1]))
            assert listed.status_code == 200 and "p__echo" in listed.text  # hers, untouched


async def test_calls_in_flight_are_not_rounds_and_an_evicted_round_answers(tmp_path: Path) -> None:
    """2026-era hosts over HTTP: 70 calls of one token in flight at once all answer (each call used to
    count as an open round: the 65th cancelled the first, which was never answered). Only questions
    count: alice's 65th open question closes her first round, whose retry answers an error naming the
    quota."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p"), "q": probe("q")}, [])
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with _modern_tenants(port) as (alice, bob):
            answers: list[str] = []

            async def slow() -> None:
                answers.append(text_of(await alice.session.call_tool("p__slow", {"seconds": 3})))

            with anyio.fail_after(90):
                async with anyio.create_task_group() as tg:
                    for _ in range(70):
                        tg.start_soon(slow)
            assert len(answers) == 70

            his = await bob.session.call_tool("p__ask", {}, allow_input_required=True)
            with anyio.fail_after(90):
                rounds = [await alice.session.call_tool("q__ask", {}, allow_input_required=True) for _ in range(65)]
            assert all(isinstance(r, types.InputRequiredResult) for r in [his, *rounds])

            def reply(to: Any) -> dict[str, Any]:
                (key,) = to.input_requests
                return {key: types.ElicitResult(action="accept", content={"name": "Mina"})}

            with anyio.fail_after(30):
                first = await alice.session.call_tool(
                    "q__ask", {}, input_responses=reply(rounds[0]), request_state=rounds[0].request_state
                )
                assert first.is_error and "64 questions" in text_of(first), text_of(first)
                last = await alice.session.call_tool(
                    "q__ask", {}, input_responses=reply(rounds[-1]), request_state=rounds[-1].request_state
                )
                assert text_of(last) == "accept:Mina"
                his_done = await bob.session.call_tool(
                    "p__ask", {}, input_responses=reply(his), request_state=his.request_state
                )
                assert text_of(his_done) == "accept:Mina"


def test_a_header_given_twice_is_refused_before_any_check(tmp_path: Path) -> None:
    """bob holds a leaked session id of alice's: with it first and one of his own second (the bearer check
    read the last copy, the SDK routes by the first) he ended her session. Two copies of a header the
    checks read are refused with 400, and her session lives on."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()), httpx2.Client(timeout=30) as http:

        def opened(token: str) -> str:
            sid = http.post(url, json=INIT, headers=as_token(token)).headers["mcp-session-id"]
            assert http.post(url, json=INITIALIZED, headers=as_token(token, sid)).status_code == 202
            return sid

        hers, his = opened(ALICE), opened(BOB)
        base = list(JSON_HEADERS.items())
        bob = [("authorization", f"Bearer {BOB}")]
        twice = [("mcp-session-id", hers), ("mcp-session-id", his)]
        for method, body in (("DELETE", None), ("GET", None), ("POST", LISTING)):
            extra = [("accept", "text/event-stream")] if method == "GET" else []
            sent = http.request(method, url, headers=base + bob + twice + extra, content=json.dumps(body or {}))
            assert sent.status_code == 400 and "mcp-session-id" in sent.text, (method, sent.status_code)
        for dup in (
            [("authorization", f"Bearer {ALICE}"), ("authorization", f"Bearer {BOB}"), ("mcp-session-id", hers)],
            bob + [("mcp-session-id", his), ("mcp-protocol-version", "2025-06-18")] * 2,
        ):
            assert http.post(url, headers=base + dup, content=json.dumps(LISTING)).status_code == 400
        mine = http.post(url, json=LISTING, headers=as_token(ALICE, hers))
        assert mine.status_code == 200 and "p__echo" in mine.text


async def test_a_session_is_its_owners_for_as_long_as_it_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the gateway's own process over real HTTP: however many sessions are opened after it, alice's
    session refuses bob's token; the owner records go with the sessions, so they
    never outnumber the live sessions; and a session without an owner record is refused to every token."""
    import uvicorn

    import gateway.compat as compat
    from gateway.proxy import host_transport
    from gateway.proxy.server import Gateway
    from gateway.settings import NamedToken

    # owner records were once dropped by count, oldest first; a small count would show it at once
    monkeypatch.setattr(host_transport, "MAX_SESSIONS", 3, raising=False)
    settings = make_settings(tmp_path, {"p": probe("p")}, transport="http")
    settings.auth.tokens = [NamedToken(name="alice", token=ALICE), NamedToken(name="bob", token=BOB)]
    gateway = Gateway(settings)
    app, manager = host_transport.build_http_app(gateway)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    url = f"http://127.0.0.1:{port}/mcp"
    async with gateway.running(), manager.run(), anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(20):
            while not server.started:
                await anyio.sleep(0.02)
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
            first = await open_session(http, url, ALICE)
            later = [await open_session(http, url, BOB) for _ in range(6)]
            assert (await http.post(url, json=LISTING, headers=as_token(BOB, first))).status_code == 404
            assert (await http.post(url, json=LISTING, headers=as_token(ALICE, first))).status_code == 200
            owners = [compat.http_session_owner(manager, sid) for sid in [first, *later]]
            assert owners == ["alice"] + ["bob"] * 6
            for sid in later:
                assert (await http.delete(url, headers=as_token(BOB, sid))).status_code == 200
            assert set(manager._session_owners) == set(manager._server_instances) == {first}
            manager._session_owners.clear()  # a live session whose owner is not known: nobody's
            for token in (ALICE, BOB):
                assert (await http.post(url, json=LISTING, headers=as_token(token, first))).status_code == 404
        server.should_exit = True


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the gateway's memory from /proc")
def test_a_request_head_without_end_is_cut_off_before_it_fills_memory(tmp_path: Path) -> None:
    """A client with no token sends one header of 64 MB: the front answers 431 once the head passes 64 KB
    and closes the connection (it used to hold the whole head in memory before any check read it), and
    the gateway keeps serving."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()) as proc:
        before = _rss_mb(proc.pid)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Filler: ".encode())
            chunk, sent = b"a" * 65536, 0
            try:
                while sent < 64 * 1024 * 1024:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # closed by the gateway: what it should do
                pass
            answer = b""
            with contextlib.suppress(OSError):
                while part := sock.recv(65536):
                    answer += part
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        assert sent < 64 * 1024 * 1024 and _rss_mb(proc.pid) < before + 32
        with httpx2.Client(timeout=30) as http:  # still serving
            assert http.post(url, json=INIT, headers=as_token(ALICE)).status_code == 200
