"""plugins.offload.json_file: small JSON files parsed once per content, within a memory budget."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest

from plugins.offload import json_file


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    json_file._VALUES.clear()


def _records(n: int, tag: str) -> str:
    return json.dumps({"items": [{"id": i, "name": f"{tag}-{i}", "tags": [tag, str(i)]} for i in range(n)]})


def test_a_result_read_again_shares_the_value_already_parsed(tmp_path: Path) -> None:
    """A file read again is saved as another result with the same bytes: one parsed value serves both
    (each copy held ~4x its bytes, and every full pass of the garbage collector walked all of them)."""
    first, again, other = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    first.write_text(_records(200, "x"))
    again.write_text(_records(200, "x"))
    other.write_text(_records(200, "y"))
    assert json_file.parsed(first) is json_file.parsed(again)
    assert json_file.parsed(other) is not json_file.parsed(first)
    assert json_file.parsed(other)["items"][0]["name"] == "y-0"


def test_a_file_written_again_is_parsed_anew(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"v": 1}')
    assert json_file.parsed(path) == {"v": 1}
    path.write_text('{"v": 22}')  # another size: another version of the file
    assert json_file.parsed(path) == {"v": 22}


def test_broken_json_says_where(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"v": 1,}')
    with pytest.raises(json_file.BrokenJSON, match="line 1, column 9"):
        json_file.parsed(path)


def test_the_values_kept_parsed_stay_within_their_budget(tmp_path: Path) -> None:
    """24 different results of 1.1 MB each, parsed one after the other: the cache keeps the newest within
    CACHE_BYTES of files, ~117 MB of Python objects for these (a 64 MB budget held all 24: ~215 MB)."""
    paths = []
    for i in range(24):
        path = tmp_path / f"r{i}.json"
        path.write_text(_records(20_000, f"t{i}"))
        paths.append(path)
    gc.collect()
    tracemalloc.start()
    try:
        for path in paths:
            json_file.parsed(path)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    size = paths[0].stat().st_size
    assert sum(s for s, _ in json_file._VALUES.values()) <= json_file.CACHE_BYTES
    assert held < 160 * 2**20, f"{held / 2**20:.0f} MB held for files of {size / 2**20:.1f} MB"
    assert json_file.parsed(paths[-1])["items"][-1]["name"] == "t23-19999"


def test_two_callers_never_share_a_parsed_value(tmp_path: Path) -> None:
    """Each caller's results live in a folder of their own: the same document fetched by two callers is
    parsed for each (how fast it parsed would tell one caller what the other fetched)."""
    text = _records(200, "x")
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    first, second = tmp_path / "alice" / "a.json", tmp_path / "bob" / "a.json"
    first.write_text(text)
    second.write_text(text)
    assert json_file.parsed(first) is not json_file.parsed(second)
    assert json_file.parsed(first) == json_file.parsed(second)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2, "big": 123456789012345678901234567890, "f": [-0, -0.0, 1E2, 1e-7], "z": "\\u0000"}',
        '{"n": NaN, "i": Infinity, "huge": 1e400}',  # not JSON, but the standard library reads them
        '["\\ud800", "서울", "😀"]',  # a lone surrogate's escape
        "  [1, {}, [], null, true]  ",
    ],
)
def test_a_small_file_reads_as_the_standard_library_reads_it(tmp_path: Path, text: str) -> None:
    """Read with msgspec where it can (2.5-3x faster), with the standard library where it refuses."""
    path = tmp_path / "r.json"
    path.write_text(text, encoding="utf-8")
    expected = json.loads(text)
    assert json.dumps(json_file.parsed(path)) == json.dumps(expected)


def test_a_file_that_is_not_json_still_says_where(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(b'{"a": 1}\n{"b": 2}')
    with pytest.raises(json_file.BrokenJSON, match="line 2, column 1"):
        json_file.parsed(path)
