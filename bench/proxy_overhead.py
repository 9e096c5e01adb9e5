"""Latency of small calls: directly to an upstream, through the gateway, and through the fastmcp
proxy (stdio), same run.

python bench/proxy_overhead.py [--calls 300] [--fastmcp-python PATH]

fastmcp is installed for the bench only: in a virtualenv of its own under ~/.cache (made on the first
run; `--fastmcp-python` points at an existing one), never as a dependency of the gateway.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, pct, stdio_session, table, write_config


async def timed_calls(session, name: str, n: int) -> list[float]:
    for _ in range(20):  # warm-up
        await call(session, name, {"text": "warm"})
    out = []
    for i in range(n):
        t = time.perf_counter()
        result = await call(session, name, {"text": f"call {i}"})
        out.append((time.perf_counter() - t) * 1000)
        assert not result.is_error
    return out


BENCH = Path(__file__).resolve().parent
FASTMCP_VENV = Path.home() / ".cache" / "mcp-context-gateway-bench" / "fastmcp"


def fastmcp_python(given: str | None) -> str:
    """A Python with fastmcp installed: the one given, else a bench-only virtualenv (made once)."""
    if given:
        return given
    python = FASTMCP_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(FASTMCP_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "fastmcp"], check=True)
    return str(python)


async def main(n: int, fastmcp: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    rows = [["path", "calls", "p50 ms", "p95 ms", "p50 ratio"]]
    async with stdio_session(["-m", "gateway.cli.demo_upstream"], tmp / "direct.log") as direct:
        base = await timed_calls(direct, "echo", n)
    rows.append(["direct (no gateway)", str(n), f"{pct(base, 0.5):.3f}", f"{pct(base, 0.95):.3f}", "1.00x"])
    for label, plugins in (("gateway, no plugins", []), ("gateway, default plugins", None)):
        cfg = write_config(
            tmp / f"{len(rows)}.toml",
            tmp / "ws",
            plugins if plugins is not None else ["offload", "memory", "documents", "monitor"],
        )
        try:
            async with stdio_session(["-m", "gateway", "--config", str(cfg)], tmp / "gw.log") as gw:
                lat = await timed_calls(gw, "demo__echo", n)
        except Exception as exc:  # e.g. a plugin not installed
            rows.append([label, "-", "-", "-", f"failed: {exc}"])
            continue
        rows.append(
            [label, str(n), f"{pct(lat, 0.5):.3f}", f"{pct(lat, 0.95):.3f}", f"{pct(lat, 0.5) / pct(base, 0.5):.2f}x"]
        )
    try:
        python = fastmcp_python(fastmcp)
        argv = [str(BENCH / "fastmcp_proxy.py"), sys.executable]
        async with stdio_session(argv, tmp / "fastmcp.log", python=python) as proxy:
            lat = await timed_calls(proxy, "echo", n)
        rows.append(
            [
                "fastmcp proxy (no plugins)",
                str(n),
                f"{pct(lat, 0.5):.3f}",
                f"{pct(lat, 0.95):.3f}",
                f"{pct(lat, 0.5) / pct(base, 0.5):.2f}x",
            ]
        )
    except Exception as exc:  # fastmcp cannot be installed here
        rows.append(["fastmcp proxy", "-", "-", "-", f"not run: {exc}"])
    print(table(rows))
    print("\ntarget: gateway p50 within 1.3x of direct, and at most the fastmcp proxy's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--fastmcp-python", help="a Python with fastmcp installed (default: a bench-only venv)")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.fastmcp_python)
