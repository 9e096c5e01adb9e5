"""Sixteen hosts calling at once over Streamable HTTP: throughput and latency, direct vs gateway.

    python bench/concurrency.py [--clients 16] [--calls 200] [--era 2025|2026] [--rounds 2] [--before DIR] [--paged] [--bare]

The upstream is the test suite's probe server over Streamable HTTP on 127.0.0.1. Each client opens its
own MCP session (`--era 2025`: a handshake-era `ClientSession`; `2026`: the SDK's `Client` in the
2026-07-28 mode, sessionless: every request carries its envelope) and makes `--calls` small `echo`
calls one after another; all clients run at once. The probe declares its echo read-only and lists its
tools in one page, as a server built on the SDK's MCPServer with annotated tools does (`--paged`: pages
of 5 and nothing declared, the calls of 2026-era hosts then stay on the gateway's session). `--bare` adds
the gateway with its own per-call extras cut out (`bare_gateway.py`: no plugins, no usage figures, no
SDK checks of a POST), what is left being the call's own way through it.
The same run is made straight to the upstream, through the gateway (HTTP front, all plugins on; and
with `lean_path` off), and through `http_relay.py`, relaying bytes without parsing them: uvicorn and
httpx (the libraries of the SDK's path); uvicorn and aiohttp (the client the lean path used before);
uvicorn and the lean path's own client (`gateway/proxy/upstream_client.py`: its front and its leg to the
upstream, so the floor a lean call could reach); and a TCP relay copying
bytes (the floor of any proxy process). Every path is warmed first with a few untimed calls, and every
other round runs the paths in reverse order. Printed: calls per second, p50 / p99 latency, calls lost
or failed (the target is none), and the CPU time (user + system, from /proc) each call cost the proxy
process and the upstream; then each path's calls per second as a share of direct in the same round,
median and range over the rounds, and the gateway's as a share of the lean-client relay's (the floor)
in the same round. The load generator shares the two cores with the servers, and this
machine's speed moves between runs: compare paths within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import call, pct, table
from conftest import PROBE, free_port, wait_listening


@asynccontextmanager
async def host(url: str, era: str) -> AsyncIterator[tuple[Callable[..., Awaitable[Any]], set[str]]]:
    """One host's call function and the tool names it was given."""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http:
        if era == "2026":
            async with Client(streamable_http_client(url, http_client=http)) as client:
                assert client.protocol_version == "2026-07-28", client.protocol_version
                yield client.call_tool, {t.name for t in (await client.list_tools()).tools}
            return
        async with (
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield (lambda name, args: call(session, name, args)), {t.name for t in (await session.list_tools()).tools}


async def one_client(url: str, calls: int, latencies: list[float], failures: list[str], n: int, era: str) -> None:
    try:
        async with host(url, era) as (do, tools):
            name = "echo" if "echo" in tools else "probe__echo"
            for i in range(calls):
                text = f"client {n} call {i} 안녕"
                t = time.perf_counter()
                result: types.CallToolResult = await do(name, {"text": text})
                latencies.append(time.perf_counter() - t)
                got = result.content[0].text if result.content else ""
                if result.is_error or got != text:
                    failures.append(f"client {n} call {i}: {got[:80]}")
    except Exception as exc:  # a lost session is a failure of every call it did not make
        failures.append(f"client {n}: {type(exc).__name__}: {exc}")


async def run(url: str, clients: int, calls: int, era: str) -> tuple[float, list[float], list[str]]:
    latencies: list[float] = []
    failures: list[str] = []
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(one_client, url, calls, latencies, failures, n, era)
    return time.perf_counter() - start, latencies, failures


WARM_CALLS = 10  # per client, on every path before the rounds
BARE = "gateway, bare (no plugins, no usage figures, no front checks)"
HEADER = ["path", "calls", "wall", "calls/s", "p50", "p99", "lost or failed", "proxy CPU/call", "upstream CPU/call"]


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time a process has used (Linux /proc); None elsewhere or without a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def per_call(before: float | None, after: float | None, n: int) -> str:
    return "n/a" if before is None or after is None or not n else f"{(after - before) / n * 1e6:.0f} us"


def measured(
    label: str,
    url: str,
    clients: int,
    calls: int,
    era: str = "2025",
    pids: tuple[int | None, int | None] = (None, None),
) -> list[str]:
    """One `run` against `url`, as a row under HEADER (its first failures printed); `pids`: the proxy's
    process (None: direct) and the upstream's, whose CPU time per call is reported."""
    start = [cpu_seconds(pid) for pid in pids]
    wall, latencies, failures = anyio.run(run, url, clients, calls, era)
    end = [cpu_seconds(pid) for pid in pids]
    for failure in failures[:5]:
        print("  ", label, failure)
    return [
        label,
        str(len(latencies)),
        f"{wall:.1f} s",
        f"{len(latencies) / wall:.0f}",
        f"{pct(latencies, 0.5) * 1000:.1f} ms",
        f"{pct(latencies, 0.99) * 1000:.1f} ms",
        str(clients * calls - len(latencies) + len(failures)),
        *(per_call(a, b, len(latencies)) for a, b in zip(start, end, strict=True)),
    ]


def main(
    clients: int, calls: int, era: str, rounds: int, before: str | None, paged: bool = False, bare: bool = False
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-concurrency-"))
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    config = tmp / "gw.toml"
    config.write_text(
        f"[gateway]\nworkspace = {json.dumps(str(tmp / 'ws'))}\n\n[servers.probe]\nurl = {json.dumps(upstream_url)}\n"
    )
    # the probe declares its echo read-only and lists its tools in one page, as an MCPServer with annotated
    # tools does (`--paged`: pages of 5, nothing declared); a 2026-era host's call may then reach it sessionless
    style = {} if paged else {"PROBE_READ_ONLY": "1", "PROBE_PAGE_SIZE": "100"}
    probe = [sys.executable, PROBE, "--http", str(upstream_port)]
    procs = [subprocess.Popen(probe, stderr=subprocess.DEVNULL, env={**os.environ, **style})]
    paths: list[tuple[str, str, int | None]] = [("direct", upstream_url, None)]
    try:
        wait_listening(upstream_url, procs[0])
        gateways = [("gateway (all plugins)", "true", None), ("gateway, lean_path off", "false", None)]
        if before:
            gateways.append((f"gateway from {before}", "true", before))
        if bare:
            gateways.append((BARE, "true", None))
        for label, lean, source in gateways:
            port = free_port()
            command = [str(Path(__file__).resolve().parent / "bare_gateway.py")] if label == BARE else ["-m", "gateway"]
            gw = [sys.executable, *command, "--config", str(config), "--transport", "http", "--port", str(port)]
            # `python -m` looks in its working folder first: started in `source`, it runs that checkout
            procs.append(
                subprocess.Popen(
                    [*gw, f"--lean-path={lean}"], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=source
                )
            )
            paths.append((label, f"http://127.0.0.1:{port}/mcp", procs[-1].pid))
            wait_listening(paths[-1][1], procs[-1])
        relays = [
            ("HTTP relay (uvicorn + httpx, nothing parsed)", []),
            ("HTTP relay (uvicorn + aiohttp)", ["--client", "aiohttp"]),
            ("HTTP relay (uvicorn + the lean path's client)", ["--client", "lean"]),
            ("TCP relay (bytes copied, HTTP not parsed)", ["--tcp"]),
        ]
        for label, how in relays:
            port = free_port()
            relay = [
                sys.executable,
                str(Path(__file__).resolve().parent / "http_relay.py"),
                *how,
                str(port),
                upstream_url,
            ]
            procs.append(subprocess.Popen(relay, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            paths.append((label, f"http://127.0.0.1:{port}/mcp", procs[-1].pid))
            wait_listening(paths[-1][1], procs[-1])
        rows = [HEADER]
        upstream_pid = procs[0].pid
        for _, url, _ in paths:  # every path warmed first (its connections, lazy imports), untimed
            anyio.run(run, url, clients, WARM_CALLS, era)
        for r in range(rounds):
            # the paths in turn, round after round, every other round in reverse order: a machine that gets
            # busier or quieter shifts them alike, and no path is always the one after direct
            order = list(enumerate(paths)) if r % 2 == 0 else list(enumerate(paths))[::-1]
            measured_now = {
                n: measured(label, url, clients, calls, era, (pid, upstream_pid)) for n, (label, url, pid) in order
            }
            rows += [measured_now[n] for n in range(len(paths))]
        print(
            f"{clients} clients x {calls} calls, each client its own MCP session over Streamable HTTP; host era {era}\n"
        )
        print(table(rows))
        print("\ncalls/s as a share of direct in the same round (median, lowest-highest):")
        for n, (label, _, _) in enumerate(paths[1:], 1):
            shares = sorted(
                float(rows[1 + r * len(paths) + n][3]) / float(rows[1 + r * len(paths)][3]) for r in range(rounds)
            )
            print(f"  {label}: {statistics.median(shares):.2f}x ({shares[0]:.2f}-{shares[-1]:.2f})")
        # the target's other half: within 10 % of the floor of the gateway's own libraries, paired by round
        labels = [label for label, _, _ in paths]
        floor = labels.index("HTTP relay (uvicorn + the lean path's client)")
        print("\ncalls/s as a share of the lean-client relay (the floor) in the same round (median, lowest-highest):")
        for n, label in enumerate(labels):
            if label.startswith("gateway") and "lean_path off" not in label:
                shares = sorted(
                    float(rows[1 + r * len(paths) + n][3]) / float(rows[1 + r * len(paths) + floor][3])
                    for r in range(rounds)
                )
                print(f"  {label}: {statistics.median(shares):.2f}x ({shares[0]:.2f}-{shares[-1]:.2f})")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--era", choices=["2025", "2026"], default="2025", help="the hosts' protocol era")
    parser.add_argument("--rounds", type=int, default=2, help="times every path is measured, in turn")
    parser.add_argument("--before", help="another checkout's gateway, measured in the same rounds")
    parser.add_argument("--paged", action="store_true", help="the probe pages its tools and declares none read-only")
    parser.add_argument(
        "--bare", action="store_true", help="also the gateway without its per-call extras (bare_gateway.py)"
    )
    args = parser.parse_args()
    main(args.clients, args.calls, args.era, args.rounds, args.before, args.paged, args.bare)
