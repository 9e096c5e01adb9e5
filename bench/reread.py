"""A real file read through the gateway, then read again: the first read (it offloads and converts) and
the reads after it (the same bytes: a host re-reading a file), this checkout against another one.

    python bench/reread.py --before DIR [--rounds 4] [--reads 6] FILE [FILE ...]

FILE names one of `bench/answers.py`'s real files (installed by it under ~/.cache/ctx-answers: CSV, JSON,
logs, source). Each round starts a gateway (default settings) in front of the npm filesystem server,
reads a small file and waits 4 s so that the real tokenizers have loaded (as in a gateway a host keeps
running), then reads FILE `--reads` times, 0.5 s apart; the two checkouts alternate round by round,
every other round in the other order. Printed per file and checkout: the median first read and the
median of the reads after it, in ms. With `--sql`, each read is followed at once by that response_query on
its result (as a model asks right after the fileRef), then by the same query again on that result: the
median first query after a read and the median query asked again are printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
import answers

HERE = str(Path(__file__).resolve().parent.parent)


async def reads(source: str, name: str, count: int, sql: str) -> tuple[list[float], list[float], list[float]]:
    """The seconds of `count` reads of `name` through a fresh gateway run from `source`, of the query
    `sql` after each, and of that query asked again on the same result (none without it)."""
    work = Path(tempfile.mkdtemp(prefix="ctx-bench-reread-"))
    config = work / "gw.toml"
    config.write_text(
        f"[gateway]\nworkspace = {json.dumps(str(work / 'ws'))}\n\n[servers.fs]\n"
        f"command = {json.dumps(str(answers.FILESYSTEM))}\nargs = [{json.dumps(str(answers.DATA))}]\n"
    )
    # `python -m` started in `source` runs that checkout
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "serve", "--config", str(config)],
        env={**os.environ, "PYTHONPATH": source},
        cwd=source,
    )
    took, asked, again = [], [], []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool("fs__read_text_file", {"path": str(answers.DATA / "utils.py")})
        await anyio.sleep(4)  # the real tokenizers load 2 s after the first long text
        for _ in range(count):
            began = time.perf_counter()
            result = await session.call_tool("fs__read_text_file", {"path": str(answers.DATA / name)})
            took.append(time.perf_counter() - began)
            assert not result.is_error and "fileRef" in result.content[0].text, result
            if sql:
                ref = json.loads(result.content[0].text)["fileRef"]["id"]
                for times in (asked, again):
                    began = time.perf_counter()
                    answer = await session.call_tool("response_query", {"path": ref, "sql": sql})
                    times.append(time.perf_counter() - began)
                    assert not answer.is_error, answer
            await anyio.sleep(0.5)
    return took, asked, again


def medians(runs: list[list[float]]) -> tuple[float, float]:
    """The median first and the median of the rest, in ms."""
    return statistics.median(run[0] for run in runs) * 1000, statistics.median(
        t for run in runs for t in run[1:]
    ) * 1000


async def main(files: list[str], before: str, rounds: int, count: int, sql: str) -> None:
    sides = [("this checkout", HERE), (f"from {before}", before)]
    for name in files:
        runs: dict[str, list[tuple[list[float], list[float], list[float]]]] = {label: [] for label, _ in sides}
        for r in range(rounds):
            for label, source in sides if r % 2 == 0 else sides[::-1]:
                runs[label].append(await reads(source, name, count, sql))
        for label, _ in sides:
            first, again = medians([took for took, _, _ in runs[label]])
            line = f"{name:28} {label:30} first read {first:5.0f} ms, read again {again:5.0f} ms"
            if sql:
                after_read = statistics.median(t for _, asked, _ in runs[label] for t in asked) * 1000
                repeated = statistics.median(t for _, _, again in runs[label] for t in again) * 1000
                line += f"; query after a read {after_read:4.0f} ms, asked again {repeated:4.0f} ms"
            print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--before", required=True, help="another checkout, measured in the same rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--reads", type=int, default=6)
    parser.add_argument(
        "--sql", default="", help="a response_query asked after each read, e.g. SELECT count(*) FROM lines"
    )
    args = parser.parse_args()
    answers.setup()
    anyio.run(main, args.files, args.before, args.rounds, args.reads, args.sql)
