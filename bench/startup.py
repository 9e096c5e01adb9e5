"""Start-up as a host waits for it: from starting the processes to the answer of the first tools/list.

Both sides in one run, rounds interleaved (a slow moment of the machine hits both):

- the host starting the servers itself, all at once as Claude Code does: each process started, initialized
  and listed in parallel; the host has every tool when the slowest of them answered;
- the gateway (all four plugins) in front of the same servers: one process started, initialized, listed.

The servers: the npm filesystem and everything servers and `mcp-server-time` (PyPI, in the test extras).
The npm ones are installed as the tests install them (`.ci/npm`, `tests/npm_servers.py`; needs npm).

    python bench/startup.py [--runs 7] [--source DIR] [--before DIR] [--floor] [--demo]

`--source` runs the gateway from another checkout; `--before DIR` adds a row for the gateway from another
checkout in the same rounds (two versions compared in one run); `--floor` adds two rows for a process that
only relays the servers' `initialize` and `tools/list` as raw JSON (`bench/startup_floor.py`), once having
read the settings as `serve` does and once having read only the TOML: what any process between the host
and the servers costs at least; `--demo` fronts only the demo upstream instead (no npm needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from common import stdio_session, table  # noqa: E402

PLUGINS = ["offload", "memory", "documents", "monitor"]


def servers(tmp: Path, demo: bool) -> dict[str, dict[str, Any]]:
    """name -> {command, args}: what the host (or the gateway) starts."""
    if demo:
        return {"demo": {"command": sys.executable, "args": ["-m", "gateway.cli.demo_upstream"]}}
    from fleet import python_bin
    from npm_servers import npm_bin

    (tmp / "files").mkdir(exist_ok=True)
    return {
        "fs": {"command": npm_bin("mcp-server-filesystem"), "args": [str(tmp / "files")]},
        "everything": {"command": npm_bin("mcp-server-everything"), "args": ["stdio"]},
        "time": {"command": python_bin("mcp-server-time"), "args": ["--local-timezone", "UTC"]},
    }


def gateway_config(path: Path, workspace: Path, fleet: dict[str, dict[str, Any]]) -> Path:
    lines = ["[gateway]", f"workspace = {json.dumps(str(workspace))}", f"plugins = {json.dumps(PLUGINS)}", ""]
    for name, spec in fleet.items():
        lines += [f"[servers.{name}]", f"command = {json.dumps(spec['command'])}", f"args = {json.dumps(spec['args'])}"]
    path.write_text("\n".join(lines) + "\n")
    return path


async def list_all(
    command: str, argv: list[str], log: Path, env: dict[str, str] | None, cwd: str | None, began: float
) -> tuple[float, int]:
    """Seconds from `began` to the last page of the first listing, and the tools listed. The clock stops
    at the answer, not when the processes have exited after it (a server that lingers on a closed stdin
    costs its host nothing before the first listing)."""
    async with stdio_session(argv, log, python=command, env=env, cwd=cwd) as session:
        tools, cursor = 0, None
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            tools += len(page.tools)
            if not (cursor := page.next_cursor):
                return time.perf_counter() - began, tools


async def host_side(fleet: dict[str, dict[str, Any]], log: Path) -> tuple[float, int]:
    """Every server started, initialized and listed at once; the time until the slowest answered."""
    answers: list[tuple[float, int]] = []

    async def one(spec: dict[str, Any]) -> None:
        answers.append(await list_all(spec["command"], spec["args"], log, None, None, t))

    t = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for spec in fleet.values():
            tg.start_soon(one, spec)
    return max(s for s, _ in answers), sum(n for _, n in answers)


async def gateway_side(config: Path, log: Path, source: str | None) -> tuple[float, int]:
    t = time.perf_counter()
    # `python -m` looks in its working folder first: started in `source`, it runs that checkout
    env = {"PYTHONPATH": source} if source else None
    return await list_all(sys.executable, ["-m", "gateway", "--config", str(config)], log, env, source, t)


async def floor_side(config: Path, log: Path, read_settings: bool) -> tuple[float, int]:
    t = time.perf_counter()
    argv = [str(Path(__file__).resolve().parent / "startup_floor.py"), "--config", str(config)]
    env = {"PYTHONPATH": str(ROOT)}
    return await list_all(sys.executable, argv + (["--settings"] if read_settings else []), log, env, None, t)


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-startup-"))
    fleet = servers(tmp, args.demo)
    config = gateway_config(tmp / "g.toml", tmp / "ws", fleet)
    await host_side(fleet, tmp / "warm.log")  # the first start of each program fills the page cache
    await gateway_side(config, tmp / "warm.log", args.source)
    if args.before:
        await gateway_side(config, tmp / "warm.log", args.before)
    sides = ["host", "gateway"] + (["before"] if args.before else []) + (["settings", "bare"] if args.floor else [])
    times: dict[str, list[float]] = {side: [] for side in ("host", "gateway", "before", "settings", "bare")}
    tools: dict[str, int] = {}
    for _ in range(args.runs):
        for side in sides:
            if side == "host":
                seconds, tools[side] = await host_side(fleet, tmp / "d.log")
            elif side in ("settings", "bare"):
                seconds, tools[side] = await floor_side(config, tmp / "f.log", side == "settings")
            else:
                seconds, tools[side] = await gateway_side(
                    config, tmp / "g.log", args.source if side == "gateway" else args.before
                )
            times[side].append(seconds)
    host = statistics.median(times["host"])
    labels = {
        "host": f"host starts {' + '.join(fleet)}",
        "gateway": "gateway in front of them",
        "before": f"gateway from {args.before}",
        "settings": "floor: raw relay, settings read",
        "bare": "floor: raw relay, TOML read",
    }
    rows = [["first tools/list", "runs", "median s", "min s", "max s", "tools", "/ host"]]
    for side, label in labels.items():
        if times[side]:
            got = times[side]
            median = statistics.median(got)
            rows.append(
                [
                    label,
                    str(len(got)),
                    f"{median:.3f}",
                    f"{min(got):.3f}",
                    f"{max(got):.3f}",
                    str(tools[side]),
                    f"{median / host:.2f}x",
                ]
            )
    print(table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--source", help="a checkout to run the gateway from")
    parser.add_argument("--before", help="another checkout, measured in the same rounds")
    parser.add_argument("--floor", action="store_true", help="add the raw relays (bench/startup_floor.py)")
    parser.add_argument("--demo", action="store_true", help="only the demo upstream (no npm needed)")
    anyio.run(main, parser.parse_args())
