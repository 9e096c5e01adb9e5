"""The gateway as a real process: Streamable HTTP front, stdio front with huge results, CLI commands."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from conftest import (
    ALICE,
    BOB,
    PY,
    eventually,
    gateway_env,
    http_gateway,
    probe,
    run_cli,
    serving,
    tenant_session,
    text_of,
    two_tenants,
    wait_listening,
    write_config,
)
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gateway.proxy.upstream_stdio import linear_stdio_client
from gateway.services.stats import summary

pytestmark = pytest.mark.anyio

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


async def test_http_front_serves_tools_and_progress(tmp_path: Path) -> None:
    with http_gateway(tmp_path) as url:
        async with (
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            names = {t.name for t in (await session.list_tools()).tools}
            assert "p__echo" in names
            seen: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(progress)

            result = await session.send_request(
                types.CallToolRequest(params=types.CallToolRequestParams(name="p__progress", arguments={"steps": 3})),
                types.CallToolResult,
                progress_callback=on_progress,
            )
            assert text_of(result) == "done after 3 steps"
            await eventually(lambda: len(seen) == 3)
            assert seen == [1, 2, 3]


def test_http_front_rejects_foreign_origin_and_host(tmp_path: Path) -> None:
    with http_gateway(tmp_path) as url:
        ok = httpx2.post(url, json=INIT, headers=JSON_HEADERS)
        assert ok.status_code == 200
        evil_origin = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"origin": "http://evil.example"})
        assert evil_origin.status_code == 403
        evil_host = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"host": "evil.example:80"})
        assert evil_host.status_code == 421


def test_non_loopback_needs_a_token(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")})
    cmd = [PY, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--host", "127.0.0.2"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=gateway_env())
    assert refused.returncode == 2
    assert "auth_token" in refused.stderr and "Traceback" not in refused.stderr
    with http_gateway(tmp_path, host="127.0.0.2", env={"CTX_AUTH_TOKEN": "t0ken-of-16-characters"}) as url:
        assert httpx2.post(url, json=INIT, headers=JSON_HEADERS).status_code == 401
        wrong = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        good = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"authorization": "Bearer t0ken-of-16-characters"})
        assert good.status_code == 200


async def test_tens_of_megabytes_through_stdio(tmp_path: Path) -> None:
    """A 40 MB upstream result passes through a real gateway process over stdio, byte for byte."""
    cfg = write_config(tmp_path, {"p": probe("p", timeout_seconds=300)})
    size = 40_000_000
    with open(tmp_path / "gw.err", "wb") as errlog:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            result = await session.send_request(
                types.CallToolRequest(
                    params=types.CallToolRequestParams(name="p__big", arguments={"size": size, "kind": "text"})
                ),
                types.CallToolResult,
            )
    text = text_of(result)
    assert len(text) == size
    assert text.startswith("2026-11-30T10:00:00Z INFO") and text.count("\n") == size // 69


def test_inspect_prints_table_and_fails_on_a_broken_server(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"good": probe("good"), "broken": probe("broken", "--fail-start")})
    out = run_cli("inspect", "--config", str(cfg))
    assert out.returncode == 2, out.stderr  # it exits at start: the setup must change
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert rows["good"].split()[2:4] == ["ok", "15"]
    assert rows["broken"].split()[2] == "failed"  # short state in the table, the reason below it
    below = " ".join(out.stdout.split())  # long reasons are wrapped below the table
    assert "broken: failed: " in below and "failing at start on purpose" in below
    assert "Traceback" not in out.stderr and "restarting in" not in out.stderr
    slow = write_config(
        tmp_path, {"good": probe("good"), "slow": probe("slow", "--hang-start", init_timeout_seconds=1)}
    )
    timed_out = run_cli("inspect", "--config", str(slow))
    assert timed_out.returncode == 1 and "did not finish initialize" in " ".join(timed_out.stdout.split())
    cfg_ok = write_config(tmp_path, {"good": probe("good")})
    ok = run_cli("inspect", "--config", str(cfg_ok))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_mcp_json_config_and_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host_config = {
        "mcpServers": {
            "my probe": {"command": PY, "args": probe("x")["args"], "env": {"A": "1"}},
            "remote": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
            "old-sse": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
            "sse-too": {"transport": "SSE", "url": "http://127.0.0.1:9/events"},
            "streamable": {"type": "streamable-http", "url": "http://127.0.0.1:9/mcp"},
            "unsaid": {"url": "http://127.0.0.1:9/sse"},
            "needs-npx": {"command": "npx-not-installed", "args": ["-y", "some-server"]},
        }
    }
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(host_config))
    out = subprocess.run([PY, "-m", "gateway", "import", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "[servers.my-probe]" in out.stdout and "[servers.remote]" in out.stdout
    assert '"Bearer ${TOKEN}"' in out.stdout
    assert "[gateway]\n" in out.stdout and "# context_window = " in out.stdout and "# tool_mode = " in out.stdout
    assert "# ingest_roots = " in out.stdout
    warnings = out.stderr.splitlines()
    assert any("'my probe' is named 'my-probe'" in w for w in warnings)
    assert any("'unsaid': its URL ends in /sse" in w and 'transport = "sse"' in w for w in warnings)
    assert any("'needs-npx': command not found: npx-not-installed" in w for w in warnings)
    assert len(warnings) == 3
    # the TOML it prints is a working config, and the mcp.json itself works as --config
    import tomllib

    converted = tomllib.loads(out.stdout)
    assert converted["servers"]["my-probe"]["env"] == {"A": "1"}
    # an SSE server, however the host spells it, is written enabled with its transport
    assert converted["servers"]["old-sse"] == {"url": "http://127.0.0.1:9/sse", "transport": "sse"}
    assert converted["servers"]["sse-too"]["transport"] == "sse"
    assert "transport" not in converted["servers"]["streamable"] and "transport" not in converted["servers"]["unsaid"]
    toml_path = tmp_path / "gateway.toml"
    toml_path.write_text(out.stdout)
    assert load_settings_ok(toml_path)
    from gateway.settings import load_settings

    monkeypatch.setenv("TOKEN", "x")  # ${VAR} is expanded from the gateway's environment when connecting
    settings = load_settings(path, environ={})
    assert settings.servers["my-probe"].command == PY
    assert settings.servers["remote"].expanded().headers["Authorization"] == "Bearer x"
    assert settings.servers["old-sse"].transport == "sse" and settings.servers["streamable"].transport == "http"


def load_settings_ok(path: Path) -> bool:
    from gateway.settings import load_settings

    return bool(load_settings(path, environ={}).servers)


def test_bad_config_is_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    cases = {
        "[gateway]\nmax_response_size = 10\n": "between 256 and 10485760",
        '[servers.x]\ncommand = "a"\nurl = "http://b"\n': "either `command`",
        '[servers."a b"]\ncommand = "a"\n': "server name",
        "[gateway\n": "not valid TOML",
    }
    for text, expected in cases.items():
        bad.write_text(text)
        out = subprocess.run(
            [PY, "-m", "gateway", "inspect", "--config", str(bad)], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 2 and expected in out.stderr and "Traceback" not in out.stderr, out.stderr
    missing = subprocess.run(
        [PY, "-m", "gateway", "--config", str(tmp_path / "nope.toml")], capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_settings_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    from gateway.settings import load_settings

    cfg = write_config(tmp_path, {}, budget=1000, port=9000)
    assert load_settings(cfg, environ={}).gateway.budget == 1000
    assert load_settings(cfg, environ={"CTX_BUDGET": "2000"}).gateway.budget == 2000
    assert load_settings(cfg, {"budget": 3000}, environ={"CTX_BUDGET": "2000"}).gateway.budget == 3000
    roots = load_settings(cfg, {"ingest_root": ["/a", "/b"]}, environ={}).plugins["documents"]["ingest_roots"]
    assert [str(r) for r in roots] == ["/a", "/b"]
    assert load_settings(cfg, environ={"CTX_LLM_MODEL": "qwen"}).llm.model == "qwen"


def test_plugin_selection_trace_and_unknown_plugin(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload", "monitor"])
    traced = run_cli("inspect", "--config", str(cfg), CTX_TRACE_PLUGINS="1")
    assert traced.returncode == 0, traced.stderr
    assert "trace offload.on_tools_listed" in traced.stderr and "trace monitor.on_tools_listed" in traced.stderr
    assert traced.stderr.index("trace offload") < traced.stderr.index("trace monitor")  # the configured order
    unknown = run_cli("inspect", "--config", str(cfg), "--plugins", "offload,nope")
    assert unknown.returncode == 2 and "plugin 'nope' is not installed" in unknown.stderr
    assert "known plugins: documents, memory, monitor, offload" in unknown.stderr


async def test_named_tokens_each_get_their_own_namespace(tmp_path: Path) -> None:
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, ["offload", "memory", "documents"])
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=gateway_env())
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_listening(f"http://127.0.0.1:{port}/nothing", proc)
        assert httpx2.post(url, json=INIT, headers=JSON_HEADERS).status_code == 401  # no token
        async with tenant_session(url, ALICE) as alice, tenant_session(url, BOB) as bob:
            big = await alice.call_tool("p__big", {"size": 300_000, "kind": "text"})
            rid = json.loads(text_of(big))["fileRef"]["id"]
            assert "/ns/alice/responses/" in json.loads(text_of(big))["fileRef"]["path"]
            mine = await alice.call_tool("response_outline", {"path": rid})
            assert not mine.is_error
            theirs = await bob.call_tool("response_outline", {"path": rid})
            assert theirs.is_error and rid not in text_of(theirs).split("Known response ids")[-1]
            await alice.call_tool("context_append", {"session_id": "plan", "text": "alice's secret plan"})
            peek = await bob.call_tool("context_recall", {"session_id": "plan", "query": "secret plan"})
            assert "alice" not in text_of(peek)
            await alice.call_tool("doc_ingest", {"text": "# Alice notes\n\nquarterly numbers", "title": "a"})
            assert (await bob.call_tool("doc_list", {})).structured_content["documents"] == []
            # usage figures are each connection's own: bob never sees alice's calls or offloads
            hers = (await alice.call_tool("context_status", {"session_id": "plan"})).structured_content or {}
            his = (await bob.call_tool("context_status", {"session_id": "plan"})).structured_content or {}
            assert hers["gateway"]["offload"]["offloaded"] == 1 and his["gateway"]["offload"]["offloaded"] == 0
            assert "~0 kept out" not in hers["gateway"]["usage"] and "~0 kept out" in his["gateway"]["usage"]
    finally:
        proc.terminate()
        proc.wait(15)
    assert (tmp_path / "ws" / "ns" / "alice" / "sessions" / "plan.jsonl").is_file()
    assert not (tmp_path / "ws" / "ns" / "bob" / "sessions" / "plan.jsonl").exists()
    assert not (tmp_path / "ws" / "sessions" / "plan.jsonl").exists()  # nor in the local user's namespace


def test_allowed_origins_admit_a_browser_client(tmp_path: Path) -> None:
    with http_gateway(tmp_path, "--allowed-origins", "https://app.example") as url:
        allowed = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"origin": "https://app.example"})
        assert allowed.status_code == 200
        other = httpx2.post(url, json=INIT, headers=JSON_HEADERS | {"origin": "https://evil.example"})
        assert other.status_code == 403
        # what the front does not serve is answered as Starlette answers it: another path, another method
        assert httpx2.post(url.replace("/mcp", "/other"), json=INIT, headers=JSON_HEADERS).status_code == 404
        assert httpx2.put(url, json=INIT, headers=JSON_HEADERS).status_code == 405
        assert httpx2.post(url.replace("/mcp", "/metrics"), headers=JSON_HEADERS).status_code == 405
        slash = httpx2.post(url + "/", json=INIT, headers=JSON_HEADERS)
        assert slash.status_code == 307 and slash.headers["location"].endswith("/mcp")


async def test_metrics_in_prometheus_text_under_the_same_rules(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with http_gateway(tmp_path) as url:  # loopback, no token: open like /mcp
        metrics_url = url.replace("/mcp", "/metrics")
        async with tenant_session(url, "") as host:
            await host.call_tool("p__echo", {"text": "hi"})
            await host.call_tool("p__fail", {})
        page = httpx2.get(metrics_url)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
        every = [s for family in text_string_to_metric_families(page.text) for s in family.samples]
        # every series names this gateway: HOST:PORT unless [gateway] replica_name says otherwise
        assert {s.labels.get("replica") for s in every} == {f"{socket.gethostname()}:{url.split(':')[2][:-4]}"}
        samples = {
            (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))): s.value for s in every
        }
        direct = (("server", "p"), ("tool", "echo"), ("via", "direct"))
        assert samples[("mcp_gateway_calls_total", direct)] == 1
        assert samples[("mcp_gateway_errors_total", (("server", "p"), ("tool", "fail"), ("via", "direct")))] == 1
        assert samples[("mcp_gateway_upstream_up", (("server", "p"),))] == 1
        assert samples[("mcp_gateway_call_seconds_count", (("server", "p"),))] == 2
        # a page from another site cannot read it (DNS rebinding: the Host header is checked)
        assert httpx2.get(metrics_url, headers={"host": "evil.example"}).status_code in (403, 421)
    with http_gateway(
        tmp_path, host="0.0.0.0", env={"CTX_AUTH_TOKEN": "t0ken-of-16-characters"}
    ) as url:  # off loopback
        metrics_url = url.replace("0.0.0.0", "127.0.0.1").replace("/mcp", "/metrics")
        assert httpx2.get(metrics_url).status_code == 401
        assert httpx2.get(metrics_url, headers={"authorization": "Bearer nope"}).status_code == 401
        good = httpx2.get(metrics_url, headers={"authorization": "Bearer t0ken-of-16-characters"})
        assert good.status_code == 200 and "mcp_gateway_upstream_up" in good.text


def test_a_session_belongs_to_the_token_that_opened_it(tmp_path: Path) -> None:
    """bob, holding alice's `mcp-session-id`, can neither use it nor end it: as for an unknown session."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, ["offload"])
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        as_alice = JSON_HEADERS | {"authorization": f"Bearer {ALICE}"}
        as_bob = JSON_HEADERS | {"authorization": f"Bearer {BOB}"}
        opened = httpx2.post(url, json=INIT, headers=as_alice)
        assert opened.status_code == 200
        sid = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert httpx2.post(url, json=initialized, headers=as_alice | {"mcp-session-id": sid}).status_code == 202
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        assert httpx2.post(url, json=listing, headers=as_bob | {"mcp-session-id": sid}).status_code == 404
        assert httpx2.delete(url, headers=as_bob | {"mcp-session-id": sid}).status_code == 404
        mine = httpx2.post(url, json=listing, headers=as_alice | {"mcp-session-id": sid})
        assert mine.status_code == 200 and "p__echo" in mine.text  # still hers, still open


