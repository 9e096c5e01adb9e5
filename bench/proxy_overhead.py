"""Latency of small calls: directly to an upstream, through the gateway (with and without its lean
path), through a byte relay (the floor of any stdio proxy: one more process hop, nothing parsed) and
through the fastmcp proxy, all over stdio and all in one run.

python bench/proxy_overhead.py [--calls 1000] [--rounds 10] [--server demo|time|everything] [--era 2025|2026]
                               [--fastmcp-python PATH] [--before DIR]

`--before DIR` adds the gateway (default plugins) run from another checkout, in the same rounds.

Every path is started first and the calls are interleaved in rounds (each round: `calls / rounds`
calls on every path in turn), so a machine that gets busier or quieter during the run shifts all
paths alike instead of whichever ran last.

fastmcp is installed for the bench only: in a virtualenv of its own under ~/.cache (made on the first
run; `--fastmcp-python` points at an existing one), never as a dependency of the gateway.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import call, pct, stdio_session, table, write_config
from fleet import python_bin
from npm_servers import npm_bin

BENCH = Path(__file__).resolve().parent
FASTMCP_VENV = Path.home() / ".cache" / "mcp-context-gateway-bench" / "fastmcp"
EVERY_PLUGIN = ["offload", "memory", "documents", "monitor"]


def fastmcp_python(given: str | None) -> str:
    """A Python with fastmcp installed: the one given, else a bench-only virtualenv (made once)."""
    if given:
        return given
    python = FASTMCP_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(FASTMCP_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "fastmcp"], check=True)
    return str(python)


def upstream(server: str) -> tuple[list[str], str, Callable[[str], dict[str, Any]]]:
    """The upstream's command, the small tool called and its arguments."""
    if server == "time":  # mcp-server-time (PyPI): a real Python server
        return (
            [python_bin("mcp-server-time"), "--local-timezone", "UTC"],
            "get_current_time",
            lambda _: {"timezone": "UTC"},
        )
    if server == "everything":  # @modelcontextprotocol/server-everything (npm): a real Node server
        return [npm_bin("mcp-server-everything"), "stdio"], "echo", lambda text: {"message": text}
    return [sys.executable, "-m", "gateway.cli.demo_upstream"], "echo", lambda text: {"text": text}


Call = Callable[[str, dict[str, Any]], Awaitable[types.CallToolResult]]


@asynccontextmanager
async def host(argv: list[str], errlog: Path, era: str) -> AsyncIterator[Call]:
    """A host over stdio: a handshake-era `ClientSession` on the linear reader, or the SDK's `Client` in
    the 2026-07-28 mode (no handshake; each request carries the era's envelope)."""
    if era == "2025":
        async with stdio_session(argv[1:], errlog, python=argv[0]) as session:
            yield lambda name, args: call(session, name, args)
        return
    from mcp import Client, StdioServerParameters

    async with Client(StdioServerParameters(command=argv[0], args=argv[1:]), mode="2026-07-28") as client:
        yield client.call_tool  # (its stderr: this process's)


async def main(n: int, rounds: int, fastmcp: str | None, server: str, era: str, before: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    command, tool, arguments = upstream(server)
    paths: list[tuple[str, list[str], str]] = [("direct (no gateway)", command, tool)]  # label, argv, tool
    for label, plugins, lean in (
        ("gateway, no plugins", [], True),
        ("gateway, default plugins", EVERY_PLUGIN, True),
        ("gateway, default plugins, lean_path off", EVERY_PLUGIN, False),
    ):
        cfg = write_config(
            tmp / f"{len(paths)}.toml",
            tmp / f"ws{len(paths)}",
            plugins,
            gateway={"lean_path": lean},
            command=command[0],
            args=command[1:],
        )
        paths.append((label, [sys.executable, "-m", "gateway", "--config", str(cfg)], f"demo__{tool}"))
        if before and lean and plugins:  # the same settings, the other checkout's code (first on its path)
            cfg = write_config(
                tmp / "before.toml",
                tmp / "ws-before",
                plugins,
                gateway={"lean_path": lean},
                command=command[0],
                args=command[1:],
            )
            run = f"import sys; sys.path.insert(0, {before!r}); from gateway.launch import main; sys.exit(main())"
            argv = [sys.executable, "-c", run, "--config", str(cfg)]
            paths.append((f"gateway from {Path(before).name}, default plugins", argv, f"demo__{tool}"))
    paths.append(("byte relay (floor of any proxy)", [sys.executable, str(BENCH / "byte_relay.py"), *command], tool))
    skipped = ""
    try:
        paths.append(
            ("fastmcp proxy (no plugins)", [fastmcp_python(fastmcp), str(BENCH / "fastmcp_proxy.py"), *command], tool)
        )
    except Exception as exc:  # fastmcp cannot be installed here
        skipped = f"fastmcp proxy not run: {exc}"
    latencies: dict[str, list[float]] = {label: [] for label, *_ in paths}
    async with AsyncExitStack() as stack:
        calls = []
        for i, (label, argv, name) in enumerate(paths):
            do = await stack.enter_async_context(host(argv, tmp / f"{i}.log", era))
            for _ in range(20):  # warm-up
                await do(name, arguments("warm"))
            calls.append((label, do, name))
        per_round = max(1, n // rounds)
        for r in range(rounds):
            for label, do, name in calls:
                for i in range(per_round):
                    t = time.perf_counter()
                    result = await do(name, arguments(f"call {r}.{i}"))
                    latencies[label].append((time.perf_counter() - t) * 1000)
                    assert not result.is_error, result
    base = pct(latencies[paths[0][0]], 0.5)
    print(f"upstream: {server} ({' '.join(Path(c).name for c in command)}), tool {tool}; host era {era}")
    rows = [["path", "calls", "p50 ms", "p95 ms", "p50 ratio"]]
    for label, lat in latencies.items():
        p50, p95 = pct(lat, 0.5), pct(lat, 0.95)
        rows.append([label, str(len(lat)), f"{p50:.3f}", f"{p95:.3f}", f"{p50 / base:.2f}x"])
    print(table(rows))
    if skipped:
        print(skipped)
    print("\ntarget: gateway p50 within 1.2x of direct, and below the fastmcp proxy's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000, help="calls per path")
    parser.add_argument("--rounds", type=int, default=10, help="rounds the calls are interleaved in")
    parser.add_argument("--fastmcp-python", help="a Python with fastmcp installed (default: a bench-only venv)")
    parser.add_argument("--server", choices=["demo", "time", "everything"], default="demo", help="the upstream")
    parser.add_argument("--era", choices=["2025", "2026"], default="2025", help="the host's protocol era")
    parser.add_argument("--before", help="another checkout, measured in the same rounds")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds, args.fastmcp_python, args.server, args.era, args.before)
