"""Context monitor: levels, debounce, escalation, note size and tone; the host hook as a real process."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path

import mcp_types as types
import pytest
import token_corpus
from conftest import (
    PY,
    ROOT,
    call,
    eventually,
    gateway_env,
    inproc,
    make_settings,
    probe,
    run_cli,
    text_of,
    write_config,
)

pytestmark = pytest.mark.anyio
IMPERATIVE = ("STOP", "MUST", "IMMEDIATELY", "NOW!")


def cl100k(text: str) -> int:
    return len(token_corpus.tokenizers()["cl100k"].encode(text))


def notes_of(result: types.CallToolResult) -> list[str]:
    return [
        b.text
        for b in result.content
        if isinstance(b, types.TextContent) and b.text.startswith(("Context warning", "Context critical"))
    ]


async def test_levels_debounce_and_escalation(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        {"p": probe("p")},
        plugins=["offload", "memory", "monitor"],
        context_window=8000,
        budget=4000,
        max_response_tokens=3000,
    )
    async with inproc(settings) as (gateway, s):
        await s.list_tools()
        definitions = gateway.pipeline.status("stdio")["monitor"]["definitions"]
        assert definitions > 500
        chunk = "word " * 200  # ~206 tokens per call
        seen: list[tuple[float, str | None]] = []
        for _ in range(40):
            result = await call(s, "p__echo", {"text": chunk})
            status = gateway.pipeline.status("stdio")["monitor"]
            notes = notes_of(result)
            assert text_of(result).startswith(chunk)  # the result itself is unchanged
            seen.append((status["remaining_pct"], notes[0] if notes else None))
        warnings = [(i, r) for i, (r, n) in enumerate(seen) if n and n.startswith("Context warning: ")]
        criticals = [(i, r) for i, (r, n) in enumerate(seen) if n and n.startswith("Context critical: only")]
        quiet_above = [n for r, n in seen if r > 35 and n]
        assert not quiet_above, "no note while more than 35% remains"
        first = warnings[0][0]
        assert seen[first][0] <= 35 and seen[first - 1][0] > 35, "the first warning comes at once"
        # then at most one every 5 calls, and the step to CRITICAL does not wait
        assert all(b - a >= 5 for (a, _), (b, _) in itertools.pairwise(warnings))
        crit = criticals[0][0]
        assert seen[crit][0] <= 25 and seen[crit - 1][0] > 25 and crit - warnings[-1][0] < 5
        assert all(b - a == 5 for (a, _), (b, _) in itertools.pairwise(criticals))
        for _, note in seen:
            if note:
                assert cl100k(note) <= 60 and "Consider" in note
                assert not any(word in note for word in IMPERATIVE)
                assert "tool traffic only" in note  # honest about what it measures
        status = (await call(s, "context_status", {"session_id": "m"})).structured_content
        assert status["gateway"]["monitor"]["level"] == "CRITICAL" and status["gateway"]["monitor"]["window"] == 8000


async def test_fresh_host_figure_replaces_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("CTX_HOST_SESSION_ID", "sess-1")
    (tmp_path / "claude-ctx-sess-1.json").write_text(json.dumps({"remaining_percentage": 20, "timestamp": time.time()}))
    settings = make_settings(tmp_path, {"p": probe("p")}, plugins=["monitor"], context_window=1_000_000)
    async with inproc(settings) as (gateway, s):
        result = await call(s, "p__echo", {"text": "tiny"})
        assert notes_of(result) and "reported by the host" in notes_of(result)[0]
        assert gateway.pipeline.status("stdio")["monitor"]["source"] == "reported by the host"
        (tmp_path / "claude-ctx-sess-1.json").write_text(
            json.dumps({"remaining_percentage": 20, "timestamp": time.time() - 120})
        )
        # the bridge is looked up at most once a second: the stale figure is dropped at the next look
        await eventually(lambda: gateway.pipeline.status("stdio")["monitor"]["source"].startswith("gateway estimate"))


def run_hook(stdin: str | bytes, tmp_path: Path, *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    out = subprocess.run(
        [PY, "-m", "gateway", "hook", *args],
        input=stdin if isinstance(stdin, bytes) else stdin.encode(),
        capture_output=True,
        timeout=30,
        env=gateway_env(TMPDIR=str(tmp_path)),
    )
    return out.returncode, out.stdout.decode(), time.monotonic() - started


def bridge(tmp_path: Path, sid: str, remaining: float, age: float = 0) -> None:
    (tmp_path / f"claude-ctx-{sid}.json").write_text(
        json.dumps({"session_id": sid, "remaining_percentage": remaining, "timestamp": time.time() - age})
    )


def test_hook_levels_debounce_and_statusline(tmp_path: Path) -> None:
    event = json.dumps({"session_id": "abc", "hook_event_name": "PostToolUse", "tool_name": "Read"})
    bridge(tmp_path, "abc", 50)
    assert run_hook(event, tmp_path)[:2] == (0, "")
    bridge(tmp_path, "abc", 30)
    code, out, _ = run_hook(event, tmp_path)
    payload = json.loads(out)["hookSpecificOutput"]
    assert code == 0 and payload["hookEventName"] == "PostToolUse" and "about 30%" in payload["additionalContext"]
    assert payload["additionalContext"].startswith("Context warning: ")
    assert [run_hook(event, tmp_path)[1] for _ in range(4)] == [""] * 4
    assert run_hook(event, tmp_path)[1]  # the 5th call after a warning warns again
    bridge(tmp_path, "abc", 20)
    critical = json.loads(run_hook(event, tmp_path)[1])["hookSpecificOutput"]["additionalContext"]
    assert "only about 20%" in critical  # escalation does not wait
    gemini = json.dumps({"session_id": "gem", "hook_event_name": "AfterTool"})
    bridge(tmp_path, "gem", 10)
    assert json.loads(run_hook(gemini, tmp_path)[1])["hookSpecificOutput"]["hookEventName"] == "AfterTool"
    # the statusline side writes the bridge from Claude Code's statusline JSON
    status = json.dumps(
        {"session_id": "sl-1", "context_window": {"used_percentage": 71.5, "context_window_size": 200000}}
    )
    code, out, _ = run_hook(status, tmp_path, "--statusline")
    assert code == 0 and out.strip() == "ctx 28% left"
    saved = json.loads((tmp_path / "claude-ctx-sl-1.json").read_text())
    assert saved["remaining_percentage"] == pytest.approx(28.5) and saved["context_window_size"] == 200000
    assert (
        "about 28%"
        in json.loads(run_hook(json.dumps({"session_id": "sl-1"}), tmp_path)[1])["hookSpecificOutput"][
            "additionalContext"
        ]
    )


@pytest.mark.parametrize(
    "stdin",
    [
        b"",
        b"not json",
        b"[1,2,3]",
        b'{"session_id": "../../etc/passwd"}',
        b'{"session_id": "a/b"}',
        b'{"session_id": "a\\\\b"}',
        b'{"session_id": 42}',
        b'{"session_id": "stale"}',
        b'{"session_id": "missing"}',
        b'{"session_id": "garbage"}',
        b"\xff\xfe\x00binary",
    ],
)
def test_hook_is_silent_on_bad_or_stale_input(tmp_path: Path, stdin: bytes) -> None:
    bridge(tmp_path, "stale", 10, age=120)
    (tmp_path / "claude-ctx-garbage.json").write_text("{broken")
    code, out, _ = run_hook(stdin, tmp_path)
    assert (code, out) == (0, "")


def test_gateway_tool_definitions_fit_in_1500_tokens(tmp_path: Path) -> None:
    """All of the gateway's own tools together, as a host receives them (name, description, inputSchema),
    measured with the real cl100k tokenizer over their JSON with the usual spacing (the compact JSON
    sent on the wire takes about a fifth less); every argument is still there."""
    from gateway.proxy.server import Gateway

    settings = make_settings(tmp_path, {}, plugins=["offload", "memory", "documents", "monitor"])
    gateway = Gateway(settings)
    wire = [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in gateway.visible_tools()]
    assert len(wire) == 16 and all(set(t) == {"name", "description", "inputSchema"} for t in wire)
    total = sum(cl100k(json.dumps(t, ensure_ascii=False)) for t in wire)
    assert total <= 1500, f"gateway tool definitions take {total} tokens"
    arguments = {t["name"]: sorted(t["inputSchema"]["properties"]) for t in wire}
    assert arguments["response_compress"] == [
        "array_head", "array_tail", "json_path", "keys", "max_length", "mode", "path"
    ]  # fmt: skip
    assert arguments["context_compact"] == ["dry_run", "keep_recent", "session_id", "target_tokens"]
    assert arguments["doc_ingest"] == ["file_path", "text", "title"]
    first = {t["name"]: t["description"] for t in wire}  # the tools to call first say so
    assert "Call this first" in first["response_outline"] and "Start here" in first["context_open"]
    sent = sum(cl100k(json.dumps(t, ensure_ascii=False, separators=(",", ":"))) for t in wire)
    cfg = write_config(tmp_path, {}, plugins=["offload", "memory", "documents", "monitor"])
    out = run_cli("inspect", "--config", str(cfg))
    gateway_row = next(line for line in out.stdout.splitlines() if line.startswith("(gateway)"))
    assert int(gateway_row.split()[-2].strip("~").replace(",", "")) >= sent  # inspect's estimate leans high


def test_a_hosts_statusline_reaches_only_the_gateway_that_host_started(tmp_path: Path) -> None:
    """Claude Code's statusline reports a 200k window; a local agent's gateway on the same machine (same
    temp folder) keeps its own figures, while the gateway Claude Code started takes the host's window."""
    config = write_config(tmp_path, {}, plugins=["memory", "monitor"])
    host = str(Path(__file__).parent / "servers" / "statusline_host.py")
    env = gateway_env(TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    payload = json.dumps(
        {"session_id": "cc-1", "context_window": {"context_window_size": 200_000, "used_percentage": 42}}
    )
    hosts: list[subprocess.Popen[str]] = []
    seen = []
    try:
        # one after the other, both alive: the agent's gateway starts when the figure is already there
        for name, extra in (("claude-code", [payload]), ("my-local-agent", [])):
            argv = [PY, host, str(config), name, *extra]
            hosts.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            seen.append(json.loads(hosts[-1].stdout.readline() or "{}"))  # type: ignore[union-attr]
    finally:
        for h in hosts:
            h.communicate("", timeout=30)
    claude, local = seen
    assert (tmp_path / "claude-ctx-cc-1.json").is_file()  # the figure was there for both to see
    assert claude["window"] == "200000 tokens (reported by the host)", claude
    assert "200000" not in local["window"] and "reported by the host" not in local["window"], local


def test_every_argument_of_the_gateways_tools_says_what_it_is() -> None:
    """A model sees only the schema: each count and bound a model cannot guess has its default or says how
    it is chosen (every word of it is in every window: the rest stay bare); the path argument says which
    paths it takes."""
    from gateway.pipeline import load_plugins

    tools = [t.tool for p in load_plugins(None, []) for t in p.tools()]
    for tool in tools:
        for name, schema in tool.input_schema.get("properties", {}).items():
            if name in ("limit", "offset", "max_tokens", "start", "end", "keep_recent", "target_tokens"):
                assert "default" in schema or schema.get("description"), (tool.name, name)
    paths = {t.name: t.input_schema["properties"].get("path", {}) for t in tools if t.name.startswith("response_")}
    assert all("fileRef id, or the path it gives" in p["description"] for p in paths.values()), paths


async def test_a_fifo_in_place_of_the_bridge_file_never_stalls_the_gateway(tmp_path: Path) -> None:
    """Anyone on the machine can make `claude-ctx-<id>.json` a FIFO in the shared temp folder: opened for
    reading it waits for a writer for good, and it used to be opened on the event loop. The gateway
    answers, on its own estimate."""
    import os

    import anyio
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    folder = tmp_path / "tmp"
    folder.mkdir()
    os.mkfifo(folder / "claude-ctx-x.json")
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["memory", "monitor"])
    env = gateway_env(TMPDIR=str(folder), CTX_HOST_SESSION_ID="x")
    with open(tmp_path / "gw.err", "wb") as err:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], env, None, err) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            with anyio.fail_after(30):
                assert text_of(await call(session, "p__echo", {"text": "hi"})).startswith("hi")
                status = (await call(session, "context_status", {"session_id": "s"})).structured_content
            assert "reported by the host" not in json.dumps(status)


async def test_a_long_result_nobody_offloads_is_counted_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose results are never offloaded: the monitor counts its long result in a thread (an
    exact count of a few MB holds the loop for tens of ms); a short one it counts at once."""
    import threading

    import gateway.plugin

    loop_thread = threading.current_thread()
    counted: list[tuple[int, bool]] = []  # (text length, on the loop)
    real_cost = gateway.plugin.result_cost

    def result_cost(result: types.CallToolResult, *known: object) -> object:
        size = sum(len(b.text) for b in result.content if isinstance(b, types.TextContent))
        counted.append((size, threading.current_thread() is loop_thread))
        return real_cost(result, *known)

    monkeypatch.setattr(gateway.plugin, "result_cost", result_cost)
    servers = {"p": probe("p", offload_tools={"echo": "never"})}
    async with inproc(make_settings(tmp_path, servers, plugins=["offload", "monitor"])) as (gateway, session):
        text = "word " * 100_000  # 500 KB, passed on whole
        assert text_of(await call(session, "p__echo", {"text": text})) == text
        assert counted and all(not on_loop for size, on_loop in counted if size >= len(text)), counted
        assert gateway.pipeline.status("stdio")["monitor"]["results"] > 100_000  # and it counts in the figures
