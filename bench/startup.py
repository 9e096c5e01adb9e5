"""Start-up as a host waits for it: from starting the process to the answer of the first tools/list,
for the demo upstream alone and for the gateway in front of it (all four plugins), same run.

    python bench/startup.py [--runs 7] [--source DIR]

`--source` runs the gateway from another checkout (to compare two versions on one machine).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import stdio_session, table, write_config


async def first_list(argv: list[str], log: Path, source: str | None = None) -> float:
    t = time.perf_counter()
    # `python -m` looks in its working folder first: started in `source`, it runs that checkout
    async with stdio_session(argv, log, env={"PYTHONPATH": source} if source else None, cwd=source) as session:
        await session.list_tools()
        return time.perf_counter() - t


async def main(args: argparse.Namespace) -> None:
    runs, source = args.runs, args.source
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-startup-"))
    cfg = write_config(tmp / "g.toml", tmp / "ws", ["offload", "memory", "documents", "monitor"])
    direct, gateway = [], []
    for _ in range(runs):  # interleaved, so a slow moment of the machine hits both
        direct.append(await first_list(["-m", "gateway.cli.demo_upstream"], tmp / "d.log"))
        gateway.append(await first_list(["-m", "gateway", "--config", str(cfg)], tmp / "g.log", source))
    d, g = statistics.median(direct), statistics.median(gateway)
    print(
        table(
            [
                ["path", "runs", "median s", "min s"],
                ["demo upstream alone", str(runs), f"{d:.3f}", f"{min(direct):.3f}"],
                ["gateway + demo upstream", str(runs), f"{g:.3f}", f"{min(gateway):.3f}"],
                ["the gateway's own share", "", f"{g - d:.3f}", ""],
            ]
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--source", help="a checkout to run the gateway from")
    anyio.run(main, parser.parse_args())
