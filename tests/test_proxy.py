"""The proxy core against real upstream processes (stdio and Streamable HTTP)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import (
    PROBE,
    PY,
    Notes,
    call,
    eventually,
    free_port,
    inproc,
    make_settings,
    probe,
    run_cli,
    text_of,
    wait_listening,
    write_config,
)
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client

from gateway.proxy.routing import URI_SEP

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "servers" / "raw_server.py")  # a server without logging or completions
RAW_HTTP = str(Path(__file__).parent / "servers" / "raw_http_server.py")  # 2025-era HTTP, deaf to cancels


async def list_all_tools(session: ClientSession) -> list[types.Tool]:
    tools, cursor = [], None
    while True:
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        tools += page.tools
        if not (cursor := page.next_cursor):
            return tools


async def test_merges_tools_of_every_upstream_with_prefixes(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"alpha": probe("alpha"), "beta": probe("beta", "--extra-tools", "150")})
    async with inproc(settings) as (_, session):
        tools = await list_all_tools(session)
        names = {t.name for t in tools}
        # the probe pages its list by 5 and beta has 164 tools: both sides of pagination are exercised
        assert len(tools) == 15 + 165
        assert {"alpha__echo", "beta__echo", "beta__extra_149", "alpha__add"} <= names
        assert all(len(n) <= 64 for n in names)
        assert text_of(await call(session, "alpha__whoami")) == "alpha"
        assert text_of(await call(session, "beta__whoami")) == "beta"


async def test_results_are_forwarded_untouched(tmp_path: Path) -> None:
    """The same calls made directly and through the gateway give identical results."""
    settings = make_settings(tmp_path, {"p": probe("p")})
    cases = [("echo", {"text": "안녕 hello"}), ("add", {"a": 2, "b": 3}), ("image", {}), ("multi", {}), ("fail", {})]
    params = StdioServerParameters(command=PY, args=[PROBE, "--name", "p"])
    with open(tmp_path / "direct.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as streams, ClientSession(*streams) as direct:
            await direct.initialize()
            expected = [await call(direct, name, args) for name, args in cases]
    async with inproc(settings) as (_, session):
        got = [await call(session, f"p__{name}", args) for name, args in cases]
        direct_tools = {t.name: t for t in (await list_all_tools(session))}
    for (name, _), want, have in zip(cases, expected, got, strict=True):
        assert have.model_dump() == want.model_dump(), name
    assert got[1].structured_content == {"sum": 5.0} and got[1].meta == {"probe/trace": "abc"}
    assert got[4].is_error
    # output schemas are passed on as the upstream declared them (no plugins = transparent)
    assert direct_tools["p__add"].output_schema["required"] == ["sum"]


async def test_progress_reaches_host_and_resets_timeout(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p", timeout_seconds=0.6)})
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with inproc(settings) as (_, session):
        # 6 steps x 0.3 s = 1.8 s, three times the timeout: progress keeps the call alive
        result = await call(session, "p__progress", {"steps": 6, "delay": 0.3}, progress_callback=on_progress)
        assert not result.is_error, text_of(result)
        assert text_of(result) == "done after 6 steps"
        await eventually(lambda: len(seen) == 6)  # progress callbacks run in their own tasks
        assert [p for p, _, _ in seen] == [1, 2, 3, 4, 5, 6]
        assert seen[0][1:] == (6, "step 1")
        # without progress the same timeout cuts the call off, as an isError naming the server and the limit
        slow = await call(session, "p__slow", {"seconds": 30})
        assert slow.is_error and "'p'" in text_of(slow) and "within 1 s" in text_of(slow)


async def test_host_cancellation_reaches_upstream(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    settings = make_settings(tmp_path, {"p": probe("p", env={"PROBE_CANCEL_MARKER": str(marker)})})
    async with inproc(settings) as (_, session):
        assert text_of(await call(session, "p__echo", {"text": "ready"})) == "ready"  # the upstream is up
        async with anyio.create_task_group() as tg:

            async def slow_call() -> None:
                await call(session, "p__slow", {"seconds": 60})

            tg.start_soon(slow_call)
            await eventually(lambda: marker.exists() and marker.read_text() == "started")
            tg.cancel_scope.cancel()
        await eventually(lambda: marker.read_text() == "cancelled")
        assert text_of(await call(session, "p__echo", {"text": "still here"})) == "still here"


async def test_upstream_list_changed_reaches_host(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p")})
    notes = Notes()
    async with inproc(settings, notes) as (gateway, session):
        assert session.server_capabilities.tools.list_changed
        await gateway.wait_ready()
        # the start-up change has been handled (and pushed, if this host was known by then); the listing's
        # answer comes after any such push on the same stream
        await eventually(lambda: bool(gateway._listed))
        assert "p__grown" not in {t.name for t in await list_all_tools(session)}
        notes.changed = anyio.Event()
        await call(session, "p__grow")
        with anyio.fail_after(10):
            await notes.changed.wait()
        assert "p__grown" in {t.name for t in await list_all_tools(session)}
        assert text_of(await call(session, "p__grown")) == "grown"


async def test_crashed_upstream_fails_fast_and_is_restarted(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p"), "q": probe("q")})
    async with inproc(settings) as (gateway, session):
        crash = await call(session, "p__crash")
        assert crash.is_error and "'p'" in text_of(crash)
        # the other upstream is unaffected
        assert text_of(await call(session, "q__whoami")) == "q"
        # a call right after the crash fails fast with a clear message, not a hang
        with anyio.fail_after(5):  # the call timeout is 60 s: an answer within 5 s is not the timeout
            down = await call(session, "p__echo", {"text": "x"})
        if down.is_error:
            assert "'p'" in text_of(down) and ("restart" in text_of(down) or "not available" in text_of(down))
        # ...and the gateway brings it back
        with anyio.fail_after(20):
            while (r := await call(session, "p__echo", {"text": "back"})).is_error:
                await anyio.sleep(0.3)
        assert text_of(r) == "back"
        assert gateway.upstreams["p"].restarts >= 1


async def test_hung_upstream_times_out_and_is_restarted(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p", timeout_seconds=1, ping_seconds=1), "q": probe("q")})
    async with inproc(settings) as (gateway, session):
        pid_before = text_of(await call(session, "p__pid"))
        hung = await call(session, "p__hang")
        assert hung.is_error and "did not answer" in text_of(hung)
        assert text_of(await call(session, "q__whoami")) == "q"
        with anyio.fail_after(30):
            while (r := await call(session, "p__pid")).is_error:
                await anyio.sleep(0.3)
        assert text_of(r) != pid_before
        assert "ping" in gateway.upstreams["p"].error or gateway.upstreams["p"].restarts >= 1


async def test_a_burst_of_large_slow_results_is_no_sign_of_a_hung_upstream(tmp_path: Path) -> None:
    """6 results of 2 MB, each taking longer than the ping timeout (0.5 s) to write: the health check's
    ping waits behind them on the pipe for seconds, yet the server is sending all along. It is not
    restarted, and every call answers. (The server writes them one after another: 6 make a burst of
    3.6 s, several pings' timeouts long, as 16 did in 9.6 s.)"""
    raw = {"command": PY, "args": [RAW, "--slow-big"], "ping_seconds": 0.5}
    settings = make_settings(tmp_path, {"r": raw})
    size, results = 2_000_000, {}
    async with inproc(settings) as (gateway, session):

        async def one(i: int) -> None:
            results[i] = await call(session, "r__slow_big", {"size": size, "pieces": 20, "pause": 0.03})

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(one, i)
        # every call answered whole (a restart fails them all with "went away"), and no restart began
        assert [len(text_of(results[i])) for i in range(6)] == [size] * 6, text_of(results[5])[:300]
        upstream = gateway.upstreams["r"]
        assert upstream.restarts == 0 and upstream.state == "ok" and upstream.raw.ready, upstream.error


async def test_failed_start_is_reported_and_others_work(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        {
            "bad": probe("bad", "--fail-start"),
            "gone": {"command": "no-such-command-xyz"},
            "slow": probe("slow", "--hang-start", init_timeout_seconds=1),
            "ok": probe("ok"),
        },
    )
    async with inproc(settings) as (gateway, session):
        names = {t.name for t in await list_all_tools(session)}
        assert "ok__echo" in names and not any(n.startswith("bad__") for n in names)
        bad = gateway.upstreams["bad"]
        with anyio.fail_after(10):  # between restarts it is "starting" again: wait for a failed state
            while bad.state != "failed":
                await anyio.sleep(0.05)
        assert "failing at start on purpose" in bad.error
        assert "command not found" in gateway.upstreams["gone"].error
        with anyio.fail_after(10):
            while "initialize" not in gateway.upstreams["slow"].error:
                await anyio.sleep(0.1)
        assert "raise init_timeout_seconds" in gateway.upstreams["slow"].error
        result = await call(session, "bad__echo", {"text": "x"})
        assert result.is_error and "'bad'" in text_of(result)
        assert text_of(await call(session, "ok__whoami")) == "ok"
        # it is retried with backoff, not given up on
        with anyio.fail_after(10):
            while bad.restarts < 2:
                await anyio.sleep(0.1)
    log_text = (tmp_path / "ws" / "logs" / "bad.log").read_text()
    assert "failing at start on purpose" in log_text


async def test_http_upstream_and_reinitialize_after_restart(tmp_path: Path) -> None:
    port = free_port()
    cmd = [PY, PROBE, "--name", "web", "--http", str(port)]
    server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        settings = make_settings(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp", "ping_seconds": 1}})
        async with inproc(settings) as (gateway, session):
            with anyio.fail_after(20):
                while gateway.upstreams["web"].state != "ok":
                    await anyio.sleep(0.2)
            assert text_of(await call(session, "web__whoami")) == "web"
            add = await call(session, "web__add", {"a": 1, "b": 2})
            assert add.structured_content == {"sum": 3.0}
            # restart the HTTP server: its sessions are gone ("session not found"), the gateway re-initializes
            server.terminate()
            server.wait(10)
            server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with anyio.fail_after(40):
                while (r := await call(session, "web__whoami")).is_error:
                    await anyio.sleep(0.3)
            assert text_of(r) == "web"
    finally:
        server.terminate()
        server.wait(10)


async def test_an_sse_upstream(tmp_path: Path) -> None:
    """A server on the older HTTP+SSE transport (protocol 2024-11-05, which many still serve): with
    transport = "sse" it is listed and called, and a large result streams to a file; at the Streamable
    HTTP default its /sse URL fails with one line saying what to set. A host's mcp.json entry
    `"type": "sse"` works as --config."""
    port = free_port()
    server = subprocess.Popen([PY, PROBE, "--name", "old", "--sse", str(port)], stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/sse"
    try:
        wait_listening(f"http://127.0.0.1:{port}/nothing", server)
        servers = {"old": {"url": url, "transport": "sse"}, "unsaid": {"url": url}}
        async with inproc(make_settings(tmp_path, servers, plugins=["offload"])) as (gateway, session):
            await eventually(lambda: gateway.upstreams["old"].state == "ok", 20, "the SSE upstream is ready")
            assert text_of(await call(session, "old__whoami")) == "old"
            assert (await call(session, "old__add", {"a": 1, "b": 2})).structured_content == {"sum": 3.0}
            for size in (2_000_000, 6_000_000):  # over the SSE client's 1 MiB an event; over the spill threshold
                reply = json.loads(text_of(await call(session, "old__big", {"size": size})))
                saved = json.loads(Path(reply["fileRef"]["path"]).read_text())
                assert saved["meta"]["n"] == len(saved["data"]) == size // 80
            assert gateway.spiller is not None and gateway.spiller.spooled == 1, "the long event went through the spool"
            await eventually(lambda: gateway.upstreams["unsaid"].state == "failed", 20, "Streamable HTTP is refused")
            error = gateway.upstreams["unsaid"].error
            assert "HTTP 405" in error and 'set transport = "sse" in [servers.unsaid]' in error, error
        host_config = tmp_path / "mcp.json"
        host_config.write_text(json.dumps({"mcpServers": {"old": {"type": "sse", "url": url}}}))
        env = {"CTX_WORKSPACE": str(tmp_path / "ws2"), "CTX_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        out = await anyio.to_thread.run_sync(lambda: run_cli("inspect", "--config", str(host_config), **env))
        assert out.returncode == 0, out.stdout + out.stderr
        row = next(line.split() for line in out.stdout.splitlines() if line.startswith("old "))
        assert row[1:3] == ["sse", "ok"], out.stdout
    finally:
        server.terminate()
        server.wait(10)


async def test_a_late_reply_over_http_to_a_cancelled_call_leaves_no_files(tmp_path: Path) -> None:
    """A 2025-era HTTP upstream deaf to cancels sends its 6 MB reply after the host gave up: the reply is
    spooled as it streams, the SDK drops it, and its files go with it (they stayed for 15 minutes)."""
    port = free_port()
    server = subprocess.Popen([PY, RAW_HTTP, str(port)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        settings = make_settings(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}, plugins=["offload"])
        spill_dir = tmp_path / "ws" / "spill"
        async with inproc(settings) as (gateway, session):
            await eventually(lambda: gateway.upstreams["web"].state == "ok", 20, "the HTTP upstream is ready")
            marker = tmp_path / "called"
            args = {"size": 6_000_000, "delay": 1, "marker": str(marker)}
            async with anyio.create_task_group() as tg:
                tg.start_soon(session.call_tool, "web__late_big", args)
                await eventually(marker.exists, 30, "the upstream has the call")
                tg.cancel_scope.cancel()  # the host gives up; the reply comes a second later
            assert text_of(await call(session, "web__echo", {"text": "after"})) == "after"
            await eventually(spill_dir.is_dir, 30, "the late reply is spooled as it arrives")
            await eventually(lambda: not any(spill_dir.iterdir()), 30, "the late reply's files are removed")
    finally:
        server.terminate()
        server.wait(10)


async def test_calls_to_an_http_upstream_reuse_one_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's client stops reading a POST's event stream at its response; unless the gateway reads the
    rest, each call closes its connection and the next one opens a new one (TCP set-up on every call)."""
    import socket

    port = free_port()
    server = subprocess.Popen([PY, PROBE, "--name", "web", "--http", str(port)], stdin=subprocess.DEVNULL)
    connects: list[Any] = []
    real = socket.socket.connect

    def counting(sock: socket.socket, address: Any) -> Any:
        if address[1:2] == (port,):
            connects.append(address)
        return real(sock, address)

    try:
        settings = make_settings(tmp_path, {"web": {"url": f"http://127.0.0.1:{port}/mcp"}}, plugins=["offload"])
        async with inproc(settings) as (gateway, session):
            await eventually(lambda: gateway.upstreams["web"].state == "ok", 20, "the HTTP upstream is ready")
            monkeypatch.setattr(socket.socket, "connect", counting)
            for i in range(20):
                assert text_of(await call(session, "web__echo", {"text": f"call {i}"})) == f"call {i}"
    finally:
        server.terminate()
        server.wait(10)
    assert len(connects) <= 2, f"{len(connects)} connections for 20 calls"


async def test_resources_templates_and_prompts_are_namespaced(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"a": probe("a"), "b": probe("b")})
    async with inproc(settings) as (_, session):
        uris = sorted(r.uri for r in (await session.list_resources()).resources)
        assert uris == ["a+mem://greeting", "b+mem://greeting"]
        read = await session.read_resource("b+mem://greeting")
        assert read.contents[0].text == "hello from b" and read.contents[0].uri == "b+mem://greeting"
        templates = (await session.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {"a+mem://item/{id}", "b+mem://item/{id}"}
        assert (await session.read_resource("a+mem://item/7")).contents[0].text == "item at mem://item/7"
        prompts = {p.name for p in (await session.list_prompts()).prompts}
        assert prompts == {"a__greet", "b__greet"}
        got = await session.get_prompt("a__greet", {"who": "민수"})
        assert got.messages[0].content.text == "Say hello to 민수."
        with pytest.raises(MCPError, match="Unknown resource"):
            await session.read_resource("mem://greeting")


async def test_a_resource_asked_by_its_own_uri(tmp_path: Path) -> None:
    """A host that asks for a URI as the server gave it (unprefixed) reaches the one server that lists it
    (or the only one offering resources) and gets the URI back as it asked."""
    settings = make_settings(tmp_path, {"a": probe("a")})
    async with inproc(settings) as (_, session):
        read = await session.read_resource("mem://greeting")
        assert read.contents[0].text == "hello from a" and read.contents[0].uri == "mem://greeting"
        assert (await session.read_resource("mem://item/3")).contents[0].text == "item at mem://item/3"


async def test_filters_env_expansion_and_unknown_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_SECRET", "s3cret")
    servers = {
        "p": probe("p", env={"TOKEN": "${PROBE_SECRET}"}, tools={"include": ["env", "echo"]}),
        "q": probe("q", tools={"exclude": ["crash", "hang"]}, prefix=False),
    }
    settings = make_settings(tmp_path, servers)
    async with inproc(settings) as (_, session):
        names = {t.name for t in await list_all_tools(session)}
        assert {n for n in names if n.startswith("p__")} == {"p__env", "p__echo"}
        assert "whoami" in names and "crash" not in names and "q__whoami" not in names
        assert text_of(await call(session, "p__env", {"name": "TOKEN"})) == "s3cret"
        # the gateway's own environment is not leaked to children
        assert text_of(await call(session, "p__env", {"name": "PROBE_SECRET"})) == ""
        unknown = await call(session, "nope__tool")
        assert unknown.is_error and "Unknown tool" in text_of(unknown)


async def test_tool_overrides_rename_and_describe(tmp_path: Path) -> None:
    """`tools = { rename, describe }`: the host sees a tool by its new name and description, in direct and
    catalog mode; a call by the new name reaches the upstream by its own; include keeps the own names. A
    rename naming no tool, or giving a name another tool shows, is a one-line config problem."""
    tools = {"include": ["echo", "add"], "rename": {"echo": "say"}, "describe": {"echo": "Say it back."}}
    settings = make_settings(tmp_path, {"p": probe("p", tools=tools)})
    async with inproc(settings) as (gateway, session):
        listed = {t.name: t for t in await list_all_tools(session)}
        assert {n for n in listed if n.startswith("p__")} == {"p__say", "p__add"}
        assert listed["p__say"].description == "Say it back."
        assert listed["p__say"].input_schema["properties"] == {"text": {"type": "string"}}
        assert text_of(await call(session, "p__say", {"text": "hi"})) == "hi"
        assert (await call(session, "p__echo", {"text": "hi"})).is_error
        assert gateway.routing.config_problems == []
    catalog = make_settings(tmp_path, {"p": probe("p", tools=tools)}, tool_mode="catalog")
    async with inproc(catalog) as (_, session):
        found = (await call(session, "tool_search", {"query": "say it back"})).structured_content["tools"]
        assert found[0]["name"] == "p__say", found
        schema = (await call(session, "tool_schema", {"name": "p__say"})).structured_content
        assert schema["description"] == "Say it back."
        via = await call(session, "tool_call", {"name": "p__say", "arguments": {"text": "via catalog"}})
        assert text_of(via) == "via catalog"
    wrong = {"rename": {"ecko": "say", "add": "whoami"}, "describe": {"pingg": "x"}}
    out = await anyio.to_thread.run_sync(
        lambda: run_cli("inspect", "--config", str(write_config(tmp_path, {"p": probe("p", tools=wrong)})))
    )
    assert out.returncode == 2, out.stdout + out.stderr
    report = " ".join(out.stdout.split())
    assert "config: server 'p': tools.rename names 'ecko', which it does not list (did you mean 'echo'?)" in report
    assert "tools.describe names 'pingg'" in report
    assert "tools.rename 'add' = 'whoami' collides with its tool 'whoami': choose another name" in report
    assert "Traceback" not in out.stderr


async def test_collisions_are_reported_never_dropped(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"a": probe("a", prefix=False), "b": probe("b", prefix=False)})
    async with inproc(settings) as (gateway, session):
        names = {t.name for t in await list_all_tools(session)}
        assert "whoami" in names and "b__whoami" in names
        assert text_of(await call(session, "whoami")) == "a"
        assert text_of(await call(session, "b__whoami")) == "b"
        assert any("'whoami'" in c and "'b'" in c and "'a'" in c for c in gateway.routing.collisions)


async def test_2026_era_host_can_list_and_call(tmp_path: Path) -> None:
    from mcp import Client

    settings = make_settings(tmp_path, {"p": probe("p")})
    from gateway.proxy.server import Gateway

    gateway = Gateway(settings, plugins=[])
    async with gateway.running(), Client(gateway.server) as client:
        assert client.protocol_version == "2026-07-28"
        tools = await client.list_tools()
        assert "p__echo" in {t.name for t in tools.tools}
        result = await client.call_tool("p__echo", {"text": "modern"})
        assert text_of(result) == "modern"
        # list_changed reaches 2026-era hosts on their subscriptions/listen stream
        async with client.listen(tools_list_changed=True) as subscription:
            await client.call_tool("p__grow", {})
            with anyio.fail_after(10):
                event = await subscription.__anext__()
            assert type(event).__name__ == "ToolsListChanged"
        assert "p__grown" in {t.name for t in (await client.list_tools()).tools}


async def test_2026_replies_on_the_wire(tmp_path: Path) -> None:
    """Raw 2026-era requests (the `_meta` envelope on each): every reply carries `resultType`, list replies
    `ttlMs` and `cacheScope` (0 and private: the upstream sessions are handshake-era, so nothing may be
    cached), and completion reaches the upstream without the host's envelope."""
    from mcp.shared.memory import create_client_server_memory_streams
    from mcp.shared.message import SessionMessage

    from gateway.proxy.server import Gateway

    envelope = {
        types.PROTOCOL_VERSION_META_KEY: "2026-07-28",
        types.CLIENT_INFO_META_KEY: {"name": "raw", "version": "1"},
        types.CLIENT_CAPABILITIES_META_KEY: {},
    }
    requests = [
        ("tools/list", {}),
        ("tools/call", {"name": "p__echo", "arguments": {"text": "x"}}),
        ("resources/list", {}),
        ("prompts/get", {"name": "p__greet", "arguments": {"who": "a"}}),
        (
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "p__greet"}, "argument": {"name": "who", "value": ""}},
        ),
    ]
    gateway = Gateway(make_settings(tmp_path, {"p": probe("p")}), plugins=[])
    async with gateway.running(), create_client_server_memory_streams() as ((read, write), server_streams):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.server.run, *server_streams, gateway.server.create_initialization_options())
            await gateway.wait_ready()
            for i, (method, params) in enumerate(requests, 1):
                message = types.JSONRPCRequest(jsonrpc="2.0", id=i, method=method, params={**params, "_meta": envelope})
                await write.send(SessionMessage(message))
                with anyio.fail_after(10):
                    reply = (await read.receive()).message.model_dump(by_alias=True, exclude_none=True)
                assert "result" in reply, (method, reply)
                assert reply["result"]["resultType"] == "complete", method
                if method.endswith("/list"):
                    assert (reply["result"]["ttlMs"], reply["result"]["cacheScope"]) == (0, "private")
            tg.cancel_scope.cancel()


async def test_2026_listen_stream_watches_resources_at_their_server(tmp_path: Path) -> None:
    """A 2026-era host watching a resource through subscriptions/listen: the gateway subscribes at the
    server that owns it (the probe answers with an update at once), relays the update on the stream, and
    unsubscribes when the stream ends."""
    from mcp import Client

    from gateway.proxy.server import Gateway

    settings = make_settings(tmp_path, {"p": probe("p")})
    gateway = Gateway(settings, plugins=[])
    uri = f"p{URI_SEP}mem://subscriptions"
    async with gateway.running(), Client(gateway.server) as client:
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            with anyio.fail_after(10):
                event = await subscription.__anext__()
            assert type(event).__name__ == "ResourceUpdated" and event.uri == uri
            watched = (await client.read_resource(uri)).contents[0].text
            assert json.loads(watched) == ["mem://subscriptions"]  # the server itself was asked
        with anyio.fail_after(10):
            while json.loads((await client.read_resource(uri)).contents[0].text):
                await anyio.sleep(0.05)
        assert uri not in gateway.notices.subscribers


async def test_2026_log_level_per_request(tmp_path: Path) -> None:
    """A 2026-era host opts in to log messages per request (`_meta` logLevel): an upstream's messages
    during that call reach it on the call's own stream, at that level and above, tagged with the server;
    a call without the key gets none."""
    from mcp import Client

    from gateway.proxy.server import Gateway

    received: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params)

    settings = make_settings(tmp_path, {"p": probe("p")})
    gateway = Gateway(settings, plugins=[])
    async with gateway.running(), Client(gateway.server, logging_callback=on_log) as client:
        assert client.protocol_version == "2026-07-28"
        quiet = await client.call_tool("p__echo", {"text": "a", "log": True})
        assert text_of(quiet) == "a" and received == []
        loud = await client.call_tool("p__echo", {"text": "b", "log": True}, meta={types.LOG_LEVEL_META_KEY: "info"})
        assert text_of(loud) == "b"
        assert [(m.level, m.data, m.logger) for m in received] == [
            ("info", "info from p", "p/probe"),
            ("warning", "warning from p", "p/probe"),
        ]


@pytest.mark.parametrize("mode", ["direct", "catalog"])
async def test_2026_host_answers_upstream_questions_by_multi_round_trip(tmp_path: Path, mode: str) -> None:
    """An upstream asks during a call (elicitation, sampling): a 2026-era host cannot be sent a request,
    so the call answers `input_required` with the question; the host's retry carries the answer to the
    waiting upstream, whose result answers the retry - directly and through catalog mode's tool_call."""
    from mcp import Client

    from gateway.proxy.server import Gateway

    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Mina"})

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text="teal"), model="m")

    settings = make_settings(tmp_path, {"p": probe("p")}, tool_mode=mode)
    gateway = Gateway(settings, plugins=[])

    async def ask(client: Any, args: dict[str, Any]) -> str:
        if mode == "direct":
            return text_of(await client.call_tool("p__ask", args))
        return text_of(await client.call_tool("tool_call", {"name": "p__ask", "arguments": args}))

    async with (
        gateway.running(),
        Client(gateway.server, elicitation_callback=on_elicit, sampling_callback=on_sample) as client,
    ):
        assert client.protocol_version == "2026-07-28"
        assert await ask(client, {}) == "accept:Mina"
        assert await ask(client, {"via": "sampling"}) == "sampled:teal"
        assert asked == ["What is your name?", "Name a colour."]
        assert not gateway.exchanges.open  # settled exchanges are not kept
    # a requestState that names nothing is refused
    async with gateway.running(), Client(gateway.server) as client:
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await client.session.call_tool("p__echo", {"text": "x"}, request_state="forged", allow_input_required=True)
        # one another replica issued (a load balancer sent the retry here): said plainly, with what to do
        with pytest.raises(MCPError, match=r"issued by another gateway process .* sticky per client"):
            await client.session.call_tool(
                "p__echo", {"text": "x"}, request_state="0badc0de.abcdefgh", allow_input_required=True
            )


