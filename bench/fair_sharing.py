"""Two tenants on one HTTP gateway: bob's plain calls idle, then while alice runs heavy but legal work.

    python bench/fair_sharing.py [--notes 1500] [--idle-calls 90]

The gateway fronts the test suite's probe server with every plugin on and two named tokens. Bob makes
plain calls one after another (an upstream echo, a note, the outline of his own small result): first
alone, then while alice runs the heavy set of `tests/fair_load.py` (40 SQL queries at once on her
25 MB result, two recursive JSONPath slices, the compaction of a 1,500-note session, a recall over 40
notes of 100,000 characters, a flood of sessions past her share). Printed from one run: bob's p50,
p99 and max, idle and under load; alice's calls answered and told to wait; each step's time; the
gateway's resident memory before and at its peak. The load generator shares the two cores.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import table
from conftest import peak_rss, rss, wait_listening
from fair_load import (
    BOB,
    Heavy,
    Plain,
    big_result,
    gateway_command,
    heavy_work,
    pct,
    plain_calls,
    small_result,
    tenant,
)


def row(label: str, plain: Plain) -> list[str]:
    ms = [x * 1000 for x in plain.latencies]
    return [
        label,
        str(len(ms)),
        f"{pct(ms, 0.5):.1f} ms",
        f"{pct(ms, 0.99):.1f} ms",
        f"{max(ms, default=0):.0f} ms",
        str(len(plain.failures)),
    ]


async def measure(url: str, pid: int, notes: int, idle_calls: int) -> None:
    idle, loaded, heavy = Plain(), Plain(), Heavy()
    async with tenant(url, BOB) as bob:
        small = await small_result(bob)
        rid = await big_result(url)
        await plain_calls(bob, small, idle, lambda: len(idle.latencies) + len(idle.failures) >= idle_calls)
        before = rss(pid)
        done = anyio.Event()
        async with anyio.create_task_group() as tg:

            async def alice() -> None:
                try:
                    await heavy_work(url, heavy, rid, notes=notes)
                finally:
                    done.set()

            tg.start_soon(alice)
            await plain_calls(bob, small, loaded, done.is_set)
        peak = peak_rss(pid)
    opened_after = "yes"
    try:
        with anyio.fail_after(10):
            async with tenant(url, BOB) as again:
                await again.call_tool("p__echo", {"text": "after"})
    except Exception as exc:
        opened_after = f"no ({type(exc).__name__})"
    print(
        table(
            [
                ["bob's plain calls", "calls", "p50", "p99", "max", "failed"],
                row("alone", idle),
                row("alice busy", loaded),
            ]
        )
    )
    print(
        f"\nalice: {heavy.answered} calls answered, {heavy.busy} told to wait (over her share), "
        f"{len(heavy.failures)} failed; sessions {heavy.sessions_opened} opened, {heavy.sessions_refused} refused; "
        f"her first flood session then answers {heavy.first_flood_session_status}"
    )
    for failure in (loaded.failures + heavy.failures)[:5]:
        print("  failure:", failure)
    print("alice's steps (s from her start):", ", ".join(f"{s} {t:.1f}" for s, t in heavy.steps))
    print(f"bob opens a new session after the flood: {opened_after}")
    print(f"gateway resident memory: {before / 2**20:.0f} MB before alice, peak {peak / 2**20:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=1_500)
    parser.add_argument("--idle-calls", type=int, default=90)
    parser.add_argument("--no-share", action="store_true", help="leave sessions_per_token unset (older builds)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        argv, url = gateway_command(Path(tmp), sys.executable, share=not args.no_share)
        with open(Path(tmp) / "gateway.err", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp)
        try:
            wait_listening(url.replace("/mcp", "/nothing"), proc)
            started = time.perf_counter()
            anyio.run(measure, url, proc.pid, args.notes, args.idle_calls)
            print(f"run took {time.perf_counter() - started:.0f} s")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
