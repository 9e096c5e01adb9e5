"""The gateway's own time per small call on the lean path, without pipes or an upstream process: a
host's `tools/call` is handed to the lean path as decoded JSON and the upstream's reply is handed back
at once, so what is timed is only the gateway's work (routing, the plugin pipeline, the usage figures,
reading and writing the result, the event loop). `--profile` prints where it goes.

    python bench/lean_cpu.py [--calls 5000] [--era 2025|2026] [--profile]   # SORT=tottime TOP=60: order, cut
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

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


async def main(n: int, profile: bool, plugins: list[str], era: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    gateway = Gateway(load_settings(write_config(tmp / "c.toml", tmp / "ws", plugins), environ={}))
    async with gateway.running():
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
        f"era {era}, plugins {', '.join(plugins) or 'none'}: {per_call:.0f} us of the gateway's own time per call ({n} calls)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--era", choices=["2025", "2026"], default="2025", help="the host's protocol era")
    args = parser.parse_args()
    for chosen in ([], ["offload", "memory", "documents", "monitor"]):
        anyio.run(main, args.calls, args.profile, chosen, args.era)
