"""`inspect`: start every upstream, report state and what the host would receive.

Exit status: 0 every server is up; 1 a server failed to start otherwise (or a tool was left out); 2 the
setup is wrong (a command not on PATH, a server that exits at once, a tool override naming no tool), as for
a config error.
"""

from __future__ import annotations

import logging
import textwrap

import anyio

from gateway.cli.table import table
from gateway.proxy.server import Gateway
from gateway.proxy.upstream import EXITED_AT_START
from gateway.services.costs import definition_tokens
from gateway.services.tokens import ESTIMATOR
from gateway.settings import Settings

WIDTH = 100


async def inspect_report(settings: Settings, verbose: bool = False) -> tuple[str, int]:
    gateway = Gateway(settings)
    status = 0
    async with gateway.running():
        await gateway.wait_ready()
        with anyio.move_on_after(settings.llm.timeout_seconds):
            await gateway.llm.started.wait()
        by_server = gateway.routing.definitions_by_server()
        rows = [["server", "transport", "state", "tools", "definitions"]]
        problems: list[str] = []
        for name, up in gateway.upstreams.items():
            tools = by_server[name]
            rows.append([name, up.transport, up.state, str(len(tools)), f"~{definition_tokens(tools):,} tokens"])
            if up.state != "ok":
                reason = (up.error or "no answer yet") + (up.stdout_note() if up.state == "starting" else "")
                problem = up.error if up.config_broken else up.config.command_problem()
                # 2: the setup must change (a command not on PATH, a server that exits at once: a missing
                # key or argument); 1: the server failed otherwise (timed out, refused, went away)
                status = max(status, 2 if problem or reason.startswith(EXITED_AT_START) else 1)
                log_hint = ""
                if up.transport == "stdio" and up.log_path.is_file() and up.log_path.stat().st_size:
                    log_hint = f" (full log: {up.log_path})"
                problems.append(f"{name}: {up.state}: {problem or reason}{log_hint}")
        for name, cfg in settings.servers.items():
            if not cfg.enabled:
                rows.append([name, cfg.transport, "disabled", "-", "-"])
        own = [spec.tool for spec in gateway.own_tools.values()]
        rows.append(["(gateway)", "-", "ok", str(len(own)), f"~{definition_tokens(own):,} tokens"])
        mode, reason = gateway.catalog_mode.decide("inspect")
        shown = await gateway.listed_tools("inspect")
        other = "catalog" if mode == "direct" else "direct"
        alternative = await gateway.listed_tools("inspect", other)  # counted the same way as `shown`
        lines = [table(rows, right={3})]
        if verbose:  # each tool as the host sees it, with what its definition costs in every request
            listed = [["server", "tool", "definition"]]
            for name, tools in {**by_server, "(gateway)": own}.items():
                listed += [[name, t.name, f"~{definition_tokens([t]):,} tokens"] for t in tools]
            lines += ["", table(listed, right={2})]
        if problems:
            lines += ["", "problems:"] + [_wrapped(p) for p in problems]
        lines += [
            "",
            f"the host receives {len(shown)} tools, ~{definition_tokens(shown):,} tokens of definitions "
            f"(tool mode {mode}: {reason})",
            f"in {other} mode it would receive {len(alternative)} tools, ~{definition_tokens(alternative):,} tokens",
            gateway.llm.describe(),
            f"storage: {gateway.context.storage.check()}",
            f"window {gateway.window.for_session('inspect').describe()}; budget {gateway.window.budget('inspect'):,} "
            f"tokens; results above {gateway.window.max_response_tokens(None, 'inspect'):,} tokens are offloaded",
        ]
        notes: list[str] = []
        for line in gateway.routing.collisions:
            status = max(status, 1)
            notes.append(f"collision: {line}")
        for line in gateway.routing.dropped:
            status = max(status, 1)
            notes.append(line)
        for line in gateway.routing.config_problems:
            status = 2  # the config must change
            notes.append(f"config: {line}")
        for name, line in gateway.routing.changed.items():
            route = gateway.routing.tool_routes.get(name)  # None: the changed tool was left out
            how = gateway.routing.ledger.how_to_accept(route.server if route is not None else "SERVER")
            notes.append(f"changed: {line} ({how} to accept)")
        for name, why in gateway.pipeline.failed.items():
            status = max(status, 1)
            notes.append(f"plugin {name} failed to start and is left out: {why}")
        started = [p.name for p in gateway.pipeline.plugins if p.name not in gateway.pipeline.failed]
        lines.append(f"plugins: {', '.join(started) or 'none'}")
        for name, figures in gateway.pipeline.status("inspect").items():
            if warning := figures.get("warning"):
                notes.append(f"plugin {name}: {warning}")
        if notes:
            lines += ["", *(_wrapped(n) for n in notes)]
    return "\n".join(lines), status


def _wrapped(text: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)


def cmd_inspect(settings: Settings, verbose: bool = False) -> int:
    # the table reports every failed start; the restart warnings would only repeat it
    logging.getLogger("gateway.upstream").setLevel(logging.ERROR)
    ESTIMATOR.configure(settings.gateway.tokenizer, settings.gateway.exact_tokens)
    ESTIMATOR.load_exact()  # its figures are read once: the real tokenizers' counts, not the estimate before them
    report, status = anyio.run(inspect_report, settings, verbose)
    print(report)
    return status
