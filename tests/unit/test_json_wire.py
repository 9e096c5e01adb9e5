"""JSON-RPC messages to and from bytes: msgspec where it reads and writes as the standard library does,
the standard library for the rest, so no message reads or writes differently than before."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.services.json_wire import MSGSPEC_READS, dumps, line, loads, strict_loads

MESSAGES = [
    {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t", "arguments": {"q": "서울 날씨"}}},
    {"jsonrpc": "2.0", "id": "gw-1", "result": {"content": [{"type": "text", "text": 'a "quoted"\n\ttab'}]}},
    {"n": [0, -1, 1.5, 1e16, 2.5e-300, 123456789012345678901234567890, -(2**70)], "b": [True, False, None]},
    {"emoji": "😀", "control": "\x00\x1f", "slash": "a/b\\c"},
]


@pytest.mark.parametrize("message", MESSAGES)
def test_a_message_reads_back_as_the_standard_library_reads_it(message: dict) -> None:
    data = dumps(message)
    assert json.loads(data) == message
    assert loads(data) == message == strict_loads(data)
    assert loads(data.decode()) == message


def test_integers_of_any_size_are_kept_exactly() -> None:
    big = 18446744073709551616  # one past 64 bits: orjson would read it as a float
    assert loads(b'{"id":18446744073709551616}') == {"id": big}
    assert type(loads(b"[-9223372036854775809]")[0]) is int
    assert dumps({"id": big}) == b'{"id":18446744073709551616}'


def test_what_is_not_json_for_msgspec_reads_as_the_pump_read_it() -> None:
    assert loads(b'{"a":NaN,"b":Infinity,"c":-Infinity}') == {"a": None, "b": None, "c": None}
    assert loads(b'{"a":1e400}') == {"a": math.inf}
    assert loads(b'{"a":"\\ud800x"}') == {"a": "\ud800x"}  # a lone surrogate's escape
    assert loads('{"a":"\ud800"}') == {"a": "\ud800"}  # and one in a text already decoded
    assert loads(b'{"a":"\xff"}') == {"a": "\ufffd"}  # invalid UTF-8, as the line decoder replaces it
    with pytest.raises(ValueError):
        loads(b'{"a":')
    with pytest.raises(ValueError):
        loads(b'{"a":1} trailing')
    with pytest.raises(RecursionError):
        loads(b"[" * 100_000 + b"]" * 100_000)


def test_the_strict_reader_leaves_the_rest_to_another_parser() -> None:
    for data in (b'{"a":NaN}', b'{"a":"\\udc00"}', b'{"a":"\xff"}', b"not json"):
        with pytest.raises(ValueError):
            strict_loads(data)
    assert strict_loads(b'{"a":"\\ud83d\\ude00"}') == {"a": "😀"}  # a pair is one character


def test_written_lines_are_valid_utf8_json_whatever_the_value() -> None:
    assert dumps({"a": "\ud800"}) == b'{"a":"\\ud800"}'  # the escape again: the line stays UTF-8
    assert dumps({"a": math.nan, "b": math.inf}) == b'{"a":null,"b":null}'  # as pydantic writes them
    assert dumps({1: "x"}) == b'{"1":"x"}'  # as json.dumps writes a number key
    assert dumps({None: "x"}) == b'{"null":"x"}'  # msgspec refuses: the standard library writes it
    assert line({"a": 1}) == b'{"a":1}\n'
    with pytest.raises(TypeError):
        dumps({"a": object()})


def test_a_value_read_as_deep_as_msgspec_reads_is_counted() -> None:
    """msgspec reads a few levels deeper than the standard library writes at the same stack depth: the
    arguments' token count (`json_tokens`, taken in a loop callback) writes them with msgspec too, so
    the deepest arguments a host can send are counted instead of raising there."""
    from gateway.services.tokens import json_tokens

    depth, value = 900, None
    while True:
        try:
            value = loads(b"[" * (depth + 1) + b"]" * (depth + 1))
        except RecursionError:
            break
        depth += 1
    assert value is not None and json_tokens(value) > 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the child's peak memory in /proc")
def test_a_long_line_is_read_within_the_standard_librarys_memory(tmp_path: Path) -> None:
    """A long line (a result the gateway keeps out of the window) is read by the standard library: msgspec
    peaked at about twice its memory there (+293 MB against +144 MB on a 64 MB line)."""
    rows = [{"id": i, "note": "서울 " * 5, "tags": ["a", "b"]} for i in range(200_000)]
    (tmp_path / "line.json").write_text(json.dumps({"rows": rows}, ensure_ascii=False), encoding="utf-8")
    probe = f"""
import json, re
from gateway.services.json_wire import loads
def peak():  # this process's own (ru_maxrss would carry the parent's across fork and exec)
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
line = open({str(tmp_path / "line.json")!r}, "rb").read().decode()
base = peak()
theirs = json.loads(line)
del theirs
mid = peak()
ours = loads(line)
print(mid - base, peak() - mid, len(line))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    theirs, more, size = map(int, out)
    assert size > MSGSPEC_READS and theirs > 0
    assert more <= theirs * 0.1, (theirs, more)  # nothing past the standard library's own peak
