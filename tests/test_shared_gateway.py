"""A shared gateway that an unlucky operator or a server's gap cannot bring down: real upstream processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import (
    ALICE,
    BOB,
    PROBE,
    PY,
    RAW_HELLO,
    Notes,
    call,
    eventually,
    free_port,
    gateway_env,
    gateway_pid,
    gateway_pipes,
    inproc,
    make_settings,
    probe,
    run_cli,
    serving,
    tenant_session,
    text_of,
    two_tenants,
    write_config,
)

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "servers" / "raw_server.py")


async def test_a_server_without_resource_templates_is_available(tmp_path: Path) -> None:
    """It declares resources but answers -32601 to resources/templates/list: an empty list, not a
    reason to restart it forever."""
    settings = make_settings(tmp_path, {"raw": {"command": PY, "args": [RAW, "--resources"]}})
    async with inproc(settings) as (gateway, session):
        result = await call(session, "raw__legacy_echo", {"text": "hi"})
        assert not result.is_error and text_of(result) == "legacy_echo:hi"
        assert gateway.upstreams["raw"].state == "ok"
        listed = await session.list_resources()
        assert [r.name for r in listed.resources] == ["one"]


def test_token_names_that_differ_by_case_are_refused(tmp_path: Path) -> None:
    """`Alice` and `alice` would share one folder on macOS and Windows: the gateway does not start."""
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        f'[gateway]\nworkspace = "{tmp_path / "ws"}"\ntransport = "http"\n\n'
        '[[auth.tokens]]\nname = "Alice"\ntoken = "a-token-of-alice-0123456789"\n\n'
        '[[auth.tokens]]\nname = "alice"\ntoken = "another-token-of-alice-0123"\n'
    )
    done = run_cli("--config", str(cfg), timeout=30)
    assert done.returncode != 0 and "ignoring case" in done.stderr and "Alice, alice" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="reads the signal mask in /proc; SIGHUP is POSIX")
def test_a_sighup_while_starting_does_not_end_the_gateway(tmp_path: Path) -> None:
    """A SIGHUP right after start (before the reloader listens) is remembered, not the end of the process."""
    cfg = write_config(tmp_path, {"p": probe("p")})
    proc = gateway_pipes(cfg)
    try:
        # as soon as the process holds SIGHUP (its first step), inside the start-up window where a SIGHUP
        # used to kill it (exit 129)
        deadline = time.monotonic() + 20
        while not _catches_sighup(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the gateway never held SIGHUP"
            time.sleep(0.005)
        proc.send_signal(signal.SIGHUP)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(
            (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": RAW_HELLO}) + "\n").encode()
        )
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["id"] == 1 and "result" in answer
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def _catches_sighup(pid: int) -> bool:
    """Whether a process has a handler for SIGHUP (bit 0 of SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & 1)
    return False


@pytest.mark.skipif(sys.platform != "linux", reason="finds the gateway's process in /proc and sends it SIGHUP")
async def test_a_config_saved_in_two_steps_keeps_every_server(tmp_path: Path) -> None:
    """An editor that truncates the file, then writes it: the empty file in between is never applied, so
    calls under way keep their servers."""
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    cfg = write_config(tmp_path, {"p": probe("p")})
    text = cfg.read_text()
    errlog_path = tmp_path / "gw.err"
    with open(errlog_path, "wb") as errlog:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            pid = gateway_pid(cfg)
            for _ in range(2):
                cfg.write_text("")  # truncated in place (a SIGHUP re-reads it now; the file watch would too)...
                os.kill(pid, signal.SIGHUP)
                await eventually(lambda: b"names no servers" in errlog_path.read_bytes(), 20, "the refusal")
                result = await call(session, "p__echo", {"text": "here"})
                assert not result.is_error and "here" in text_of(result)
                cfg.write_text(text)  # ...then written back
                errlog_path.write_bytes(b"")
    assert "Traceback" not in errlog_path.read_text()


