"""`accept`: take the named servers' current tool definitions as their first ones (see proxy/definitions.py).

The servers are started once, as `inspect` does, and asked for their tools: what is accepted is what
they list now, not what some gateway saw earlier (a replica, a run before an upgrade). Other servers'
first definitions are left as they are.

Exit status: 0 every named server accepted; 1 one failed to start (its first definitions are kept);
2 a name that is not an enabled server.
"""

from __future__ import annotations

import logging
import sys

import anyio

from gateway.proxy.definitions import DefinitionLedger
from gateway.proxy.upstream import Upstream
from gateway.services.storage import Storage
from gateway.settings import Settings


async def accept_report(settings: Settings, names: list[str], every: bool = False) -> tuple[list[str], int]:
    servers = settings.enabled_servers
    upstreams = {name: Upstream(name, servers[name], settings.gateway.workspace / "logs") for name in names}
    async with anyio.create_task_group() as tg:
        for upstream in upstreams.values():
            tg.start_soon(upstream.run, name=f"upstream:{upstream.name}")
        with anyio.move_on_after(max(u.config.init_timeout_seconds for u in upstreams.values()) + 1):
            for upstream in upstreams.values():
                await upstream.ready.wait()
        # what each listed, before it stops: (tools, None) or (None, why it did not start)
        listed = {
            name: ([t for t in up.tools if up.config.tools.allows(t.name)], None)  # what the gateway checks
            if up.state == "ok"
            else (None, up.error or up.state)
            for name, up in upstreams.items()
        }
        for upstream in upstreams.values():
            upstream.stop()
    # the ledger is read after the servers answered: a gateway that wrote it meanwhile is not undone
    ledger = await anyio.to_thread.run_sync(
        DefinitionLedger, settings.gateway.workspace / "definitions.json", Storage(settings.storage)
    )
    lines: list[str] = []
    status = 0
    for name, (tools, why) in listed.items():
        if tools is None:
            status = 1
            lines.append(f"{name}: not accepted, it did not start ({why})")
            continue
        lines += ledger.accept(name, tools, servers[name]) or [f"{name}: no change ({len(tools)} tools)"]
    if ledger.damaged and every and status == 0:
        ledger.forget_damage()  # every server's definitions are known again
    elif ledger.damaged:
        lines.append(f"note: {ledger.damaged}; every server stays unknown until all are accepted (--all)")
    if not await anyio.to_thread.run_sync(ledger.flush):
        return [*lines, "the definitions could not be saved (see the log above); nothing was accepted"], 1
    return lines, status


def cmd_accept(settings: Settings, names: list[str], every: bool) -> int:
    servers = settings.enabled_servers
    if every:
        names = list(servers)
    unknown = [name for name in names if name not in servers]
    if unknown or not names:
        known = ", ".join(servers) or "none"
        what = f"no enabled server named {', '.join(unknown)}" if unknown else "name the servers to accept, or --all"
        print(f"mcp-context-gateway accept: {what} (servers: {known})", file=sys.stderr)
        return 2
    # a server that fails to start is reported in the lines; its restart warnings would only repeat it
    logging.getLogger("gateway.upstream").setLevel(logging.ERROR)
    lines, status = anyio.run(accept_report, settings, list(dict.fromkeys(names)), every)
    print("\n".join(lines))
    if status == 0:
        print("accepted; a running gateway serves them after its restart")
    return status
