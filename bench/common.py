"""Shared helpers for the benchmark scripts (plain scripts; run them from the project root)."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import ClientSession

from gateway.proxy.upstream_stdio import linear_stdio_client


@asynccontextmanager
async def stdio_session(
    argv: list[str],
    errlog_path: Path,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> AsyncIterator[ClientSession]:
    """A client session to `python <argv>` over stdio (the linear-time reader, as a fast host would)."""
    with open(errlog_path, "ab") as errlog:
        async with (
            linear_stdio_client(python, argv, env, cwd, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def inproc_session(config: Path) -> AsyncIterator[ClientSession]:
    """The gateway's front server in this process (memory streams); its upstreams are real processes."""
    import anyio
    from mcp.shared.memory import create_client_server_memory_streams

    from gateway.proxy.server import Gateway
    from gateway.settings import load_settings

    gateway = Gateway(load_settings(config, environ={}))
    async with gateway.running(), create_client_server_memory_streams() as (client, server):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gateway.server.run, *server, gateway.server.create_initialization_options())
            async with ClientSession(*client) as session:
                await session.initialize()
                yield session
            tg.cancel_scope.cancel()


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> types.CallToolResult:
    return await session.send_request(
        types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args)), types.CallToolResult
    )


def write_config(
    path: Path, workspace: Path, plugins: list[str], gateway: dict[str, Any] | None = None, **server: Any
) -> Path:
    """A config with one upstream named `demo` (the demo server unless `command`/`args` say another);
    `gateway`: more `[gateway]` keys; `server`: more keys of the server."""
    lines = ["[gateway]", f"workspace = {json.dumps(str(workspace))}", f"plugins = {json.dumps(plugins)}"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in (gateway or {}).items()] + [""]
    server.setdefault("command", "${PYTHON}")
    server.setdefault("args", ["-m", "gateway.cli.demo_upstream"])
    lines += ["[servers.demo]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in server.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    ]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


median = statistics.median
