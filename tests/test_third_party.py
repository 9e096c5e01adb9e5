"""The gateway in front of servers we did not write (npm registry), over stdio and Streamable HTTP."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from conftest import free_port, inproc, make_settings, text_of
from mcp import ClientSession, StdioServerParameters, stdio_client
from npm_servers import LOOPBACK_PRELOAD, npm_bin

pytestmark = pytest.mark.anyio


async def call(session: ClientSession, name: str, args: dict, **kw) -> types.CallToolResult:
    return await session.send_request(
        types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args)),
        types.CallToolResult,
        **kw,
    )


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
        await anyio.sleep(0.3)
        assert len(progress) == 4 and progress == sorted(progress)
        resources = (await session.list_resources()).resources
        assert resources and all(r.uri.startswith("everything+") for r in resources)
        first = await session.read_resource(resources[0].uri)
        assert first.contents and first.contents[0].uri == resources[0].uri


async def test_everything_over_streamable_http(tmp_path: Path) -> None:
    everything = npm_bin("mcp-server-everything")
    port = free_port()
    env = {"PORT": str(port), "NODE_OPTIONS": f"--require {LOOPBACK_PRELOAD}", "PATH": os.environ["PATH"]}
    server = subprocess.Popen(
        [everything, "streamableHttp"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/", timeout=0.5)
                break
            except httpx2.TransportError:
                time.sleep(0.1)
        settings = make_settings(tmp_path, {"ev": {"url": f"http://127.0.0.1:{port}/mcp"}})
        async with inproc(settings) as (gateway, session):
            assert gateway.upstreams["ev"].state == "ok" or await _wait_ok(gateway)
            names = {t.name for t in (await session.list_tools()).tools}
            assert "ev__echo" in names and "ev__get-sum" in names
            assert text_of(await call(session, "ev__echo", {"message": "over http"})) == "Echo: over http"
            total = await call(session, "ev__get-sum", {"a": 1, "b": 2})
            assert "3" in text_of(total)
    finally:
        server.terminate()
        server.wait(10)


async def _wait_ok(gateway) -> bool:
    with anyio.fail_after(20):
        while gateway.upstreams["ev"].state != "ok":
            await anyio.sleep(0.1)
    return True
