"""The upstream stdio reader: the gateway's linear-time transport vs the SDK's `stdio_client`, on
one large result from the demo server (the SDK re-splits its whole buffer for every 64 KB chunk).

    python bench/stdio_reader.py [--sizes 8,32,64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, table

from gateway.proxy.upstream_stdio import linear_stdio_client

ORDERS_PER_MB = 5000 / 1.377


async def timed(streams_cm, count: int) -> float:
    async with streams_cm as streams, ClientSession(*streams) as session:
        await session.initialize()
        started = time.perf_counter()
        result = await call(session, "list_orders", {"count": count})
        elapsed = time.perf_counter() - started
        assert len(result.content[0].text) > count * 200
    return elapsed


async def main(sizes: list[int]) -> None:
    rows = [["result", "gateway reader", "SDK stdio_client", "ratio"]]
    log = Path(tempfile.mkdtemp()) / "upstream.log"
    for mb in sizes:
        count = int(mb * ORDERS_PER_MB)
        with open(log, "ab") as errlog:
            ours = await timed(
                linear_stdio_client(sys.executable, ["-m", "gateway.cli.demo_upstream"], None, None, errlog), count
            )
        with open(log, "a") as errlog:
            params = StdioServerParameters(command=sys.executable, args=["-m", "gateway.cli.demo_upstream"])
            sdk = await timed(stdio_client(params, errlog=errlog), count)
        rows.append([f"{mb} MB", f"{ours:.2f} s", f"{sdk:.2f} s", f"{sdk / ours:.1f}x slower"])
    print(table(rows))
    print("\nboth include the upstream generating and serializing the result; the gap is the reader")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,32,64")
    anyio.run(main, [int(s) for s in parser.parse_args().sizes.split(",")])
