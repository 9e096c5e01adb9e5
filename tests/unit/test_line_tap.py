"""The line tap takes whole small lines the lean path wants as they arrive; every other byte reaches the
line pump unchanged and in order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.proxy import stdio_lines
from gateway.proxy.stdio_lines import line_tap


def _tap(wanted: set[int]) -> tuple[Any, list[bytes], list[int]]:
    fed: list[bytes] = []
    taken: list[int] = []

    def intercept(raw: Any) -> bool:
        if isinstance(raw, dict) and raw.get("id") in wanted:
            taken.append(raw["id"])
            return True
        return False

    return line_tap(fed.append, intercept, lambda line: True), fed, taken


def msg(i: int) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "result": {}}).encode() + b"\n"


def test_whole_lines_are_taken_up_to_the_first_one_not_wanted() -> None:
    tap, fed, taken = _tap({1, 2, 4})
    tap(msg(1) + msg(2) + msg(3) + msg(4))
    assert taken == [1, 2]
    assert fed == [msg(3) + msg(4)]  # 4 stays behind 3: the pump sees them in order (and may take 4 itself)


def test_a_read_that_ends_inside_a_line_leaves_the_next_read_to_the_pump() -> None:
    tap, fed, taken = _tap({1, 2, 3})
    whole = msg(1) + msg(2)
    tap(whole[:10])  # ends mid-line: not looked at
    tap(whole[10:])  # starts mid-line: not looked at either
    assert taken == [] and b"".join(fed) == whole
    tap(msg(3))  # back at a line boundary
    assert taken == [3]


def test_junk_and_big_reads_go_to_the_pump(monkeypatch) -> None:
    tap, fed, taken = _tap({1})
    tap(b"not json\n" + msg(1))
    tap(b"\xff\xfe broken utf-8\n")
    assert taken == [] and fed == [b"not json\n" + msg(1), b"\xff\xfe broken utf-8\n"]
    monkeypatch.setattr(stdio_lines, "TAP_LIMIT", 10)
    tap(msg(1))
    assert taken == [] and fed[-1] == msg(1)


def test_a_failing_intercept_loses_nothing() -> None:
    fed: list[bytes] = []

    def broken(raw: Any) -> bool:
        raise RuntimeError("bug")

    line_tap(fed.append, broken, lambda line: True)(msg(1))
    assert fed == [msg(1)]


def test_lines_not_worth_a_look_are_not_decoded() -> None:
    fed: list[bytes] = []
    decoded: list[Any] = []

    def intercept(raw: Any) -> bool:
        decoded.append(raw)
        return True

    tap = line_tap(fed.append, intercept, lambda line: b'"tools/call"' in line)
    call = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}\n'
    tap(call + msg(2))
    assert len(decoded) == 1 and fed == [msg(2)]  # the listing's reply reached the pump undecoded


def test_the_lean_paths_byte_checks() -> None:
    from gateway.proxy.lean import LeanFront, RawRequests

    front = LeanFront(lambda: None, None, None, None, None, None, None)  # type: ignore[arg-type]
    assert front.worth(b'{"method": "tools/call", "id": 3}\n')
    assert not front.worth(b'{"method":"tools/list","id":3}\n')
    assert not front.worth(b'{"method":"notifications/cancelled","params":{"requestId":3}}\n')  # no calls run
    raw = RawRequests()
    assert not raw.worth(msg(1))  # nothing pending: the upstream's lines go to the SDK undecoded


@pytest.mark.anyio
async def test_senders_wait_for_room_instead_of_piling_up_in_the_pipe() -> None:
    """A peer that stops reading: twenty 512 KB replies wait in their senders; the pipe's buffer holds
    about one more line than the 1 MB the non-waiting writer allows, not all ten megabytes."""
    import asyncio
    import sys

    from gateway.proxy.stdio_lines import WRITE_BEHIND, stream_sinks

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)", stdin=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdin is not None
        send, _ = stream_sinks(proc.stdin)
        line = b"x" * (512 * 1024) + b"\n"
        tasks = [asyncio.ensure_future(send(line)) for _ in range(20)]
        for _ in range(200):  # every sender has had its turns: each waits for room or holds the lock
            await asyncio.sleep(0)
        assert proc.stdin.transport.get_write_buffer_size() <= WRITE_BEHIND + 2 * len(line)
        assert sum(t.done() for t in tasks) < 20
        for task in tasks:
            task.cancel()
    finally:
        proc.kill()
        await proc.wait()