def test_stderr_goes_to_per_server_log_and_children_stop_on_sigterm(tmp_path: Path) -> None:
    """A real gateway process: children are stopped on SIGTERM and on host disconnect."""
    from conftest import gateway_env, write_config

    for how in ("sigterm", "eof"):
        cfg = write_config(tmp_path, {"p": probe("p")})
        proc = subprocess.Popen(
            [PY, "-m", "gateway", "--config", str(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=gateway_env(),
        )
        pid = _pid_through_gateway(proc)
        assert _alive(pid)
        if how == "sigterm":
            proc.terminate()
        else:
            proc.stdin.close()
        proc.wait(15)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), f"upstream survived the gateway ({how})"
    assert "probe p starting" in (tmp_path / "ws" / "logs" / "p.log").read_text()


def _pid_through_gateway(proc: subprocess.Popen) -> int:
    import json

    def send(msg: dict) -> None:
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    def read(want_id: int) -> dict:
        while True:
            line = proc.stdout.readline()
            assert line, "gateway closed stdout"
            msg = json.loads(line)
            if msg.get("id") == want_id:
                return msg

    send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
    )
    read(1)
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "p__pid", "arguments": {}}})
    reply = read(2)
    return int(reply["result"]["content"][0]["text"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_names_hosts_reject_are_made_safe_and_still_route(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p", env={"PROBE_WEIRD_NAMES": "1"})})
    async with inproc(settings) as (_, session):
        names = {t.name for t in await list_all_tools(session)}
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in names), sorted(names)
        odd = sorted(n for n in names if n.startswith("p__read") or n.startswith("p__say") or n.startswith("p__xx"))
        assert len(odd) == 4 and len(set(odd)) == 4
        for name in odd:
            assert not (await call(session, name)).is_error, name
        assert text_of(await call(session, next(n for n in odd if n.startswith("p__read")))) == "read.file/v2"


async def test_upstream_elicitation_reaches_the_host_that_made_the_call(tmp_path: Path) -> None:
    asked: list[str] = []

    async def on_elicit(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        await anyio.sleep(1.5)  # the user takes longer than the call's timeout: the clock is paused
        return types.ElicitResult(action="accept", content={"name": "Mina"})

    settings = make_settings(tmp_path, {"p": probe("p", timeout_seconds=1)})
    async with inproc(settings, elicitation_callback=on_elicit) as (_, session):
        assert text_of(await call(session, "p__ask")) == "accept:Mina"
        assert asked == ["What is your name?"]
    # a host that cannot answer elicitation: the upstream is told no, nothing hangs
    async with inproc(settings) as (_, session):
        assert text_of(await call(session, "p__ask")) == "decline:"


async def test_upstream_sampling_reaches_the_host_that_made_the_call(tmp_path: Path) -> None:
    """An upstream's sampling/createMessage during a call goes to the host that made it (when that host
    offers sampling), with the call's clock paused; a host without sampling gets the upstream an error."""
    asked: list[str] = []

    async def on_sample(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params.messages[0].content.text)
        await anyio.sleep(1.5)  # the model takes longer than the call's timeout: the clock is paused
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text="teal"), model="m")

    settings = make_settings(tmp_path, {"p": probe("p", timeout_seconds=1)})
    async with inproc(settings, sampling_callback=on_sample) as (_, session):
        assert text_of(await call(session, "p__ask", {"via": "sampling"})) == "sampled:teal"
        assert asked == ["Name a colour."]
    async with inproc(settings) as (_, session):
        refused = text_of(await call(session, "p__ask", {"via": "sampling"}))
        assert refused.startswith("refused:") and "does not offer it" in refused


async def test_old_style_tool_definitions_are_repaired_not_fatal(tmp_path: Path) -> None:
    raw = str(Path(__file__).parent / "servers" / "raw_server.py")
    settings = make_settings(tmp_path, {"old": {"command": PY, "args": [raw]}, "p": probe("p")})
    async with inproc(settings) as (gateway, session):
        tools = {t.name: t for t in await list_all_tools(session)}
        assert gateway.upstreams["old"].state == "ok"
        assert tools["old__legacy_echo"].input_schema["type"] == "object"
        assert tools["old__legacy_echo"].input_schema["properties"] == {"text": {"type": "string"}}
        assert tools["old__no_schema"].input_schema == {"type": "object"}
        assert text_of(await call(session, "old__legacy_echo", {"text": "hi"})) == "legacy_echo:hi"
        assert text_of(await call(session, "p__whoami")) == "p"


async def test_one_bad_tool_schema_never_hides_the_other_tools(tmp_path: Path) -> None:
    raw = str(Path(__file__).parent / "servers" / "raw_server.py")
    servers = {"bad": {"command": PY, "args": [raw, "--bad-schemas"]}, "p": probe("p")}
    async with inproc(make_settings(tmp_path, servers, plugins=["offload"])) as (gateway, session):
        tools = {t.name: t for t in await list_all_tools(session)}  # the host's tools/list succeeds
        assert {"bad__legacy_echo", "p__echo", "response_outline"} <= set(tools)
        assert tools["bad__prop_number"].input_schema["properties"] == {"b": {"type": "string"}}
        assert "required" not in tools["bad__required_str"].input_schema
        assert any("props_list" in line and "repaired" in line for line in gateway.routing.dropped)
    report = run_cli("inspect", "--config", str(write_config(tmp_path, servers)))
    assert (
        report.returncode == 1 and "tool 'prop_number' of server 'bad': its input schema was repaired" in report.stdout
    )


@pytest.mark.parametrize("tool_mode", ["direct", "catalog"])
async def test_requests_right_after_start_wait_for_a_slow_upstream(tmp_path: Path, tool_mode: str) -> None:
    """A host that asks at once (before the upstream finished starting) gets the prompt, the resource
    and, in catalog mode, the tool search results — not "unknown" (the upstream takes 1.5 s to start)."""
    settings = make_settings(tmp_path, {"slow": probe("slow", "--start-delay", "1.5")}, tool_mode=tool_mode)
    async with inproc(settings) as (gateway, session):
        assert gateway.upstreams["slow"].state == "starting"
        # all three asked at once while it starts (one gateway's start, not one each): each must wait
        answers: dict[str, Any] = {}

        async def ask(what: str, request: Any) -> None:
            answers[what] = await request()

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "prompt", lambda: session.get_prompt("slow__greet", {"who": "Ada"}))
            tg.start_soon(ask, "resource", lambda: session.read_resource(f"slow{URI_SEP}mem://greeting"))
            if tool_mode == "catalog":
                tg.start_soon(ask, "tool", lambda: call(session, "tool_search", {"query": "echo the text back"}))
            else:
                tg.start_soon(ask, "tool", lambda: call(session, "slow__echo", {"text": "hi"}))
            await anyio.sleep(0)  # every request is sent while the upstream is still starting
            assert gateway.upstreams["slow"].state == "starting"
        assert answers["prompt"].messages[0].content.text == "Say hello to Ada."
        assert answers["resource"].contents[0].text == "hello from slow"
        if tool_mode == "catalog":
            assert "slow__echo" in text_of(answers["tool"])
        else:
            assert text_of(answers["tool"]) == "hi"


