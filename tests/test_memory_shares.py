"""One tenant's heavy memory work never stalls another's calls on a shared HTTP gateway, and the gateway
does not keep every session it ever touched in memory."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import (
    ALICE,
    BOB,
    gateway_env,
    gateway_pid,
    http_gateway,
    inproc,
    make_settings,
    ok,
    rss,
    serving,
    tenant_session,
    text_of,
    two_tenants,
)

pytestmark = pytest.mark.anyio
BIG_NOTES, BIG_NOTE = 40, 100_000
LONG_SESSION = 1_500
HUGE_NOTES = 300


def _write_session(folder: Path, session_id: str, texts: list[str], tokens: int | None = None) -> None:
    """A session's log as the gateway writes it (one JSON line per note), made before the gateway starts;
    `tokens`: each note's count as the gateway records it (without it, a reader counts every note)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{session_id}.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts, 1):
            record = {"type": "entry", "id": f"e{i:05d}", "ts": 1_700_000_000 + i, "text": text, "pinned": False}
            if tokens is not None:
                record["tokens"] = tokens
            fh.write(json.dumps(record) + "\n")


def _big_note(i: int) -> str:
    """~100,000 characters in lines of words, each line its own (the ranking reads every line)."""
    lines, size = [], 0
    n = 0
    while size < BIG_NOTE:
        line = f"deploy pipeline cache warm step {i}-{n} checked host-{i}.{n} queue depth {n * 7 + i} ok"
        lines.append(line)
        size += len(line) + 1
        n += 1
    return "\n".join(lines)


async def test_one_tenants_heavy_memory_work_never_stalls_another(tmp_path: Path) -> None:
    """alice recalls over 40 notes of 100,000 characters and compacts a 1,500-note session (the fallback
    summary: no model answers); meanwhile bob's appends and tool listings answer promptly (the ranking
    and the summary used to run on the event loop and stall every call of every tenant)."""
    cmd, port = two_tenants(tmp_path, {}, ["memory"])
    sessions = tmp_path / "ws" / "ns" / "alice" / "sessions"
    _write_session(sessions, "big", [_big_note(i) for i in range(BIG_NOTES)])
    _write_session(
        sessions, "long", [f"step {i}: checked host-{i}.internal port {8000 + i}" for i in range(LONG_SESSION)]
    )
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with tenant_session(url, ALICE) as alice, tenant_session(url, BOB) as bob:
            await bob.call_tool("context_append", {"session_id": "mine", "text": "warm up"})
            done: dict[str, Any] = {}
            waits: list[float] = []

            async def run(name: str, tool: str, args: dict[str, Any]) -> None:
                done[name] = await alice.call_tool(tool, args)

            with anyio.fail_after(300):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run, "recall", "context_recall", {"session_id": "big", "query": "deploy queue depth"})
                    tg.start_soon(run, "compact", "context_compact", {"session_id": "long", "keep_recent": 5})
                    i = 0
                    while len(done) < 2:
                        started = time.monotonic()
                        said = await bob.call_tool("context_append", {"session_id": "mine", "text": f"note {i}"})
                        assert not said.is_error, text_of(said)
                        await bob.list_tools()
                        waits.append(time.monotonic() - started)
                        i += 1
            print(f"bob's {len(waits)} rounds while alice worked: slowest {max(waits):.2f} s")
            assert not done["recall"].is_error and not done["compact"].is_error, text_of(done["compact"])
            assert done["compact"].structured_content["folded"] == LONG_SESSION - 5
            found = done["recall"].structured_content
            assert len(found["matches"]) + found.get("left_out", {}).get("matches", 0) == BIG_NOTES
            assert max(waits) < 2.0, f"bob waited {max(waits):.2f} s for an append and a listing"


def _alive() -> tuple[int, int]:
    """Memory sessions held by this process, and the characters of their notes."""
    from plugins.memory.sessions import Session

    held = [o for o in gc.get_objects() if isinstance(o, Session)]
    return len(held), sum(len(e.text) for s in held for e in s.entries.values())


