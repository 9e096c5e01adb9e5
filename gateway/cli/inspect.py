"""`inspect`: start every upstream, report state and what the host would receive."""

from __future__ import annotations

import anyio

from gateway.cli.table import table
from gateway.proxy.server import Gateway
from gateway.services.costs import definition_tokens
from gateway.settings import Settings


async def inspect_report(settings: Settings) -> tuple[str, bool]:
    gateway = Gateway(settings)
    async with gateway.running():
        await gateway.wait_ready()
        with anyio.move_on_after(settings.llm.timeout_seconds):
            await gateway.llm.started.wait()
        by_server = gateway.routing.definitions_by_server()
        rows = [["server", "transport", "state", "tools", "def. tokens"]]
        ok = True
        for name, up in gateway.upstreams.items():
            state = up.state if up.state == "ok" else f"{up.state}: {up.error or 'no answer yet'}"
            ok = ok and up.state == "ok"
            rows.append([name, up.transport, state, str(len(by_server[name])), str(definition_tokens(by_server[name]))])
        own = [spec.tool for spec in gateway.own_tools.values()]
        rows.append(["(gateway)", "-", "ok", str(len(own)), str(definition_tokens(own))])
        listed = await gateway.listed_tools("inspect")
        mode, reason = gateway.catalog_mode.decide("inspect")
        upstream_all = list(gateway.routing.tools.values())
        meta = [spec.tool for spec in gateway.meta_tools.values()]
        pinned = [
            t
            for n, t in gateway.routing.tools.items()
            if gateway.upstreams[gateway.routing.tool_routes[n].server].config.pin
        ]
        lines = [
            table(rows),
            "",
            f"host receives {len(listed)} tools, ~{definition_tokens(listed)} tokens of definitions "
            f"(tool mode {mode}; {reason})",
            f"  direct mode would list {len(own) + len(upstream_all)} tools, ~{definition_tokens(own + upstream_all)}"
            f" tokens; catalog mode {len(own) + len(meta) + len(pinned)} tools, "
            f"~{definition_tokens(own + meta + pinned)} tokens",
            gateway.llm.describe(),
            f"window {gateway.window.for_session('inspect').describe()}; budget {gateway.window.budget('inspect')} "
            f"tokens; results above {gateway.window.max_response_tokens(None, 'inspect')} tokens are offloaded",
        ]
        for line in gateway.routing.collisions:
            ok = False
            lines.append(f"collision: {line}")
        for line in gateway.routing.dropped:
            ok = False
            lines.append(line)
        for line in gateway.routing.changed.values():
            lines.append(f"changed: {line} (remove {gateway.routing.ledger.path} to accept)")
        for name, why in gateway.pipeline.failed.items():
            ok = False
            lines.append(f"plugin {name} failed to start and is left out: {why}")
        for figures in gateway.pipeline.status("inspect").items():
            lines.append(f"{figures[0]}: " + ", ".join(f"{k}={v}" for k, v in figures[1].items()))
        for name, up in gateway.upstreams.items():
            if up.state != "ok" and up.transport == "stdio":
                lines.append(f"{name}: see {up.log_path} for its stderr")
    return "\n".join(lines), ok


def cmd_inspect(settings: Settings) -> int:
    report, ok = anyio.run(inspect_report, settings)
    print(report)
    return 0 if ok else 1