@pytest.mark.parametrize("frozen", [True, False])
async def test_a_damaged_definitions_ledger_fails_closed_when_frozen(tmp_path: Path, frozen: bool) -> None:
    """definitions.json cut in half between runs: moved aside; with freeze_definitions every tool is
    refused with how to accept it (and a restart does not take the damage for a fresh start); without
    the freeze, definitions are remembered anew as before."""
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    cfg = write_config(tmp_path, {"p": probe("p")}, freeze_definitions=frozen)

    async def echo() -> Any:
        with open(tmp_path / "gw.err", "ab") as errlog:
            async with (
                linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as st,
                ClientSession(*st) as session,
            ):
                await session.initialize()
                await session.list_tools()
                return await call(session, "p__echo", {"text": "hi"})

    assert not (await echo()).is_error
    ledger = tmp_path / "ws" / "definitions.json"
    data = ledger.read_bytes()
    ledger.write_bytes(data[: len(data) // 2])
    for _ in range(2):  # the run after the damage, and a restart after it
        result = await echo()
        if frozen:
            assert result.is_error and "could not be read" in text_of(result) and "definitions.json" in text_of(result)
        else:
            assert not result.is_error
    assert [p.name for p in ledger.parent.glob("definitions.json.damaged-*")]
    assert "Traceback" not in (tmp_path / "gw.err").read_text()


@pytest.mark.parametrize("frozen", [True, False])
async def test_one_servers_damaged_ledger_entry_never_hides_the_others(tmp_path: Path, frozen: bool) -> None:
    """definitions.json holds garbage for server p's echo: q's tools are listed and called as ever; p's
    are refused while frozen (its first definitions are unknown), else remembered anew."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "definitions.json").write_text(json.dumps({"p": {"echo": "garbage"}}))
    settings = make_settings(tmp_path, {"p": probe("p"), "q": probe("q")}, freeze_definitions=frozen)
    async with inproc(settings) as (gateway, session):
        await gateway.wait_ready()
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"p__echo", "q__echo"} <= names
        assert text_of(await call(session, "q__echo", {"text": "hi"})) == "hi"
        result = await call(session, "p__echo", {"text": "hi"})
        if frozen:
            assert result.is_error and "first definition is unknown" in text_of(result)
        else:
            assert text_of(result) == "hi"


async def test_the_workspace_and_the_config_are_never_ingested(tmp_path: Path) -> None:
    """An ingest root that holds the workspace and the config (as `~` holds the default workspace): another
    caller's notes, the config and its tokens stay out, one by one and when their folder is ingested."""
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    (tmp_path / "notes.md").write_text("# Mine\n\nmy own notes\n")
    cfg = write_config(tmp_path, {}, {"documents": {"ingest_roots": [str(tmp_path)]}}, plugins=["memory", "documents"])
    with open(tmp_path / "gw.err", "wb") as errlog:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as st,
            ClientSession(*st) as session,
        ):
            await session.initialize()
            await call(session, "context_append", {"session_id": "bob", "text": "bob's secret plan 7781"})
            session_log = next((tmp_path / "ws").rglob("*.jsonl"))
            for private in (session_log, cfg):
                refused = await call(session, "doc_ingest", {"file_path": str(private)})
                assert refused.is_error and "never ingested" in text_of(refused), text_of(refused)
            folder = await call(session, "doc_ingest", {"file_path": str(tmp_path)})
            assert not folder.is_error, text_of(folder)
            ingested = [d["file"] for d in folder.structured_content["ingested"]]
            assert "notes.md" in ingested and not any(f.startswith("ws") or f.endswith(".toml") for f in ingested)
            found = await call(session, "doc_search", {"query": "secret plan 7781"})
            assert found.structured_content["results"] == []


async def test_documents_written_after_their_folder_was_removed_are_kept(tmp_path: Path) -> None:
    """`rm -rf <workspace>/documents` while the gateway runs, then doc_ingest: the index starts afresh in
    a new file, and the document is still there after a restart."""
    import shutil

    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    cfg = write_config(tmp_path, {}, plugins=["documents"])

    async def run(*steps: tuple[str, dict[str, Any]]) -> list[Any]:
        with open(tmp_path / "gw.err", "ab") as errlog:
            async with (
                linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as st,
                ClientSession(*st) as session,
            ):
                await session.initialize()
                out = []
                for name, args in steps:
                    if name == "rm":
                        shutil.rmtree(tmp_path / "ws" / "documents")
                        continue
                    out.append(await call(session, name, args))
                return out

    text = "# Tides\n\nThe harbour floods at the spring tide near 0730 hours.\n"
    first, again = await run(
        ("doc_ingest", {"text": "# Before\n\nwritten first\n"}),
        ("rm", {}),
        ("doc_ingest", {"text": text}),
    )
    assert not first.is_error and not again.is_error
    (found,) = await run(("doc_search", {"query": "spring tide harbour"}))
    assert any("0730" in r["text"] for r in found.structured_content["results"]), text_of(found)


async def test_one_tenants_heavy_explore_calls_never_take_anothers_threads(tmp_path: Path) -> None:
    """alice sends 8 slow searches at once: 4 (her share) run, those that find no place within 2 s are
    told so as isError; bob's search meanwhile answers while hers still run."""
    import anyio

    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, ["offload"])
    heavy = tmp_path / "ws" / "ns" / "alice" / "responses" / "p__logs-0000a11c.txt"
    heavy.parent.mkdir(parents=True)
    with open(heavy, "w") as fh:  # ~2 s of search each on one core; 4 at once share the interpreter
        fh.writelines(f"line {i} of a long log\n" for i in range(1_000_000))
    light = tmp_path / "ws" / "ns" / "bob" / "responses" / "p__logs-00000b0b.txt"
    light.parent.mkdir(parents=True)
    light.write_text("a short log with a needle\n")
    url = f"http://127.0.0.1:{port}/mcp"
    answers: list[Any] = []
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with tenant_session(url, ALICE) as alice, tenant_session(url, BOB) as bob:

            async def search() -> None:
                answers.append(await call(alice, "response_search", {"path": "resp_0000a11c", "query": "needle"}))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(search)
                    # past her share, a search waits 2 s for one of her places, then is told
                    await eventually(lambda: any(a.is_error for a in answers), seconds=60)
                    theirs = await call(bob, "response_search", {"path": "resp_00000b0b", "query": "needle"})
                    assert not theirs.is_error and theirs.structured_content["total"] == 1
                    assert len(answers) < 8  # bob answered while alice's searches still ran
            refused = [text_of(a) for a in answers if a.is_error]
            assert len(answers) == 8 and refused and len(refused) <= 4, refused
            assert all("at most 4 at once per caller" in t for t in refused), refused