async def test_the_merged_list_keeps_its_order_whatever_order_upstreams_list_in(tmp_path: Path) -> None:
    """An upstream that lists its tools in a new order after a change: the tools the host already
    knew keep their order (and bytes), so a local model's prompt cache stays valid."""
    notes = Notes()
    settings = make_settings(tmp_path, {"p": probe("p", "--shuffle", "--extra-tools", "6"), "q": probe("q")})
    async with inproc(settings, notes) as (gateway, session):
        await gateway.wait_ready()
        await eventually(lambda: bool(gateway._listed))  # the start-up change is handled and pushed
        before = [t.model_dump_json() for t in await list_all_tools(session)]
        assert [json.loads(t)["name"] for t in before][:3] == ["p__add", "p__ask", "p__big"]
        notes.changed = anyio.Event()
        await call(session, "p__grow")
        with anyio.fail_after(10):
            await notes.changed.wait()
        after = [t.model_dump_json() for t in await list_all_tools(session)]
        assert [t for t in after if '"p__grown"' not in t] == before
        assert [json.loads(t)["name"] for t in after].index("p__grown") < [json.loads(t)["name"] for t in after].index(
            "q__add"
        )


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_completion_and_logging_pass_through(tmp_path: Path, transport: str) -> None:
    """completion/complete reaches the server that owns the prompt or template; logging/setLevel reaches
    every server that declares logging, and their log messages come back tagged with the server."""
    server = None
    if transport == "http":
        port = free_port()
        server = subprocess.Popen([PY, PROBE, "--name", "web", "--http", str(port)], stderr=subprocess.DEVNULL)
        web = {"url": f"http://127.0.0.1:{port}/mcp"}
    else:
        web = probe("web")
    logs: list[types.LoggingMessageNotificationParams] = []

    class Logs(Notes):
        async def __call__(self, message: object) -> None:
            await super().__call__(message)
            if isinstance(message, types.LoggingMessageNotification):
                logs.append(message.params)

    try:
        settings = make_settings(tmp_path, {"web": web, "raw": {"command": PY, "args": [RAW]}})
        async with inproc(settings, Logs()) as (gateway, session):
            await eventually(lambda: gateway.upstreams["web"].state == "ok", 20)
            assert session.server_capabilities.completions is not None
            done = await session.complete(types.PromptReference(name="web__greet"), {"name": "who", "value": "A"})
            assert done.completion.values == ["Ada", "Alan"]
            ref = types.ResourceTemplateReference(uri=f"web{URI_SEP}mem://item/{{id}}")
            done = await session.complete(ref, {"name": "id", "value": "1"})
            assert done.completion.values == ["1", "10"]
            await session.set_logging_level("warning")
            await eventually(lambda: bool(logs), 10, "the log message relayed")
            assert logs[0].logger == "web/probe" and logs[0].data == {"level set": "warning", "by": "web"}
            assert logs[0].level == "warning"
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


