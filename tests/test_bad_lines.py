"""One bad line never stops the gateway: a hand-written raw host and raw upstream around a real gateway
process. Every request with an id is answered; the process lives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import PY, RAW_HELLO, gateway_process, probe, write_config

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "servers" / "raw_server.py")


class RawHost:
    def __init__(self, process: Any):
        self.process = process
        self.buffer = b""

    async def send(self, obj: object) -> None:
        await self.process.stdin.send((obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n")

    async def reply(self, rid: Any) -> dict[str, Any]:
        with anyio.fail_after(30):
            while True:
                while b"\n" not in self.buffer:
                    self.buffer += await self.process.stdout.receive()
                line, _, self.buffer = self.buffer.partition(b"\n")
                message = json.loads(line)
                if message.get("id") == rid:
                    return message

    async def call(self, rid: Any, name: str, arguments: Any) -> dict[str, Any]:
        await self.send(
            {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        )
        return await self.reply(rid)


async def _host(tmp_path: Path, lean: bool, timeout: float = 60, plugins: list[str] | None = None) -> Any:
    servers = {"p": probe("p"), "raw": {"command": PY, "args": [RAW, "--deep"], "timeout_seconds": timeout}}
    cfg = write_config(tmp_path, servers, lean_path=lean, plugins=plugins or [])
    process = await gateway_process(cfg, tmp_path / "gw.err")
    host = RawHost(process)
    await host.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": RAW_HELLO})
    await host.reply(1)
    await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    await host.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    await host.reply(2)
    return process, host


@pytest.mark.parametrize("lean", [True, False])
async def test_deep_nesting_and_odd_ids_never_end_the_process(tmp_path: Path, lean: bool) -> None:
    process, host = await _host(tmp_path, lean)
    async with process:
        try:
            # arguments nested 1,000 and 5,000 levels deep: an error for that id, not the end of the process
            for rid, depth in ((10, 1000), (11, 5000)):
                line = '{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "p__echo", "arguments": {"text": %s}}}'
                await host.send(line % (rid, "[" * depth + "]" * depth))
                answer = await host.reply(rid)
                assert "error" in answer or answer["result"].get("isError"), answer
            # a cancel whose requestId is a list or an object while a call runs
            await host.send(
                {
                    "jsonrpc": "2.0",
                    "id": 20,
                    "method": "tools/call",
                    "params": {"name": "p__slow", "arguments": {"seconds": 1}},
                }
            )
            for odd in ([1, 2], {"a": 1}, True):
                await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": odd}})
            assert "result" in await host.reply(20)
            # an upstream's reply nested 1,500 deep: an error for that call; the upstream's other calls go on
            deep = await host.call(30, "raw__deep", {})
            assert "error" in deep or deep["result"].get("isError"), deep
            after = await host.call(31, "raw__legacy_echo", {"text": "still"})
            assert after["result"]["content"][0]["text"] == "legacy_echo:still"
            assert process.returncode is None
        finally:
            process.terminate()
    assert "Traceback" not in (tmp_path / "gw.err").read_text()


@pytest.mark.parametrize("lean", [True, False])
async def test_non_finite_numbers_reach_the_upstream_as_null_on_both_paths(tmp_path: Path, lean: bool) -> None:
    """Python hosts write NaN from json.dumps: both paths send null (the lean path used to send NaN on,
    and an upstream that drops lines it cannot parse never answered)."""
    process, host = await _host(tmp_path, lean)
    async with process:
        try:
            await host.send(
                '{"jsonrpc": "2.0", "id": 40, "method": "tools/call", "params": {"name": "raw__legacy_echo", "arguments": {"text": NaN}}}'
            )
            answer = await host.reply(40)
            assert answer["result"]["content"][0]["text"] == "legacy_echo:None"
        finally:
            process.terminate()


@pytest.mark.parametrize("lean", [True, False])
async def test_invalid_utf8_is_read_the_same_on_both_paths(tmp_path: Path, lean: bool) -> None:
    """ED A0 80 (an encoded surrogate, not UTF-8) is three U+FFFD on both paths: forwarded alike, never
    a lone surrogate that one path refuses and the other sends."""
    process, host = await _host(tmp_path, lean)
    async with process:
        try:
            line = b'{"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {"name": "raw__legacy_echo", "arguments": {"text": "a\xed\xa0\x80b"}}}'
            await process.stdin.send(line + b"\n")
            answer = await host.reply(50)
            assert answer["result"]["content"][0]["text"] == "legacy_echo:a\ufffd\ufffd\ufffdb", answer
        finally:
            process.terminate()


async def test_a_call_that_cannot_be_written_leaves_no_timer_behind(tmp_path: Path) -> None:
    """Arguments deep enough to parse but too deep to encode again (the write raises): the call is
    answered at once, and no timer of it is left to answer the same id later, when the host has reused
    it for another call."""
    process, host = await _host(tmp_path, True, timeout=1)
    async with process:
        try:
            # read off the line (a shallow stack) but not written again (a deeper one): 973-977 levels here
            deep = "[" * 975 + "]" * 975
            await host.send(
                '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "raw__legacy_echo", '
                f'"arguments": {{"text": {deep}}}}}}}'
            )
            first = await host.reply(7)
            assert "was not called" in json.dumps(first), first  # its write raised: answered at once
            again = await host.call(7, "p__slow", {"seconds": 2})  # the same id, past the first call's timeout
            assert again["result"]["content"][0]["text"] == "slept", again
        finally:
            process.terminate()
    assert "Traceback" not in (tmp_path / "gw.err").read_text()


async def test_a_cancelled_calls_late_huge_reply_leaves_no_files(tmp_path: Path) -> None:
    """A 6 MB reply (spilled to disk as it arrives) to a call the host cancelled, on the SDK's path: the
    SDK drops it, and its files go with it instead of waiting for the 15-minute sweep."""
    process, host = await _host(tmp_path, False, plugins=["offload"])  # offload reads spilled texts
    spill_dir = tmp_path / "ws" / "spill"
    async with process:
        try:
            big = {"name": "raw__late_big", "arguments": {"size": 6_000_000, "delay": 1}}
            await host.send({"jsonrpc": "2.0", "id": 60, "method": "tools/call", "params": big})
            await host.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 60}})
            echo = await host.call(61, "p__echo", {"text": "after"})  # the gateway goes on
            assert "after" in json.dumps(echo)
            # the late reply comes (the server ignores the cancel): its spool folder appears as it arrives,
            # then holds nothing once the reply is dropped (before, its text stayed on disk for 15 minutes)
            with anyio.fail_after(30):
                while not spill_dir.is_dir():
                    await anyio.sleep(0.05)
                while any(spill_dir.iterdir()):
                    await anyio.sleep(0.05)
        finally:
            process.terminate()
