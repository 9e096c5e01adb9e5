"""`serve`: run the gateway for a host, over stdio (default) or Streamable HTTP."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import anyio

from gateway.settings import Settings

log = logging.getLogger("gateway")


def cmd_serve(settings: Settings, reload: Callable[[], Settings] | None = None) -> int:
    from gateway.compat import check_sdk_version
    from gateway.proxy.host_transport import serve_http, serve_stdio
    from gateway.proxy.server import Gateway

    check_sdk_version()
    if not settings.enabled_servers:
        log.warning(
            "no upstream servers configured (pass --config /abs/path/gateway.toml or a host mcp.json; "
            "see config.example.toml): serving only the gateway's own tools"
        )
    if settings.gateway.transport == "stdio" and sys.stdin.isatty():
        print(
            "mcp-context-gateway is waiting for an MCP host on stdin (hosts start it themselves; Ctrl+C stops it). "
            "To try it: `mcp-context-gateway demo`, `mcp-context-gateway inspect "
            "--config FILE`, or `npx @modelcontextprotocol/inspector -- mcp-context-gateway --config FILE` (the `--` keeps --config for the gateway).",
            file=sys.stderr,
        )
    gateway = Gateway(settings)
    serve = serve_http if settings.gateway.transport == "http" else serve_stdio
    anyio.run(serve, gateway, reload)
    return 0
