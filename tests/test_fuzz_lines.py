"""Hostile lines at a real gateway process, for a bounded count: deep nesting, ids of every wrong type,
non-finite numbers, invalid UTF-8, huge and empty lines, wrong-typed params of every method the gateway
answers itself, and a raw upstream whose replies are hostile too. The process lives, every request with a
valid id is answered, and the lean path and the SDK's path send the host the same bytes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import PY, RAW_HELLO, gateway_process, probe, write_config

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "servers" / "raw_server.py")
METHODS = [
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "ping",
]
ODD_VALUES: list[Any] = [None, True, 0, -1, 1.5, "", "x" * 3000, [], [1, [2]], {}, {"a": {"b": None}}]


def hostile_lines(seed: int, count: int) -> tuple[list[bytes], list[int]]:
    """Lines, and the ids of the requests among them that a JSON-RPC peer must answer."""
    rng = random.Random(seed)
    lines: list[bytes] = []
    answered: list[int] = []
    for n in range(count):
        rid = 1000 + n
        kind = rng.randrange(9)
        if kind == 0:  # wrong-typed params of a method the gateway answers
            params = rng.choice([*ODD_VALUES, {"name": rng.choice(ODD_VALUES), "arguments": rng.choice(ODD_VALUES)}])
            body = {"jsonrpc": "2.0", "id": rid, "method": rng.choice(METHODS), "params": params}
            lines.append(json.dumps(body).encode())
            answered.append(rid)
        elif kind == 1:  # an id of a type no JSON-RPC id has: nobody to answer, nothing may break
            body = {"jsonrpc": "2.0", "id": rng.choice([[1], {"a": 1}, 1.5, True]), "method": "tools/list"}
            lines.append(json.dumps(body).encode())
        elif kind == 2:  # nested deeper than any parser goes
            depth = rng.choice([200, 1100, 4000])
            text = "[" * depth + "]" * depth
            lines.append(
                b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "raw__legacy_echo", '
                b'"arguments": {"text": %s}}}' % (rid, text.encode())
            )
            answered.append(rid)
        elif kind == 3:  # non-finite numbers
            value = rng.choice(["NaN", "Infinity", "-Infinity"])
            lines.append(
                b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "raw__legacy_echo", '
                b'"arguments": {"text": %s}}}' % (rid, value.encode())
            )
            answered.append(rid)
        elif kind == 4:  # bytes that are not UTF-8
            junk = bytes(rng.choice([0xFF, 0xED, 0xA0, 0x80, 0xC3, 0xE2, 0x82]) for _ in range(rng.randrange(1, 6)))
            lines.append(
                b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "raw__legacy_echo", '
                b'"arguments": {"text": "a%sb"}}}' % (rid, junk)
            )
            answered.append(rid)
        elif kind == 5:  # empty and whitespace lines, and a line that is not JSON
            lines.append(rng.choice([b"", b"   ", b"\t", b"not json at all", b"{", b"]"]))
        elif kind == 6:  # a cancel for a request id of a wrong type
            params = {"requestId": rng.choice(ODD_VALUES), "reason": rng.choice(ODD_VALUES)}
            lines.append(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}).encode())
        elif kind == 7:  # a huge line
            text = "y" * rng.choice([70_000, 300_000])
            body = {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "tools/call",
                "params": {"name": "raw__legacy_echo", "arguments": {"text": text}},
            }
            lines.append(json.dumps(body).encode())
            answered.append(rid)
        else:  # an ordinary call between them
            body = {
                "jsonrpc": "2.0",
                "id": rid,
                "method": "tools/call",
                "params": {"name": "raw__legacy_echo", "arguments": {"text": f"n{n}"}},
            }
            lines.append(json.dumps(body).encode())
            answered.append(rid)
    return lines, answered


async def _run(tmp_path: Path, lean: bool, lines: list[bytes], answered: list[int]) -> dict[int, bytes]:
    folder = tmp_path / ("lean" if lean else "sdk")
    folder.mkdir()
    servers = {"p": probe("p"), "raw": {"command": PY, "args": [RAW, "--deep"]}}
    cfg = write_config(folder, servers, lean_path=lean)
    replies: dict[int, bytes] = {}
    process = await gateway_process(cfg, folder / "gw.err")
    async with process:
        assert process.stdin is not None and process.stdout is not None
        buffer = b""

        async def read_until(done: Any) -> None:
            nonlocal buffer
            while not done():
                while b"\n" not in buffer:
                    chunk = await process.stdout.receive()
                    buffer += chunk
                line, _, buffer = buffer.partition(b"\n")
                message = json.loads(line)
                if isinstance(message.get("id"), int):
                    replies[message["id"]] = line

        await process.stdin.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": RAW_HELLO}).encode() + b"\n"
        )
        await process.stdin.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        await process.stdin.send(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}\n')
        with anyio.fail_after(30):
            await read_until(lambda: 2 in replies)
        for line in lines:
            await process.stdin.send(line + b"\n")
        with anyio.fail_after(120):
            await read_until(lambda: all(rid in replies for rid in answered))
        assert process.returncode is None  # alive after all of it
        process.terminate()
    assert "Traceback" not in (folder / "gw.err").read_text(errors="replace")
    return replies


def hostile_upstream_calls(count: int) -> tuple[list[bytes], list[int]]:
    """Calls whose upstream writes hostile lines before its reply: empty, not JSON, nested 1,500 deep,
    ids of wrong types, replies to ids nobody sent (its own and the lean path's), NaN, bytes that are not
    UTF-8, a 5 MB notification."""
    calls = [
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 5000 + n,
                "method": "tools/call",
                "params": {"name": "raw__junk", "arguments": {"n": n}},
            }
        ).encode()
        for n in range(count)
    ]
    return calls, [5000 + n for n in range(count)]


async def test_hostile_lines_on_both_sides_never_stop_the_gateway(tmp_path: Path) -> None:
    lines, answered = hostile_lines(seed=20261201, count=120)
    upstream_lines, upstream_answered = hostile_upstream_calls(12)
    lines, answered = lines + upstream_lines, answered + upstream_answered
    lean = await _run(tmp_path, True, lines, answered)
    sdk = await _run(tmp_path, False, lines, answered)
    assert set(answered) <= set(lean) and set(answered) <= set(sdk)  # every valid id answered on both paths
    assert all(b"after junk" in lean[rid] for rid in upstream_answered)  # the upstream's reply got through
    differ = [rid for rid in answered if lean[rid] != sdk[rid]]
    assert not differ, [(lean[r][:200], sdk[r][:200]) for r in differ[:3]]
