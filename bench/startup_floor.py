"""The floor of start-up (`bench/startup.py --floor`): a stdio MCP server that only relays its upstreams'
`initialize` and `tools/list` as raw JSON lines. No SDK, no plugins, no ledger: what any gateway process
between the host and the same servers costs at least.

    python bench/startup_floor.py --config FILE [--settings]

Without `--settings` it reads the config's `[servers.*]` with `tomllib` and starts them at once; with it,
it reads the settings as `serve` does (`load_settings`, pydantic) and starts the servers with `prestart`.
Bench-only: it answers nothing but `initialize`, `tools/list` (every server's tools, prefixed) and pings.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
from typing import Any

import anyio
from anyio.abc import Process


async def listing(process: Process) -> list[dict[str, Any]]:
    """One server's tools: initialize, initialized, every page of tools/list."""
    assert process.stdin is not None and process.stdout is not None
    pending = b""

    async def ask(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        nonlocal pending
        await process.stdin.send(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n"
        )  # type: ignore[union-attr]
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if message.get("id") == request_id:
                    return message.get("result") or {}
            pending += await process.stdout.receive()  # type: ignore[union-attr]

    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "floor", "version": "0"}}
    await ask(0, "initialize", hello)
    await process.stdin.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    tools: list[dict[str, Any]] = []
    cursor = None
    for page in range(1, 1000):
        result = await ask(page, "tools/list", {"cursor": cursor} if cursor else {})
        tools += result.get("tools", [])
        if not (cursor := result.get("nextCursor")):
            break
    return tools


async def start(config: str, read_settings: bool) -> dict[str, Process]:
    if read_settings:
        from gateway.proxy.upstream_spawn import prestart
        from gateway.settings import load_settings

        settings = load_settings(config)
        started = await prestart(settings.enabled_servers, settings.gateway.logs_dir)
        return {name: one.process for name, one in started.items()}
    with open(config, "rb") as f:
        servers = tomllib.load(f).get("servers", {})
    return {
        name: await anyio.open_process(
            [spec["command"], *spec.get("args", [])],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name, spec in servers.items()
    }


async def main(config: str, read_settings: bool) -> None:
    processes = await start(config, read_settings)
    tools: dict[str, list[dict[str, Any]]] = {}
    ready = anyio.Event()

    async def list_every() -> None:
        async def one(name: str, process: Process) -> None:
            tools[name] = await listing(process)

        async with anyio.create_task_group() as tg:
            for name, process in processes.items():
                tg.start_soon(one, name, process)
        ready.set()

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with anyio.create_task_group() as tg:
        tg.start_soon(list_every)
        while line := await reader.readline():
            message = json.loads(line)
            if "id" not in message:
                continue
            if message.get("method") == "initialize":
                result: dict[str, Any] = {
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "floor", "version": "0"},
                }
            elif message.get("method") == "tools/list":
                await ready.wait()
                result = {"tools": [dict(t, name=f"{n}__{t['name']}") for n, listed in tools.items() for t in listed]}
            else:
                result = {}
            sys.stdout.buffer.write(
                json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode() + b"\n"
            )
            sys.stdout.buffer.flush()
        tg.cancel_scope.cancel()
    for process in processes.values():
        process.kill()
    os._exit(0)  # the servers are killed; nothing else to wait for


if __name__ == "__main__":
    asyncio.run(main(sys.argv[sys.argv.index("--config") + 1], "--settings" in sys.argv))
