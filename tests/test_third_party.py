"""The gateway in front of servers we did not write (npm registry), over stdio and Streamable HTTP."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import call, eventually, inproc, make_settings, text_of
from mcp import ClientSession, StdioServerParameters, stdio_client
from npm_servers import everything_over_http, npm_bin

from gateway.proxy.server import Gateway

pytestmark = pytest.mark.anyio


async def test_everything_over_stdio_matches_direct(tmp_path: Path) -> None:
    everything = npm_bin("mcp-server-everything")
    cases = [("echo", {"message": "héllo 세계"}), ("get-sum", {"a": 2, "b": 40}), ("get-tiny-image", {})]
    with open(tmp_path / "direct.log", "w") as errlog:
        params = StdioServerParameters(command=everything, args=["stdio"])
        async with stdio_client(params, errlog=errlog) as streams, ClientSession(*streams) as direct:
            await direct.initialize()
            expected = [await call(direct, name, args) for name, args in cases]
    settings = make_settings(tmp_path, {"everything": {"command": everything, "args": ["stdio"]}})
    async with inproc(settings) as (_, session):
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"everything__echo", "everything__get-sum", "everything__trigger-long-running-operation"} <= names
        got = [await call(session, f"everything__{name}", args) for name, args in cases]
        for (name, _), want, have in zip(cases, expected, got, strict=True):
            assert have.model_dump() == want.model_dump(), name
        assert "héllo 세계" in text_of(got[0])
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        long = await call(
            session,
            "everything__trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            progress_callback=on_progress,
        )
        assert not long.is_error, text_of(long)
        await eventually(lambda: len(progress) == 4)
        assert len(progress) == 4 and progress == sorted(progress)
        resources = (await session.list_resources()).resources
        assert resources and all(r.uri.startswith("everything+") for r in resources)
        first = await session.read_resource(resources[0].uri)
        assert first.contents and first.contents[0].uri == resources[0].uri


async def test_everything_over_streamable_http(tmp_path: Path) -> None:
    async with everything_upstream(tmp_path, "http") as table:
        settings = make_settings(tmp_path, {"ev": table})
        async with inproc(settings) as (gateway, session):
            assert gateway.upstreams["ev"].state == "ok" or await _wait_ok(gateway)
            names = {t.name for t in (await session.list_tools()).tools}
            assert "ev__echo" in names and "ev__get-sum" in names
            assert text_of(await call(session, "ev__echo", {"message": "over http"})) == "Echo: over http"
            total = await call(session, "ev__get-sum", {"a": 1, "b": 2})
            assert "3" in text_of(total)


async def _wait_ok(gateway) -> bool:
    with anyio.fail_after(20):
        while gateway.upstreams["ev"].state != "ok":
            await anyio.sleep(0.1)
    return True


async def test_filesystem_server_multi_megabyte_files_are_offloaded(tmp_path: Path) -> None:
    """The npm filesystem server reads a 3 MB log and a 3 MB JSON file; both are offloaded whole."""
    import json

    filesystem = npm_bin("mcp-server-filesystem")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    log_lines = [
        f"2026-11-30T10:{i // 60 % 60:02d}:{i % 60:02d}Z {'ERROR' if i % 97 == 0 else 'INFO'} "
        f"worker-{i % 8} handled job {i} in {i % 500} ms"
        for i in range(45000)
    ]
    (data_dir / "app.log").write_text("\n".join(log_lines) + "\n")
    records = {
        "items": [
            {"id": i, "user": f"user{i}", "city": ["Seoul", "Busan", "Berlin"][i % 3], "score": i * 1.5}
            for i in range(40000)
        ]
    }
    (data_dir / "export.json").write_text(json.dumps(records, indent=1))
    assert (data_dir / "app.log").stat().st_size > 2_500_000 and (data_dir / "export.json").stat().st_size > 2_500_000
    settings = make_settings(tmp_path, {"fs": {"command": filesystem, "args": [str(data_dir)]}}, plugins=["offload"])
    async with inproc(settings) as (_, session):
        log = await call(session, "fs__read_text_file", {"path": str(data_dir / "app.log")})
        reply = json.loads(text_of(log))
        ref = reply["fileRef"]
        assert "files" not in reply  # the text and its structuredContent copy are saved once
        assert Path(ref["path"]).read_text() == (data_dir / "app.log").read_text()
        outline = (await call(session, "response_outline", {"path": ref["id"]})).structured_content
        assert outline["levels"]["ERROR"] == len([n for n in range(45000) if n % 97 == 0])
        errors = (
            await call(session, "response_search", {"path": ref["id"], "query": "ERROR job", "limit": 3})
        ).structured_content
        assert errors["matches"][0]["line"] == 1 and "ERROR" in errors["matches"][0]["text"]

        exported = json.loads(
            text_of(await call(session, "fs__read_text_file", {"path": str(data_dir / "export.json")}))
        )
        rid = exported["fileRef"]["id"]
        assert exported["fileRef"]["kind"] == "json" and exported["outline"]["itemCount"]["items"] == 40000
        busan = (await call(session, "response_search", {"path": rid, "query": "Busan", "limit": 2})).structured_content
        assert busan["matches"][0] == {"path": "items.1", "score": 1, "matches": {"city": "Busan"}}
        assert busan["total"] == len([i for i in range(40000) if i % 3 == 1])
        last = (await call(session, "response_slice", {"path": rid, "json_path": "items.-1"})).structured_content
        assert last["value"]["id"] == 39999


@asynccontextmanager
async def everything_upstream(tmp_path: Path, transport: str):
    """server-everything as the gateway's upstream, over stdio or Streamable HTTP: its settings table."""
    if transport == "stdio":
        yield {"command": npm_bin("mcp-server-everything"), "args": ["stdio"]}
        return
    with everything_over_http() as url:
        yield {"url": url}


