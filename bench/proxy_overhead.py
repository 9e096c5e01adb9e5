"""Latency of small calls: directly to an upstream vs through the gateway (stdio), same run.

python bench/proxy_overhead.py [--calls 300]
"""

from __future__ import annotations

import argparse
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


async def main(n: int) -> None:
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
    print(table(rows))
    print("\ntarget: gateway p50 within 1.25x of direct")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    anyio.run(main, parser.parse_args().calls)
