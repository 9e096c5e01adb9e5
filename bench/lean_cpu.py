"""The gateway's own time per small call on the lean path, without pipes or an upstream process: a
host's `tools/call` is handed to the lean path as decoded JSON and the upstream's reply is handed back
at once, so what is timed is only the gateway's work (routing, the plugin pipeline, the usage figures,
reading and writing the result, the event loop). `--profile` prints where it goes.

    python bench/lean_cpu.py [--calls 5000] [--era 2025|2026] [--profile]   # SORT=tottime TOP=60: order, cut
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_config

from gateway.proxy.server import Gateway
from gateway.settings import load_settings


class Host:
    """What the lean path needs of a host's session."""

    protocol_version = "2025-11-25"
    client_capabilities = None

    async def send_tool_list_changed(self) -> None: ...
    async def send_resource_list_changed(self) -> None: ...
    async def send_prompt_list_changed(self) -> None: ...


async def main(n: int, profile: bool, plugins: list[str], era: str, front: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    gateway = Gateway(load_settings(write_config(tmp / "c.toml", tmp / "ws", plugins), environ={}))
    async with gateway.running(), contextlib.AsyncExitStack() as stack:
        await gateway.wait_ready()
        upstream = gateway.upstreams["demo"]
        loop = asyncio.get_running_loop()

        def answer_at_once(data: bytes) -> bool:  # the upstream's pipe: its reply comes as its reader hands it over
            request = json.loads(data)
            if "id" in request:
                text = request["params"]["arguments"]["text"]
                reply = {"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": text}]}}
                loop.call_soon(upstream.raw.intercept, json.loads(json.dumps(reply)))
            return True

        async def never(data: bytes) -> None:
            raise AssertionError("the lean path waited on a pipe that was not behind")

        upstream.raw.attach(never, answer_at_once)
        host = Host()
        host.protocol_version = "2026-07-28" if era == "2026" else "2025-11-25"
        gateway.hosts.put("", "stdio", host)
        answered = asyncio.Event()

        def to_host(data: bytes) -> bool:
            answered.set()
            return True

        async def to_host_waiting(data: bytes) -> None:  # a task's answer goes through the sink that may wait
            answered.set()

        take = gateway.lean.intercept(to_host_waiting, to_host)

        async def one(i: int) -> None:
            answered.clear()
            request = {"jsonrpc": "2.0", "id": i, "method": "tools/call"}
            request["params"] = {"name": "demo__echo", "arguments": {"text": f"call {i}"}}
            assert take(json.loads(json.dumps(request))), "the lean path did not take the call"
            await answered.wait()

        if front == "http":
            one = await http_front(gateway, era, stack)

        for i in range(300):
            await one(i)
        profiler = cProfile.Profile()
        if profile:
            profiler.enable()
        began = time.perf_counter()
        for i in range(n):
            await one(i)
        per_call = (time.perf_counter() - began) / n * 1e6
        if profile:
            profiler.disable()
            pstats.Stats(profiler).sort_stats(os.environ.get("SORT", "cumtime")).print_stats(
                int(os.environ.get("TOP", "40"))
            )
    print(
        f"{front} front, era {era}, plugins {', '.join(plugins) or 'none'}: {per_call:.0f} us of the gateway's own time per call ({n} calls)"
    )


async def http_front(gateway: Gateway, era: str, stack: contextlib.AsyncExitStack) -> Any:
    """`one` call through the HTTP front's ASGI app (its middlewares, the lean front's checks of the
    request, its JSON answer), without uvicorn or sockets: what the HTTP front adds to the lean path."""
    from gateway.proxy.host_transport import build_http_app

    app, manager = build_http_app(gateway)
    await stack.enter_async_context(manager.run())
    version = "2026-07-28" if era == "2026" else "2025-11-25"
    headers = [
        (b"host", b"127.0.0.1:8765"),
        (b"accept", b"application/json, text/event-stream"),
        (b"content-type", b"application/json"),
        (b"mcp-protocol-version", version.encode()),
    ]
    sid = None
    if era != "2026":  # a session first, as a host opens it
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize"}
        init["params"] = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}
        start, _ = await _post(app, headers, init)
        sid = dict(start["headers"])[b"mcp-session-id"]
        await _post(
            app, [*headers, (b"mcp-session-id", sid)], {"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        headers.append((b"mcp-session-id", sid))

    async def one(i: int) -> None:
        params: dict[str, Any] = {"name": "demo__echo", "arguments": {"text": f"call {i}"}}
        if era == "2026":
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        request = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
        extra = [(b"mcp-method", b"tools/call"), (b"mcp-name", b"demo__echo")] if era == "2026" else []
        start, body = await _post(app, headers + extra, request)
        assert start["status"] == 200 and b'"call ' in body, (start, body)

    return one


async def _post(app: Any, headers: list[tuple[bytes, bytes]], message: dict[str, Any]) -> tuple[Any, bytes]:
    body = json.dumps(message).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "root_path": "",
        "query_string": b"",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8765),
        "scheme": "http",
        "http_version": "1.1",
    }
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the host stays
        return {"type": "http.disconnect"}

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)

    await app(scope, receive, send)
    return sent[0], b"".join(e.get("body", b"") for e in sent[1:])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--era", choices=["2025", "2026"], default="2025", help="the host's protocol era")
    parser.add_argument("--front", choices=["stdio", "http"], default="stdio", help="the host's transport")
    args = parser.parse_args()
    for chosen in ([], ["offload", "memory", "documents", "monitor"]):
        anyio.run(main, args.calls, args.profile, chosen, args.era, args.front)