async def test_resource_subscriptions_pass_through(tmp_path: Path) -> None:
    """resources/subscribe reaches the server that owns the resource, its notifications/resources/updated
    come back under the gateway's URI, and unsubscribe is forwarded when the last host lets go."""
    updates: list[str] = []

    class Updates(Notes):
        async def __call__(self, message: object) -> None:
            await super().__call__(message)
            if isinstance(message, types.ResourceUpdatedNotification):
                updates.append(str(message.params.uri))

    settings = make_settings(tmp_path, {"p": probe("p"), "raw": {"command": PY, "args": [RAW]}})
    async with inproc(settings, Updates()) as (_, session):
        assert session.server_capabilities.resources.subscribe
        uri = f"p{URI_SEP}mem://greeting"
        watched = f"p{URI_SEP}mem://subscriptions"
        await session.subscribe_resource(uri)
        await eventually(lambda: updates == [uri], 10, "the update relayed")
        assert json.loads((await session.read_resource(watched)).contents[0].text) == ["mem://greeting"]
        await session.unsubscribe_resource(uri)
        assert json.loads((await session.read_resource(watched)).contents[0].text) == []
        with pytest.raises(MCPError, match="does not offer resource subscriptions"):
            await session.subscribe_resource(f"raw{URI_SEP}mem://x")


