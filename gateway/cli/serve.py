"""`serve`: run the gateway for a host, over stdio (default) or Streamable HTTP.

Start-up is part of every host's wait, and most of the gateway's own is importing the SDK: the upstream
processes are started first (from the settings alone), then the plugins' early work (`gateway.early`: offload's
SQL worker), and the SDK, the front server and the plugins load while they start."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.proxy.server import Gateway

log = logging.getLogger("gateway")


def cmd_serve(settings: Settings, reload: Callable[[], Settings] | None = None) -> int:
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
    from gateway.services import heap

    heap.collect_less()
    anyio.run(_serve, settings, reload)
    heap.exiting()
    return 0


async def _serve(settings: Settings, reload: Callable[[], Settings] | None) -> None:
    from gateway import early
    from gateway.proxy.upstream_spawn import prestart
    from gateway.services import heap

    started = await prestart(settings.enabled_servers, settings.gateway.logs_dir)
    early.start(settings.gateway.plugins, settings.gateway.disabled_plugins)  # beside the imports below
    try:
        from gateway.compat import check_sdk_version, ignore_sdk_deprecations
        from gateway.proxy.host_transport import serve_http, serve_stdio
        from gateway.proxy.server import Gateway

        ignore_sdk_deprecations()
        check_sdk_version()
        gateway = Gateway(settings, started=started)
        heap.started()
    except BaseException:  # no upstream took its process: stop them here
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for one in started.values():
                    tg.start_soon(one.aclose)
        raise
    serve = serve_http if settings.gateway.transport == "http" else serve_stdio
    # a plain task, not a task group's: serve's own errors reach the command line unwrapped
    settle = asyncio.ensure_future(_serving(gateway))
    try:
        await serve(gateway, reload)
    finally:
        settle.cancel()


async def _serving(gateway: Gateway) -> None:
    """A little after the upstreams started (or gave up), once the host's first listing is answered: what
    lives as long as the process is frozen (`heap.serving`)."""
    from gateway.services import heap

    await gateway.wait_ready()
    await anyio.sleep(heap.FREEZE_AFTER)
    heap.serving()