async def test_sessions_held_in_memory_stay_bounded_and_lose_no_note(tmp_path: Path) -> None:
    """After 60 sessions and one of 40 MB, the gateway holds a bounded number of them and of their bytes
    (every session touched stayed in memory for good, and a lock per session with it); every note is
    still recalled, and a session read back from its log goes on with the next id."""
    from gateway.services.tokens import estimate_tokens

    # each note's count recorded as the gateway records it when it appends one (sessions.py): without it
    # every read of this 40 MB log counts every note with this process's real tokenizers (~8 s a read,
    # twice here); the notes differ in a digit or two only, so one count stands for each
    tokens = estimate_tokens("huge-0 " + "x" * 200_000)
    _write_session(tmp_path / "ws" / "sessions", "huge", [f"huge-{i} " + "x" * 200_000 for i in range(200)], tokens)
    async with inproc(make_settings(tmp_path, {}, plugins=["memory"], budget=4000)) as (gateway, s):
        (memory,) = [p for p in gateway.pipeline.plugins if p.name == "memory"]
        found = await ok(s, "context_recall", {"session_id": "huge", "query": "huge-7", "max_tokens": 200_000})
        assert [m["id"] for m in found["matches"]][:1] == ["e00008"]
        for i in range(60):
            await ok(s, "context_append", {"session_id": f"s{i}", "text": f"ticket OPS-{i} belongs to team {i}"})
        gc.collect()
        sessions, chars = _alive()
        assert sessions <= 40 and chars <= 20_000_000, (sessions, chars)
        assert len(memory._locks) == 0
        for i in range(60):
            recalled = await ok(s, "context_recall", {"session_id": f"s{i}", "query": f"OPS-{i}"})
            assert [m["text"] for m in recalled["matches"]] == [f"ticket OPS-{i} belongs to team {i}"]
        again = await ok(s, "context_append", {"session_id": "s0", "text": "second note of s0"})
        assert again["id"] == "e00002"
        found = await ok(s, "context_recall", {"session_id": "huge", "query": "huge-199", "max_tokens": 200_000})
        assert found["matches"][0]["id"] == "e00200"


@pytest.mark.skipif(sys.platform != "linux", reason="reads the gateway's resident memory from /proc")
async def test_a_huge_session_does_not_stay_in_the_gateways_memory(tmp_path: Path) -> None:
    """A session of 300 notes of 200,000 characters (60 MB of log), recalled twice over HTTP: the gateway's
    resident memory comes back down (it kept every session it had read for good: +121 MB)."""
    from gateway.services.tokens import TokenEstimator

    # each note's count as this gateway (exact_tokens off) records it when it appends one; one stands for all
    tokens = TokenEstimator(exact=False).estimate("huge-0 " + "x" * 200_000)
    _write_session(
        tmp_path / "ws" / "sessions", "huge", [f"huge-{i} " + "x" * 200_000 for i in range(HUGE_NOTES)], tokens
    )
    with http_gateway(tmp_path, "--plugins", "memory", servers={}) as url:
        pid = gateway_pid(tmp_path / "gateway.toml")
        async with tenant_session(url, "") as s:
            await s.call_tool("context_append", {"session_id": "small", "text": "warm up"})
            before = rss(pid)
            for query in ("huge-7", "huge-123"):
                found = await s.call_tool(
                    "context_recall", {"session_id": "huge", "query": query, "max_tokens": 100_000}
                )
                assert not found.is_error and found.structured_content["matches"][0]["text"].startswith(query + " ")
            await s.call_tool("context_append", {"session_id": "small", "text": "after"})
            grown = rss(pid) - before
    print(f"the gateway's resident memory grew by {grown / 1e6:.0f} MB")
    assert grown < 40e6, f"{grown / 1e6:.0f} MB"