async def test_an_upstream_question_never_reaches_another_tenant(tmp_path: Path) -> None:
    """While bob's call runs on the shared server (it waits on bob's own question), alice's call makes
    the server ask for a completion: the gateway cannot tell whose call asked, so it declines; bob's host
    is never sent alice's prompt. Alone on the server, her question goes to her own host."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    sampled: dict[str, list[str]] = {"alice": [], "bob": []}
    bob_asked, release_bob = anyio.Event(), anyio.Event()

    def sampler(who: str) -> Any:
        async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            sampled[who].append(params.messages[0].content.text)
            return types.CreateMessageResult(role="assistant", content=types.TextContent(text=f"{who}-says"), model="m")

        return sample

    async def bobs_elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        bob_asked.set()
        await release_bob.wait()
        return types.ElicitResult(action="accept", content={"name": "Bob"})

    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=httpx2.Timeout(30)) as ha,
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=httpx2.Timeout(30)) as hb,
            streamable_http_client(url, http_client=ha) as (ra, wa),
            streamable_http_client(url, http_client=hb) as (rb, wb),
            ClientSession(ra, wa, sampling_callback=sampler("alice")) as alice,
            ClientSession(rb, wb, sampling_callback=sampler("bob"), elicitation_callback=bobs_elicitation) as bob,
        ):
            await alice.initialize()
            await bob.initialize()
            bobs: list[Any] = []

            async def bobs_call() -> None:
                bobs.append(await bob.call_tool("p__ask", {}))

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(bobs_call)
                    await bob_asked.wait()  # bob's call is in flight on the server, waiting on bob
                    hers = await alice.call_tool("p__ask", {"via": "sampling"})
                    release_bob.set()
            assert sampled["bob"] == []  # never sent alice's prompt
            assert text_of(hers).startswith("refused:") and "declines" in text_of(hers), text_of(hers)
            assert text_of(bobs[0]) == "accept:Bob"
            assert text_of(await alice.call_tool("p__ask", {"via": "sampling"})) == "sampled:alice-says"


@asynccontextmanager
async def _modern_tenants(port: int) -> AsyncIterator[tuple[Any, Any]]:
    """alice's and bob's 2026-era hosts (sessionless: no mcp-session-id) on an HTTP gateway."""
    from mcp import Client

    url = f"http://127.0.0.1:{port}/mcp"
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=httpx2.Timeout(60)) as ha,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=httpx2.Timeout(60)) as hb,
        Client(streamable_http_client(url, http_client=ha)) as alice,
        Client(streamable_http_client(url, http_client=hb)) as bob,
    ):
        assert alice.protocol_version == bob.protocol_version == "2026-07-28"
        yield alice, bob


async def test_sessionless_tenants_see_only_their_own_figures(tmp_path: Path) -> None:
    """2026-era hosts over HTTP send no session id: each token's usage line, offload count and window
    ledger are still its own (they were one "http" connection for every tenant)."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, ["offload", "memory", "monitor"])
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with _modern_tenants(port) as (alice, bob):
            for _ in range(3):
                assert "fileRef" in text_of(await alice.session.call_tool("p__big", {"size": 300_000, "kind": "text"}))
            his = (await bob.session.call_tool("context_status", {"session_id": "s"})).structured_content or {}
            hers = (await alice.session.call_tool("context_status", {"session_id": "s"})).structured_content or {}
    assert his["gateway"]["offload"]["offloaded"] == 0 and hers["gateway"]["offload"]["offloaded"] == 3
    assert his["gateway"]["usage"] == "no calls through the gateway yet in this session"
    assert hers["gateway"]["usage"].startswith("3 calls")
    assert his["gateway"]["monitor"]["results"] < hers["gateway"]["monitor"]["results"]


