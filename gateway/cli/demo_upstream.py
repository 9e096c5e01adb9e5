"""A tiny upstream MCP server that ships with the package, for the quick start and `demo`.

    python -m gateway.cli.demo_upstream

It stands in for a real API server: `list_orders` returns about 1.4 MB of JSON (the kind
of result that floods a small model's window), `tail_log` a large plain-text log.
"""

from __future__ import annotations

import json
import random
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

TOOLS = [
    types.Tool(
        name="list_orders",
        description="List recent orders as JSON (large: about 1.4 MB for the default count).",
        input_schema={"type": "object", "properties": {"count": {"type": "integer", "default": 5000}}},
    ),
    types.Tool(
        name="tail_log",
        description="Return the last lines of the service log.",
        input_schema={"type": "object", "properties": {"lines": {"type": "integer", "default": 20000}}},
    ),
    types.Tool(
        name="echo",
        description="Echo the text back (a small result passes through unchanged).",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
]

CITIES = ["Seoul", "Busan", "Berlin", "Lisbon", "Austin", "Osaka", "Toronto", "Nairobi"]
ITEMS = ["keyboard", "monitor", "cable", "laptop stand", "headset", "webcam", "desk lamp", "mouse"]
LEVELS = ["INFO"] * 16 + ["WARN"] * 3 + ["ERROR"]


def orders(count: int) -> dict[str, Any]:
    rng = random.Random(7)
    data = [
        {
            "id": f"ord_{100000 + i}",
            "customer": {"name": f"customer {rng.randrange(5000)}", "city": rng.choice(CITIES)},
            "items": [
                {"sku": f"SKU-{rng.randrange(999):03d}", "name": rng.choice(ITEMS), "qty": rng.randint(1, 4)}
                for _ in range(rng.randint(1, 3))
            ],
            "total": round(rng.uniform(5, 900), 2),
            "status": rng.choice(["paid", "shipped", "refunded", "pending"]),
            "note": "Leave at the front desk. " * rng.randint(0, 3),
        }
        for i in range(count)
    ]
    return {"data": data, "meta": {"count": count, "currency": "EUR", "next_cursor": None}}


def log_lines(lines: int) -> str:
    rng = random.Random(11)
    out = []
    for i in range(lines):
        level = rng.choice(LEVELS)
        ms = rng.randint(3, 900)
        out.append(f"2026-11-30T09:{i // 600 % 60:02d}:{i // 10 % 60:02d}Z {level} api GET /orders/{i} {ms}ms")
    return "\n".join(out)


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "list_orders":
        text = json.dumps(orders(int(args.get("count", 5000))))
    elif params.name == "tail_log":
        text = log_lines(int(args.get("lines", 20000)))
    elif params.name == "echo":
        text = str(args.get("text", ""))
    else:
        return types.CallToolResult(content=[types.TextContent(text=f"unknown tool {params.name}")], is_error=True)
    return types.CallToolResult(content=[types.TextContent(text=text)])


async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return types.ListToolsResult(tools=TOOLS)


server = Server("demo-upstream", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