async def test_one_tenants_sessions_never_cut_another_off_from_notifications(tmp_path: Path) -> None:
    """alice opens (and ends) more sessions than the gateway remembers for pushes; bob's session, opened
    first, still hears tools/list_changed when the upstream's tool list grows."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    notes = Notes()
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with tenant_session(url, BOB, notes) as bob:
            await bob.list_tools()
            with anyio.fail_after(120):
                for _ in range(70):
                    async with tenant_session(url, ALICE) as alice:
                        await alice.list_tools()
            notes.changed = anyio.Event()  # a change heard earlier (the upstream's first listing) is not this one
            async with tenant_session(url, ALICE) as alice:
                assert not (await call(alice, "p__grow", {})).is_error
            with anyio.fail_after(10):
                await notes.changed.wait()
            assert any(t.name == "p__grown" for t in (await bob.list_tools()).tools)


async def test_upstream_logs_of_one_tenants_call_never_reach_another(tmp_path: Path) -> None:
    """A log message an upstream sends during alice's call reaches alice's session, not bob's."""
    cmd, port = two_tenants(tmp_path, {"p": probe("p")}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    heard: dict[str, Notes] = {"alice": Notes(), "bob": Notes()}

    def logs(who: str) -> list[str]:
        found = [m for m in heard[who].messages if isinstance(m, types.LoggingMessageNotification)]
        return [str(m.params.data) for m in found]

    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with tenant_session(url, ALICE, heard["alice"]) as alice, tenant_session(url, BOB, heard["bob"]) as bob:
            await alice.list_tools()
            await bob.list_tools()
            await alice.set_logging_level("debug")
            assert text_of(await call(alice, "p__echo", {"text": "a", "log": True})) == "a"
            await eventually(lambda: "warning from p" in logs("alice"), what="alice hears her call's logs")
            # a change pushed to every host after alice's call: on bob's connection it comes after any of her logs
            heard["bob"].changed = anyio.Event()  # (a change heard at start is not this one)
            assert not (await call(alice, "p__grow", {})).is_error
            with anyio.fail_after(10):
                await heard["bob"].changed.wait()
            assert [line for line in logs("bob") if "from p" in line] == []


async def test_upstream_logs_of_one_tenants_call_never_reach_a_2026_hosts_call_of_another(tmp_path: Path) -> None:
    """bob, a 2026-era host, asks for log messages during his call (`_meta` logLevel) while alice's call
    to the same server logs: whose lines they are cannot be told (a log message names no request), so
    none of them reaches bob's call, as none reaches a handshake-era host of another tenant."""
    import httpx2

    marker = tmp_path / "slow.txt"
    cmd, port = two_tenants(tmp_path, {"p": probe("p", env={"PROBE_CANCEL_MARKER": str(marker)})}, [])
    url = f"http://127.0.0.1:{port}/mcp"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "bob", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
        types.LOG_LEVEL_META_KEY: "debug",
    }
    params = {"name": "p__slow", "arguments": {"seconds": 3}, "_meta": meta}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "p__slow",
        "authorization": f"Bearer {BOB}",
    }
    bobs: list[str] = []
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http, tenant_session(url, ALICE) as alice:
            await alice.list_tools()

            async def bobs_call() -> None:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
                bobs.append((await http.post(url, json=body, headers=headers)).text)

            async with anyio.create_task_group() as tg:
                tg.start_soon(bobs_call)
                await eventually(lambda: marker.exists() and marker.read_text() == "started", 20, "bob's call")
                await alice.set_logging_level("debug")
                assert text_of(await call(alice, "p__echo", {"text": "a", "log": True})) == "a"
    assert "slept" in bobs[0] or '"result"' in bobs[0], bobs
    assert "notifications/message" not in bobs[0], bobs[0]