async def test_one_tenants_open_rounds_never_evict_anothers(tmp_path: Path) -> None:
    """2026-era hosts over HTTP: bob opens an `input_required` round, then alice opens 260 she never
    answers (on a server of her own: on a shared one her questions could not be told from his, and are
    declined); bob's answer still resumes his call (a process-wide cap of 256 used to evict it)."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p"), "q": probe("q")}, [])
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with _modern_tenants(port) as (alice, bob):
            his = await bob.session.call_tool("p__ask", {}, allow_input_required=True)
            assert isinstance(his, types.InputRequiredResult)
            with anyio.fail_after(120):
                for _ in range(260):
                    hers = await alice.session.call_tool("q__ask", {}, allow_input_required=True)
                    assert isinstance(hers, types.InputRequiredResult)
            (key,) = his.input_requests
            answer = {key: types.ElicitResult(action="accept", content={"name": "Bob"})}
            done = await bob.session.call_tool(
                "p__ask", {}, input_responses=answer, request_state=his.request_state, allow_input_required=True
            )
            assert text_of(done) == "accept:Bob"


async def test_a_2026_hosts_calls_are_not_counted_as_listings(tmp_path: Path) -> None:
    """The SDK checks a 2026-era HTTP host's `Mcp-Param-*` headers against the called tool's schema: without
    a schema lookup of the gateway's own it ran the whole tools/list for every call with arguments, and
    the usage figures counted a listing per call."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with _modern_tenants(port) as (alice, _):
            for i in range(6):
                assert text_of(await alice.session.call_tool("p__echo", {"text": f"hi {i}"})) == f"hi {i}"
    rows = {(r["server"], r["tool"]): r for r in summary(tmp_path / "ws" / "stats.db")["rows"]}
    assert rows.get(("gateway", "tools/list"), {"calls": 0})["calls"] < 6


async def test_the_figures_of_the_last_calls_are_written_when_the_gateway_is_stopped(tmp_path: Path) -> None:
    """A signal used to cancel the stats writer before it wrote what was left: the calls of the last few
    seconds before a SIGTERM were lost from `stats`."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()) as proc:
        async with tenant_session(f"http://127.0.0.1:{port}/mcp", ALICE) as alice:
            for i in range(3):
                assert text_of(await alice.call_tool("p__echo", {"text": f"hi {i}"})) == f"hi {i}"
    assert proc.returncode is not None
    rows = {(r["server"], r["tool"]): r for r in summary(tmp_path / "ws" / "stats.db")["rows"]}
    assert rows[("p", "echo")]["calls"] == 3