@pytest.mark.parametrize("frozen", [False, True])
async def test_a_tool_definition_that_changes_is_reported_and_can_be_frozen(tmp_path: Path, frozen: bool) -> None:
    """The probe's echo tool gains an argument and new wording after the host listed it: the gateway
    reports the change; with freeze_definitions the host keeps the first definition and calls are
    refused with what changed; `inspect` in a later run shows the change too."""
    notes = Notes()
    # the same config entry in the later run (an edited one would take the definitions anew)
    servers = {"p": probe("p", "--mutate", "grow", "--mutate-when", str(tmp_path / "mutated"))}
    settings = make_settings(tmp_path, servers, freeze_definitions=frozen)
    async with inproc(settings, notes) as (gateway, session):
        await gateway.wait_ready()
        await eventually(lambda: bool(gateway._listed))
        first = {t.name: t for t in await list_all_tools(session)}["p__echo"]
        notes.changed = anyio.Event()
        await call(session, "p__grow")
        with anyio.fail_after(10):
            await notes.changed.wait()
        now = {t.name: t for t in await list_all_tools(session)}
        assert "p__grown" in now
        change = gateway.routing.changed["p__echo"]
        assert "description" in change and "input schema (+exfil)" in change
        result = await call(session, "p__echo", {"text": "hi"})
        if frozen:
            assert now["p__echo"] == first
            assert result.is_error and "+exfil" in text_of(result) and "mcp-context-gateway accept p" in text_of(result)
        else:
            assert "evil.example" in (now["p__echo"].description or "")
            assert text_of(result) == "hi"
    (tmp_path / "mutated").touch()  # echo changed from the start
    out = run_cli("inspect", "--config", str(settings.config_path))
    assert "changed: tool 'echo' of server 'p' changed its definition: description, input schema (+exfil)" in out.stdout


