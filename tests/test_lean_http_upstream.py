"""The lean path's leg to a Streamable HTTP upstream (`proxy/upstream_lean_http.py`) against a hand-written
upstream that answers the ways a server may (a stream kept open after the reply, a same-origin redirect,
a priming event and a resumed stream, an event over several `data:` lines, bare CR line ends, an event
that is not JSON): each outcome is the one the SDK's own client gets from the same answer."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from aiohttp import web
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client

from gateway.proxy.upstream_http import SpoolingTransport
from gateway.proxy.upstream_lean_http import HttpRawRequests
from gateway.services import spill
from gateway.services.spill import Spiller

pytestmark = pytest.mark.anyio

RESULT = {"content": [{"type": "text", "text": "ok"}], "isError": False}
LONG_TEXT = 512 * 1024


class Upstream:
    """A Streamable HTTP server answering `tools/call` in the way `scenario` names."""

    def __init__(self, scenario: str):
        self.scenario = scenario
        self.pending: Any = None
        self.release = asyncio.Event()  # a stream kept open stays so until the test ends
        self.calls: list[str] = []  # each tools/call's era: "session" or "2026-07-28"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            if self.scenario == "resume" and request.headers.get("last-event-id") == "e1":
                return await self._events(request, f"id: e2\ndata: {self._reply(self.pending)}\n\n")
            return web.Response(status=405)
        if request.method == "DELETE":
            return web.Response(status=200)
        if self.scenario == "redirect" and request.path == "/mcp":
            return web.Response(status=307, headers={"location": "/mcp/"})
        message = await request.json()
        if "id" not in message:
            return web.Response(status=202)
        rid, method = message["id"], message["method"]
        era = request.headers.get("mcp-protocol-version", "")
        if method == "server/discover" and self.scenario.endswith("_sessionless"):
            result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "resultType": "complete"}
            return web.json_response({"jsonrpc": "2.0", "id": rid, "result": result})
        if method == "tools/call":
            self.calls.append(era if era == "2026-07-28" else "session")
        if method == "tools/call" and era == "2026-07-28":
            if self.scenario == "refuses_sessionless":
                error = {"code": types.HEADER_MISMATCH, "message": "Mcp-Name does not match"}
                return web.json_response({"jsonrpc": "2.0", "id": rid, "error": error}, status=400)
            refusals = {
                # the SDK's answer to a tool that asked its client
                "cannot_ask_sessionless": (types.INVALID_REQUEST, "Cannot send 'elicitation/create': no back-channel"),
                "own_error_sessionless": (types.INVALID_REQUEST, "the order id is not valid"),  # the tool's own
                "crash_sessionless": (types.INTERNAL_ERROR, "Internal server error"),  # that era hides the cause
            }
            if self.scenario in refusals:
                code, text = refusals[self.scenario]
                error = {"code": code, "message": text}
                return web.json_response({"jsonrpc": "2.0", "id": rid, "error": error}, status=400)
            if self.scenario == "wants_session_sessionless":  # as a server without that era refuses a request
                error = {"code": -32000, "message": "Bad Request: No valid session ID provided"}
                return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=400)
            if self.scenario == "busy_sessionless":  # a proxy in front, say, while the server restarts
                return web.Response(status=503, text="busy")
            if self.scenario == "wrong_id_sessionless":
                wrong = {"jsonrpc": "2.0", "id": "not-yours", "result": {"content": [{"type": "text", "text": "?"}]}}
                return web.json_response(wrong)
            asks = {"resultType": "input_required", "requestState": "s1"}
            return web.json_response({"jsonrpc": "2.0", "id": rid, "result": asks})
        # the SDK's servers answer a session's requests with an event stream, unless in `json_response` mode
        events = self.scenario.endswith("_sessionless") and self.scenario != "json_mode_sessionless"
        if method == "initialize":
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "u", "version": "1"},
            }
            opened = {"jsonrpc": "2.0", "id": rid, "result": result}
            if events:
                return await self._events(request, f"data: {json.dumps(opened)}\n\n", session="S1")
            return web.json_response(opened, headers={"mcp-session-id": "S1"})
        if method != "tools/call":  # the listing the SDK's client asks for before a call
            listed = {"jsonrpc": "2.0", "id": rid, "result": {"tools": []}}
            return (
                await self._events(request, f"data: {json.dumps(listed)}\n\n") if events else web.json_response(listed)
            )
        reply = self._reply(rid)
        if self.scenario == "gzip_json":  # a long text that compresses well, as plain JSON
            long = {"content": [{"type": "text", "text": "a" * LONG_TEXT}], "isError": False}
            body = gzip.compress(json.dumps({"jsonrpc": "2.0", "id": rid, "result": long}).encode())
            return web.Response(body=body, content_type="application/json", headers={"content-encoding": "gzip"})
        if self.scenario in ("json_bad_utf8", "json_bom"):  # a JSON body the SDK's parser refuses
            body = self._reply(rid).encode()
            body = body.replace(b'"ok"', b'"o\xffk"') if self.scenario == "json_bad_utf8" else b"\xef\xbb\xbf" + body
            return web.Response(body=body, content_type="application/json")
        if self.scenario == "keep_open":  # the reply, then the stream stays open
            response = await self._events(request, f"event: message\ndata: {reply}\n\n", end=False)
            await self.release.wait()
            return response
        if self.scenario == "resume":  # a priming event, then the server closes; the reply comes on a GET
            self.pending = rid
            return await self._events(request, "id: e1\nretry: 50\ndata: \n\n")
        text = {
            "redirect": f"data: {reply}\n\n",
            "priming": f"id: e1\ndata: \n\nid: e2\ndata: {reply}\n\n",
            "multiline": "event: message\n"
            + "".join(f"data: {line}\n" for line in json.dumps(json.loads(reply), indent=1).split("\n"))
            + "\n",
            "cr_only": f"event: message\rdata: {reply}\r\r",
            "refuses_sessionless": f"data: {reply}\n\n",
            "asks_sessionless": f"data: {reply}\n\n",
            "cannot_ask_sessionless": f"data: {reply}\n\n",
            "own_error_sessionless": f"data: {reply}\n\n",
            "crash_sessionless": f"data: {reply}\n\n",
            "wants_session_sessionless": f"data: {reply}\n\n",
            "wrong_id_sessionless": f"data: {reply}\n\n",
            "busy_sessionless": f"data: {reply}\n\n",
            "json_mode_sessionless": f"data: {reply}\n\n",
            "not_json": "data: {not json\n\n",
        }[self.scenario]
        return await self._events(request, text)

    @staticmethod
    def _reply(rid: Any) -> str:
        return json.dumps({"jsonrpc": "2.0", "id": rid, "result": RESULT})

    @staticmethod
    async def _events(request: web.Request, text: str, end: bool = True, session: str = "") -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        if session:
            response.headers["mcp-session-id"] = session
        await response.prepare(request)
        await response.write(text.encode())
        if end:
            await response.write_eof()
        return response


@asynccontextmanager
async def serving(upstream: Upstream, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/mcp"
    finally:
        upstream.release.set()
        await runner.cleanup()


@asynccontextmanager
async def sdk_session(url: str) -> AsyncIterator[tuple[ClientSession, SpoolingTransport]]:
    """The SDK's client session to `url`, initialized, on the spooling transport the lean leg reads."""
    spooling = SpoolingTransport(None)
    async with (
        httpx2.AsyncClient(transport=spooling, timeout=httpx2.Timeout(30, read=None)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, spooling


async def both_ways(scenario: str, tls: ssl.SSLContext | None = None) -> tuple[Any, Any]:
    """The SDK client's outcome of one call and the lean leg's, on the session the SDK opened."""
    upstream = Upstream(scenario)
    async with serving(upstream, tls) as url:
        async with sdk_session(url) as (session, spooling):
            try:
                with anyio.fail_after(10):
                    sdk: Any = (await session.call_tool("x", {})).content[0].text  # type: ignore[union-attr]
            except MCPError as exc:
                sdk = exc.error.code
            outcome = await lean_call(url, spooling)
    return sdk, outcome["content"][0]["text"] if isinstance(outcome, dict) else outcome.code


async def lean_call(url: str, spooling: SpoolingTransport) -> Any:
    """One `tools/call` through the lean leg, on the session the SDK opened: its outcome."""
    sink, source = anyio.create_memory_object_stream[Any](0)
    lean = HttpRawRequests(url, {}, spooling, lambda: None)
    lean.attach(sink)
    lean.session_ready()
    settled = asyncio.get_running_loop().create_future()
    async with source:
        with anyio.fail_after(10):  # before: a stream kept open never settled the call
            lean.start("tools/call", {"name": "x", "arguments": {}}, settled.set_result)
            outcome = await settled
    lean.detach()
    return outcome


@pytest.mark.parametrize("scenario", ["keep_open", "redirect", "resume", "priming", "multiline", "cr_only"])
async def test_the_lean_leg_reads_each_answer_as_the_sdk_does(scenario: str) -> None:
    sdk, lean = await both_ways(scenario)
    assert sdk == lean == "ok"


async def test_an_event_that_is_not_json_fails_the_call_on_both_paths() -> None:
    sdk, lean = await both_ways("not_json")
    assert sdk == lean == types.PARSE_ERROR


@pytest.mark.parametrize("scenario", ["json_bad_utf8", "json_bom"])
async def test_a_json_body_the_sdks_parser_refuses_fails_the_call_on_both_paths(scenario: str) -> None:
    """Invalid UTF-8 in a JSON body (msgspec refuses it, the standard library's reader replaced it), a BOM
    before one (the standard library's reader skipped it): a parse error on both paths."""
    sdk, lean = await both_ways(scenario)
    assert sdk == lean == types.PARSE_ERROR


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_an_https_upstream_trusted_through_ssl_cert_file_answers_on_both_legs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream over HTTPS with a certificate of a private CA (here: self-signed), trusted the way
    Python's HTTP clients are told (`SSL_CERT_FILE`): the SDK's leg and the lean leg both reach it."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        ["openssl", *request, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    sdk, lean = await both_ways("multiline", tls)
    assert sdk == lean == "ok"


SESSIONLESS_CASES = {  # scenario: (what the two calls answer, what the upstream saw, clock restarts)
    # refused as that era's request (its headers; a server that wants a session): made on the session,
    # and the next call goes there at once
    "refuses_sessionless": (["ok", "ok"], ["2026-07-28", "session", "session"], 1),
    "wants_session_sessionless": (["ok", "ok"], ["2026-07-28", "session", "session"], 1),
    # the tool asks (input_required, the SDK's no-back-channel error): made on the session, and that tool
    # stays there
    "asks_sessionless": (["ok", "ok"], ["2026-07-28", "session", "session"], 1),
    "cannot_ask_sessionless": (["ok", "ok"], ["2026-07-28", "session", "session"], 1),
    # the handler failed, its cause hidden by that era: the session's answer says it (each time)
    "crash_sessionless": (["ok", "ok"], ["2026-07-28", "session", "2026-07-28", "session"], 2),
    # the tool's own error is its answer, made once
    "own_error_sessionless": ([-32600, -32600], ["2026-07-28", "2026-07-28"], 0),
    # a reply to another request is not this call's answer: the session's is
    "wrong_id_sessionless": (["ok", "ok"], ["2026-07-28", "session", "2026-07-28", "session"], 2),
    # a server failing at the HTTP level is not asked again at once, and it still speaks the era
    "busy_sessionless": ([-32603, -32603], ["2026-07-28", "2026-07-28"], 0),
    # a server answering its session with plain JSON (the SDK's json_response mode) would not notice a
    # cancel of such a request: its calls stay on the session
    "json_mode_sessionless": (["ok", "ok"], ["session", "session"], 0),
}


@pytest.mark.parametrize("scenario", list(SESSIONLESS_CASES))
async def test_a_sessionless_call_is_made_again_on_the_session_only_when_that_tells_more(scenario: str) -> None:
    """An upstream that says it speaks the 2026 era gets a bare host's call of a read-only tool so; what
    each of its answers leads to (`SESSIONLESS_CASES`). A call made again starts its clock again."""
    upstream = Upstream(scenario)
    answers, seen, restarts = SESSIONLESS_CASES[scenario]
    async with serving(upstream) as url:
        async with sdk_session(url) as (session, spooling):
            await session.list_tools()  # the SDK's POST the leg takes its session headers from
            sink, source = anyio.create_memory_object_stream[Any](0)
            lean = HttpRawRequests(url, {}, spooling, lambda: None, {"name": "gw", "version": "1"})
            lean.attach(sink)
            lean.session_ready()
            outcomes, clock = [], []
            async with source:
                with anyio.fail_after(10):
                    assert lean._discovering is not None
                    await lean._discovering  # its server/discover, asked in the background
                    assert (lean.modern is None) == (scenario == "json_mode_sessionless")
                    for _ in range(2):
                        settled = asyncio.get_running_loop().create_future()
                        params = {"name": "x", "arguments": {}}
                        lean.start("tools/call", params, settled.set_result, lambda: clock.append(1), sessionless=True)
                        outcomes.append(await settled)
            lean.detach()
    assert [o["content"][0]["text"] if isinstance(o, dict) else o.code for o in outcomes] == answers
    assert upstream.calls == seen
    assert len(clock) == restarts


async def test_a_connection_ended_at_once_leaves_no_client_behind() -> None:
    """The background `server/discover` of a connection that ended before it ran opens no HTTP client."""
    upstream = Upstream("asks_sessionless")
    async with serving(upstream) as url:
        spooling = SpoolingTransport(None)
        spooling.session_headers = {"mcp-session-id": "S1", "mcp-protocol-version": "2025-11-25"}
        lean = HttpRawRequests(url, {}, spooling, lambda: None)
        lean.attach(anyio.create_memory_object_stream[Any](0)[0])
        lean.session_ready()
        lean.detach()
        await asyncio.gather(*lean._tasks, return_exceptions=True)
        assert lean._client is None


async def test_a_compressed_reply_is_spooled_by_its_text_not_its_compressed_length(tmp_path: Path) -> None:
    """512 KB of text sent gzipped as ~1 KB: the leg reads it as a long body (its text spilled to a file
    above the spiller's threshold), not as the short body its Content-Length suggests."""
    upstream = Upstream("gzip_json")
    async with serving(upstream) as url:
        spooling = SpoolingTransport(Spiller(tmp_path / "spill", threshold=64 * 1024))
        async with (
            httpx2.AsyncClient(transport=spooling, timeout=httpx2.Timeout(30, read=None)) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.list_tools()  # a POST of the session's: its headers are the leg's
            outcome = await lean_call(url, spooling)
    text = outcome["content"][0]["text"]
    part = spill.of(text)
    try:
        assert part is not None, f"held in memory: {len(text)} characters"
        assert spill.restored(outcome)["content"][0]["text"] == "a" * LONG_TEXT
    finally:
        spill.discard(outcome)
