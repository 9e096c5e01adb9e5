"""The line tap takes whole small lines the lean path wants as they arrive; every other byte reaches the
line pump unchanged and in order."""

from __future__ import annotations

import json
from typing import Any

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

    return line_tap(fed.append, intercept), fed, taken


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

    line_tap(fed.append, broken)(msg(1))
    assert fed == [msg(1)]
