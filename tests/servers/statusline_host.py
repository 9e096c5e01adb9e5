"""A host that starts its own gateway over stdio, as Claude Code or a local agent does:

    python statusline_host.py CONFIG CLIENT_NAME [STATUSLINE_JSON]

With STATUSLINE_JSON it first runs `hook --statusline` through `sh -c` (as Claude Code runs its
statusline command) with that JSON on stdin. Then it prints its gateway's `context_status` window as one
JSON line and waits for its stdin to close, so that two hosts can run side by side.
"""

import json
import os
import subprocess
import sys

import anyio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp_types import Implementation


async def main() -> None:
    config, name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        command = f"{sys.executable} -m gateway hook --statusline"
        subprocess.run(["sh", "-c", command], input=sys.argv[3], text=True, check=True, capture_output=True)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "gateway", "--config", config], env=dict(os.environ)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, client_info=Implementation(name=name, version="1")) as session,
    ):
        await session.initialize()
        await session.call_tool("context_open", {"session_id": "s"})
        status = await session.call_tool("context_status", {"session_id": "s"})
        print(json.dumps({"window": (status.structured_content or {}).get("window")}), flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


anyio.run(main)