async def test_one_tenants_long_calls_never_hold_every_connection_to_an_http_upstream(tmp_path: Path) -> None:
    """bob keeps 110 long calls running on an HTTP upstream, more than the gateway opens connections to it
    (100): he holds his share (`CALLER_SHARE`) and the rest of his wait their turn, so alice's call is
    answered while every one of his still runs."""
    import httpx2

    from gateway.proxy.upstream import CALLER_SHARE
    from gateway.proxy.upstream_http import CONNECTIONS

    port = free_port()
    web = f"http://127.0.0.1:{port}/mcp"
    cmd, gw_port = two_tenants(tmp_path, {"web": {"url": web}}, [])
    url = f"http://127.0.0.1:{gw_port}/mcp"
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    def headers(token: str, tool: str) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": tool,
            "authorization": f"Bearer {token}",
        }

    def body(rid: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params = {"name": tool, "arguments": arguments, "_meta": meta}
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    bobs_done: list[int] = []
    running = tmp_path / "running"
    running.mkdir()
    env = os.environ | {"PROBE_READ_ONLY": "1", "PROBE_RUNNING_DIR": str(running)}
    with (
        serving([PY, PROBE, "--name", "web", "--http", str(port)], web, env),
        serving(cmd, f"http://127.0.0.1:{gw_port}/nothing", gateway_env(), open(tmp_path / "gw.err", "wb")),
    ):
        limits = httpx2.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(120), limits=limits) as http:
            warm = await http.post(url, json=body(0, "web__echo", {"text": "up"}), headers=headers(ALICE, "web__echo"))
            assert "up" in warm.text, warm.text

            async def bobs_call(rid: int) -> None:
                await http.post(url, json=body(rid, "web__slow", {"seconds": 120}), headers=headers(BOB, "web__slow"))
                bobs_done.append(rid)

            async with anyio.create_task_group() as tg:
                for rid in range(110):
                    tg.start_soon(bobs_call, rid)
                # as many as he may hold: his share, or every connection the gateway opens without one
                held = min(CALLER_SHARE, CONNECTIONS)
                await eventually(lambda: len(list(running.iterdir())) >= held, 30, "bob's calls to start")
                with anyio.fail_after(60):
                    answer = await http.post(
                        url, json=body(1000, "web__echo", {"text": "mine"}), headers=headers(ALICE, "web__echo")
                    )
                assert "mine" in answer.text and bobs_done == [], (answer.text, bobs_done)
                tg.cancel_scope.cancel()  # bob leaves: his calls are cancelled at the upstream
