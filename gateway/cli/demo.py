"""`demo`: start the gateway exactly as a host would (a child process over stdio), make a few
calls, and print what happened in a form a person reads at a glance."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession

from gateway.proxy.upstream_stdio import linear_stdio_client
from gateway.results import result_text
from gateway.services.costs import definition_tokens
from gateway.services.text import human_size
from gateway.services.tokens import ESTIMATOR, estimate_tokens
from gateway.settings import Settings


def _line(ok: bool, left: str, right: str) -> None:
    print(f"  {'✓' if ok else '✗'} {left:<34} {right}")


async def _call(session: ClientSession, name: str, args: dict[str, Any]) -> types.CallToolResult:
    return await session.send_request(
        types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args)), types.CallToolResult
    )


def _size(result: types.CallToolResult) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


# The server that ships with the package, fronted when no config names a server (a bare `demo`).
BUNDLED = """\
[servers.demo]
command = "${PYTHON}"
args = ["-m", "gateway.cli.demo_upstream"]
max_response_size = 262144
max_response_tokens = 1500
"""


def _gateway_argv(settings: Settings, config: Path | None) -> list[str]:
    argv = ["-m", "gateway", "serve"]
    if config:
        argv += ["--config", str(config)]
    return [*argv, "--workspace", str(settings.gateway.workspace)]


async def run_demo(settings: Settings, temporary: bool = False) -> int:
    config = settings.config_path
    where = str(config) if config else "(no config file)"
    if not settings.enabled_servers:  # nothing of the user's to front: the server that ships with the package
        config = settings.gateway.workspace / "demo.toml"
        config.write_text(BUNDLED, encoding="utf-8")
        where += ": the demo server that ships with the package"
    print(
        f"mcp-context-gateway demo — the gateway runs as a host would start it (stdio child process)\n  config: {where}"
    )
    ESTIMATOR.configure(settings.gateway.tokenizer, settings.gateway.exact_tokens)
    await anyio.to_thread.run_sync(ESTIMATOR.load_exact)  # what the model got, counted as the gateway counts
    env = {k: v for k, v in os.environ.items() if k.startswith("CTX_") or k in ("PYTHONPATH",)}
    with tempfile.TemporaryFile() as errlog:
        async with (
            linear_stdio_client(sys.executable, _gateway_argv(settings, config), env, None, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            tools = (await session.list_tools()).tools
            names = [t.name for t in tools]
            sep = settings.gateway.separator
            upstream_tools = [n for n in names if sep in n]
            servers = sorted({n.split(sep, 1)[0] for n in upstream_tools})
            definitions = definition_tokens(tools)
            print(
                f"  host sees {len(names)} tools (~{definitions} tokens of definitions): "
                f"{len(upstream_tools)} from {', '.join(servers) or 'no server'}, "
                f"{len(names) - len(upstream_tools)} of the gateway's own"
            )
            missing = [s for s in settings.enabled_servers if s not in servers]
            if missing:
                errlog.seek(0)
                tail = errlog.read().decode("utf-8", "replace").strip().splitlines()[-3:]
                print(f"  ✗ servers without tools (failed to start?): {', '.join(missing)}")
                for line in tail:
                    print(f"      {line}")
            if f"demo{sep}list_orders" not in names:
                print("  (the demo calls need the [servers.demo] entry from config.example.toml)")
                return 0 if not missing else 1
            await _demo_calls(session, sep)
    if temporary:
        print("  workspace: a temporary folder, removed now (--workspace DIR keeps one to look at)")
    else:
        print(f"  workspace: {settings.gateway.workspace}")
    return 0


async def _demo_calls(session: ClientSession, sep: str) -> None:
    echo = await _call(session, f"demo{sep}echo", {"text": "hello 안녕"})
    _line(not echo.is_error, f'demo{sep}echo("hello 안녕")', f"small result passed through: {result_text(echo)!r}")
    big = await _call(session, f"demo{sep}list_orders", {"count": 5000})
    text = result_text(big)
    try:
        ref = json.loads(text)
    except ValueError:
        ref = None
    if not isinstance(ref, dict) or "fileRef" not in ref:
        _line(
            False,
            f"demo{sep}list_orders(count=5000)",
            f"{human_size(_size(big))} (~{estimate_tokens(text)} tokens) reached the model: offload is disabled",
        )
        return
    file_ref = ref["fileRef"]
    _line(
        True,
        f"demo{sep}list_orders(count=5000)",
        f"upstream sent {file_ref['sizeHint']} (~{file_ref['tokens']:,} tokens): saved to a file",
    )
    print(f"  {'':36} the model got {human_size(_size(big))} (~{estimate_tokens(text)} tokens): a fileRef + outline")
    print(f"  {'':36} file: {file_ref['path']}")
    outline = await _call(session, "response_outline", {"path": file_ref["id"]})
    data = outline.structured_content or {}
    keys = data.get("keys") or []
    counts = data.get("itemCount") or {}
    summary = ", ".join(f"{k} ({counts[k]} items)" if k in counts else k for k in keys)
    _line(not outline.is_error, f"response_outline({file_ref['id']})", f"{data.get('type')}: {summary}")
    sliced = await _call(session, "response_slice", {"path": file_ref["id"], "json_path": "data.0.customer"})
    value = (sliced.structured_content or {}).get("value")
    _line(not sliced.is_error, "response_slice(json_path='data.0.customer')", json.dumps(value, ensure_ascii=False))
    found = await _call(session, "response_search", {"path": file_ref["id"], "query": "Seoul refunded", "limit": 2})
    hits = (found.structured_content or {}).get("matches") or []
    first = hits[0]["path"] if hits else "-"
    _line(not found.is_error, "response_search('Seoul refunded')", f"{len(hits)} shown, first at {first}")
    note = await _call(session, "context_append", {"session_id": "demo", "text": "orders saved as " + file_ref["id"]})
    if not note.is_error:
        _line(
            True, "context_append(session_id='demo')", f"note {note.structured_content['id']} kept outside the window"
        )
        status = (await _call(session, "context_status", {"session_id": "demo"})).structured_content or {}
        monitor = (status.get("gateway") or {}).get("monitor")
        if usage := (status.get("gateway") or {}).get("usage"):
            print(f"  this session so far: {usage}")
        if monitor and monitor.get("window"):
            print(
                f"  context estimate (tool traffic only): ~{monitor['used_tokens']} of {monitor['window']} tokens, "
                f"{monitor['remaining_pct']}% left, level {monitor['level']}"
            )
        elif monitor:
            print(
                f"  context estimate (tool traffic only): ~{monitor['used_tokens']} tokens; window unknown "
                f"({monitor.get('window_source')}), so no warnings: set context_window or [llm]"
            )


def cmd_demo(settings: Settings, temporary: bool = False) -> int:
    """`temporary`: the workspace is a folder made for this run (no --workspace given)."""
    import anyio

    try:
        return anyio.run(run_demo, settings, temporary)
    finally:
        if temporary:
            shutil.rmtree(settings.gateway.workspace, ignore_errors=True)
