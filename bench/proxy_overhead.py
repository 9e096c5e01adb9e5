"""Latency of small calls: directly to an upstream, through the gateway (with and without its lean
path), through a byte relay (the floor of any stdio proxy: one more process hop, nothing parsed) and
through the fastmcp proxy, all over stdio and all in one run.

python bench/proxy_overhead.py [--calls 1000] [--rounds 10] [--fastmcp-python PATH]

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
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, pct, stdio_session, table, write_config

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


async def main(n: int, rounds: int, fastmcp: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    paths: list[tuple[str, list[str], str, str]] = [  # label, argv, tool, python
        ("direct (no gateway)", ["-m", "gateway.cli.demo_upstream"], "echo", sys.executable)
    ]
    for label, plugins, lean in (
        ("gateway, no plugins", [], True),
        ("gateway, default plugins", EVERY_PLUGIN, True),
        ("gateway, default plugins, lean_path off", EVERY_PLUGIN, False),
    ):
        cfg = write_config(tmp / f"{len(paths)}.toml", tmp / f"ws{len(paths)}", plugins, gateway={"lean_path": lean})
        paths.append((label, ["-m", "gateway", "--config", str(cfg)], "demo__echo", sys.executable))
    paths.append(("byte relay (floor of any proxy)", [str(BENCH / "byte_relay.py")], "echo", sys.executable))
    skipped = ""
    try:
        paths.append(
            (
                "fastmcp proxy (no plugins)",
                [str(BENCH / "fastmcp_proxy.py"), sys.executable],
                "echo",
                fastmcp_python(fastmcp),
            )
        )
    except Exception as exc:  # fastmcp cannot be installed here
        skipped = f"fastmcp proxy not run: {exc}"
    latencies: dict[str, list[float]] = {label: [] for label, *_ in paths}
    async with AsyncExitStack() as stack:
        sessions = []
        for i, (label, argv, tool, python) in enumerate(paths):
            session = await stack.enter_async_context(stdio_session(argv, tmp / f"{i}.log", python=python))
            for _ in range(20):  # warm-up
                await call(session, tool, {"text": "warm"})
            sessions.append((label, session, tool))
        per_round = max(1, n // rounds)
        for r in range(rounds):
            for label, session, tool in sessions:
                for i in range(per_round):
                    t = time.perf_counter()
                    result = await call(session, tool, {"text": f"call {r}.{i}"})
                    latencies[label].append((time.perf_counter() - t) * 1000)
                    assert not result.is_error, result
    base = pct(latencies[paths[0][0]], 0.5)
    rows = [["path", "calls", "p50 ms", "p95 ms", "p50 ratio"]]
    for label, lat in latencies.items():
        p50, p95 = pct(lat, 0.5), pct(lat, 0.95)
        rows.append([label, str(len(lat)), f"{p50:.3f}", f"{p95:.3f}", f"{p50 / base:.2f}x"])
    print(table(rows))
    if skipped:
        print(skipped)
    print("\ntarget: gateway p50 within 1.3x of direct, and at most the fastmcp proxy's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000, help="calls per path")
    parser.add_argument("--rounds", type=int, default=10, help="rounds the calls are interleaved in")
    parser.add_argument("--fastmcp-python", help="a Python with fastmcp installed (default: a bench-only venv)")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.rounds, args.fastmcp_python)
