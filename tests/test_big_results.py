"""Huge replies in bounded memory: the long texts of a reply go from the upstream's pipe to the
workspace file without being held whole, and come out byte-identical (issue: big results)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from conftest import PROBE, PY, call, eventually, inproc, make_settings, text_of
from npm_servers import npm_bin

from gateway.services import spill

pytestmark = pytest.mark.anyio

RAW = str(Path(__file__).parent / "servers" / "raw_server.py")
# every kind of character a JSON escape or a read boundary can split
TRICKY = 'plain "quoted" back\\slash\ttab 한국어 텍스트 😀 é \u2028 {"k": [1, 2]}\n'


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def _spill_files(workspace: Path) -> list[Path]:
    folder = workspace / "spill"
    return list(folder.iterdir()) if folder.is_dir() else []


async def test_a_100_mb_file_is_offloaded_byte_identical(tmp_path: Path) -> None:
    """The npm filesystem server sends a 100 MB file as text plus a structuredContent copy (one ~200 MB
    line); the saved file is the original byte for byte, saved once, and nothing is left in the spill."""
    filesystem = npm_bin("mcp-server-filesystem")
    data = tmp_path / "data"
    data.mkdir()
    source = data / "big.txt"
    with open(source, "w", encoding="utf-8") as fh:
        for i in range(100 * 1024 * 1024 // (len(TRICKY.encode()) + 8)):
            fh.write(f"{i:07d} {TRICKY}")
    assert source.stat().st_size > 99 * 1024 * 1024
    settings = make_settings(tmp_path, {"fs": {"command": filesystem, "args": [str(data)]}}, plugins=["offload"])
    async with inproc(settings) as (gateway, session):
        reply = json.loads(
            text_of(await call(session, "fs__read_text_file", {"path": str(source)}, request_read_timeout_seconds=300))
        )
        ref = reply["fileRef"]
        assert "files" not in reply, "the structuredContent copy is not saved a second time"
        assert gateway.spiller is not None and gateway.spiller.spooled == 1
        assert ref["kind"] == "text" and 0 <= ref["size"] - source.stat().st_size < 64  # counted once
        assert _digest(Path(ref["path"])) == _digest(source)
        assert not _spill_files(gateway.settings.gateway.workspace)
        assert not spill.pending()
        line = await call(session, "response_slice", {"path": ref["id"], "start_line": 3, "end_line": 3})
        assert line.structured_content["lines"] == [f"0000002 {TRICKY}".rstrip("\n")]


async def test_a_long_line_that_is_not_too_large_reaches_the_host_whole(tmp_path: Path) -> None:
    """A reply longer than the spill threshold but within the configured limits goes out as text."""
    size = spill.SPILL_ABOVE + 200_000
    settings = make_settings(
        tmp_path,
        {"probe": {"command": PY, "args": [PROBE]}},
        plugins=["offload", "monitor"],
        max_response_size=10 * 1024 * 1024,
        max_response_tokens=10_000_000,
    )
    async with inproc(settings) as (gateway, session):
        result = await call(session, "probe__big", {"size": size, "kind": "text"}, request_read_timeout_seconds=120)
        assert not result.is_error
        text = text_of(result)
        assert len(text) == size and text.startswith("2026-11-30T10:00:00Z INFO")
        assert not _spill_files(gateway.settings.gateway.workspace)
        assert not spill.pending()


async def test_an_upstream_killed_mid_reply_gives_a_clean_error(tmp_path: Path) -> None:
    """The server dies after 8 MB of a reply: the call fails with a message, no partial file is served
    or left behind, and the gateway keeps serving (the server is restarted)."""
    settings = make_settings(
        tmp_path, {"raw": {"command": sys.executable, "args": [RAW, "--cut"]}}, plugins=["offload"]
    )
    async with inproc(settings) as (gateway, session):
        result = await call(session, "raw__cut", {}, request_read_timeout_seconds=60)
        assert result.is_error
        assert "raw" in text_of(result)
        workspace = gateway.settings.gateway.workspace
        assert not _spill_files(workspace)
        saved = list((workspace / "responses").glob("*")) if (workspace / "responses").is_dir() else []
        assert not saved
        raw = gateway.upstreams["raw"]
        await eventually(lambda: raw.restarts >= 1 and raw.state == "ok", 30, "the server restarted")
        again = await call(session, "raw__legacy_echo", {"text": "still here"}, request_read_timeout_seconds=60)
        assert text_of(again) == "legacy_echo:still here"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_structured_copy_made_of_many_values_is_saved_once(tmp_path: Path, transport: str) -> None:
    """A Python SDK server returns 3 MB of JSON as text plus the same object as structuredContent
    (37,500 items, 225,000 values): over stdio and over Streamable HTTP (SSE), one file is saved, equal to
    the text. (A 6.7 MB reply: past the 4 MiB spool threshold and the 20,000 values parsed one by one, as
    the 12 MB it was, at a quarter of the time.)"""
    import subprocess

    from conftest import free_port, wait_listening

    server = None
    if transport == "http":
        port = free_port()
        server = subprocess.Popen([PY, PROBE, "--http", str(port)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(f"http://127.0.0.1:{port}/mcp", server)
        table = {"url": f"http://127.0.0.1:{port}/mcp"}
    else:
        table = {"command": PY, "args": [PROBE]}
    try:
        settings = make_settings(tmp_path, {"probe": table}, plugins=["offload"])
        async with inproc(settings) as (gateway, session):
            args = {"size": 3_000_000, "kind": "structured"}
            reply = json.loads(text_of(await call(session, "probe__big", args, request_read_timeout_seconds=120)))
            assert "files" not in reply, "the structuredContent copy is recognised and not saved again"
            assert gateway.spiller is not None and gateway.spiller.spooled == 1, "the reply went through the spool"
            saved = json.loads(Path(reply["fileRef"]["path"]).read_text())
            assert saved["meta"]["n"] == len(saved["data"]) == 3_000_000 // 80
            assert saved["data"][-1]["name"] == f"item-{3_000_000 // 80 - 1}"
            assert not _spill_files(gateway.settings.gateway.workspace)
            assert not spill.pending()
            small = await call(session, "probe__add", {"a": 1, "b": 2})
            assert small.structured_content == {"sum": 3.0}
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
