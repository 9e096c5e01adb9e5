"""One tenant's heavy memory work never stalls another's calls on a shared HTTP gateway, and the gateway
does not keep every session it ever touched in memory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import gateway_env, serving, text_of
from test_front_and_cli import ALICE, BOB, _as, _two_tenants

pytestmark = pytest.mark.anyio
BIG_NOTES, BIG_NOTE = 40, 100_000
LONG_SESSION = 1_500


def _write_session(folder: Path, session_id: str, texts: list[str]) -> None:
    """A session's log as the gateway writes it (one JSON line per note), made before the gateway starts."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{session_id}.jsonl", "w", encoding="utf-8") as fh:
        for i, text in enumerate(texts, 1):
            record = {"type": "entry", "id": f"e{i:05d}", "ts": 1_700_000_000 + i, "text": text, "pinned": False}
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
    cmd, port = _two_tenants(tmp_path, {}, ["memory"])
    sessions = tmp_path / "ws" / "ns" / "alice" / "sessions"
    _write_session(sessions, "big", [_big_note(i) for i in range(BIG_NOTES)])
    _write_session(
        sessions, "long", [f"step {i}: checked host-{i}.internal port {8000 + i}" for i in range(LONG_SESSION)]
    )
    url = f"http://127.0.0.1:{port}/mcp"
    with serving(cmd, f"http://127.0.0.1:{port}/nothing", gateway_env()):
        async with await _as(url, ALICE) as alice, await _as(url, BOB) as bob:
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