async def test_two_retries_of_one_round_at_once_are_both_answered(tmp_path: Path) -> None:
    """A 2026 host retries one `input_required` round twice at once (same requestState): one gets the
    upstream's result, the other is told at once that the round is being answered; neither waits forever."""
    from mcp import Client

    from gateway.proxy.server import Gateway

    settings = make_settings(tmp_path, {"p": probe("p")})
    gateway = Gateway(settings, plugins=[])
    async with gateway.running(), Client(gateway.server) as client:
        first = await client.session.call_tool("p__ask", {}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        (key,) = first.input_requests
        answer = {key: types.ElicitResult(action="accept", content={"name": "Mina"})}
        outcomes: list[Any] = []

        async def retry() -> None:
            try:
                outcomes.append(
                    await client.session.call_tool(
                        "p__ask",
                        {},
                        input_responses=answer,
                        request_state=first.request_state,
                        allow_input_required=True,
                    )
                )
            except MCPError as exc:
                outcomes.append(exc)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(retry)
                tg.start_soon(retry)
        results = [o for o in outcomes if isinstance(o, types.CallToolResult)]
        refused = [o for o in outcomes if isinstance(o, MCPError)]
        assert len(results) == 1 and text_of(results[0]) == "accept:Mina"
        assert len(refused) == 1 and "another retry" in str(refused[0])