async def _on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    ASKED.append("elicitation")
    return types.ElicitResult(action="accept", content={"name": "Mina", "color": "teal", "email": "m@x.kr"})


async def _on_sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    ASKED.append("sampling")
    return types.CreateMessageResult(role="assistant", content=types.TextContent(text="teal"), model="m")


async def _on_roots(context: Any) -> types.ListRootsResult:
    ASKED.append("roots")
    return types.ListRootsResult(roots=[types.Root(uri="file:///srv/projects", name="projects")])


ASKED: list[str] = []
HOST = {"elicitation_callback": _on_elicit, "sampling_callback": _on_sample, "list_roots_callback": _on_roots}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_everything_server_protocol_through_the_gateway(tmp_path: Path, transport: str) -> None:
    """A handshake-era host with every client capability, through the gateway to server-everything:
    elicitation, sampling and roots reach the host; completion, log level and log messages, and resource
    subscriptions with their updates pass through."""
    ASKED.clear()
    logs: list[types.LoggingMessageNotificationParams] = []
    updates: list[str] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))

    async with everything_upstream(tmp_path, transport) as table:
        settings = make_settings(tmp_path, {"ev": table})
        async with inproc(settings, notes=on_message, logging_callback=on_log, **HOST) as (gateway, session):
            await gateway.wait_ready()
            assert "✅" in text_of(await call(session, "ev__trigger-elicitation-request"))
            assert '"text": "teal"' in text_of(
                await call(session, "ev__trigger-sampling-request", {"prompt": "colour?"})
            )
            assert "projects" in text_of(await call(session, "ev__get-roots-list"))
            assert ASKED[:3] == ["elicitation", "sampling", "roots"]
            done = await session.complete(
                types.PromptReference(name="ev__completable-prompt"), {"name": "department", "value": ""}
            )
            assert done.completion.values
            await session.set_logging_level("debug")
            await call(session, "ev__toggle-simulated-logging")
            await eventually(lambda: any((m.logger or "").startswith("ev") for m in logs), 20, "a log message")
            await call(session, "ev__toggle-simulated-logging")
            uri = "ev+demo://resource/static/document/architecture.md"
            await session.subscribe_resource(uri)
            await call(session, "ev__toggle-subscriber-updates")
            await eventually(lambda: uri in updates, 20, "a resource update")
            await call(session, "ev__toggle-subscriber-updates")
            await session.unsubscribe_resource(uri)
            assert uri not in gateway.notices.subscribers


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_everything_server_questions_reach_a_2026_host(tmp_path: Path, transport: str) -> None:
    """The same questions from server-everything reach a 2026-era host as input_required rounds."""
    from mcp import Client

    ASKED.clear()
    async with everything_upstream(tmp_path, transport) as table:
        gateway = Gateway(make_settings(tmp_path, {"ev": table}), plugins=[])
        async with (
            gateway.running(),
            Client(gateway.server, **HOST) as client,
        ):
            assert client.protocol_version == "2026-07-28"
            await gateway.wait_ready()
            assert "✅" in text_of(await client.call_tool("ev__trigger-elicitation-request", {}))
            sampled = text_of(await client.call_tool("ev__trigger-sampling-request", {"prompt": "colour?"}))
            assert '"text": "teal"' in sampled
            assert "projects" in text_of(await client.call_tool("ev__get-roots-list", {}))
            assert ASKED[:3] == ["elicitation", "sampling", "roots"]


@pytest.mark.npm
def test_the_readme_inspector_command_reaches_the_gateway(tmp_path: Path) -> None:
    """The README's Inspector line as written (its CLI mode listing tools) starts the gateway with its config."""
    import os
    import shlex
    import subprocess
    import sys

    from conftest import ROOT, gateway_env, probe, write_config
    from npm_servers import inspector_cli

    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.startswith("npx @model"))
    argv = shlex.split(line)
    assert argv[:2] == ["npx", "@modelcontextprotocol/inspector"], line
    real = {
        "/abs/.venv/bin/mcp-context-gateway": str(Path(sys.executable).parent / "mcp-context-gateway"),
        "/abs/gateway.toml": str(write_config(tmp_path, {"p": probe("p")})),
    }
    rest = [real.get(a, a) for a in argv[2:]]
    split = rest.index("--") if "--" in rest else 0
    command = [*inspector_cli(), *rest[:split], "--cli", "--method", "tools/list", *rest[split:]]
    node_dir = os.path.dirname(command[0])
    env = gateway_env(PATH=f"{node_dir}{os.pathsep}{os.environ['PATH']}")
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    names = {tool["name"] for tool in json.loads(out.stdout)["tools"]}
    assert "p__add" in names, names
