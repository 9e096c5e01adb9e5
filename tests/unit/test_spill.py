"""Spooled long lines: every long string of a tool result comes back byte-identical from its file,
whatever the escapes and wherever the reads split them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import mcp_types as types
import pytest

from gateway.services import spill
from gateway.services.spill import Spiller

PIECES = [
    "plain ascii ",
    '"quoted"',
    "back\\slash",
    "tab\tnew\nline",
    "한국어 텍스트 ",
    "😀 emoji ",
    "\u2028",
    "é",
    "{}[],:",
]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(n))


@pytest.fixture(autouse=True)
def empty_registry() -> object:
    """Parts a test registers are not left for the next one (the registry is process-wide)."""
    yield
    spill._entries.clear()


@pytest.fixture
def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill, "KEEP", 16)


def _read(tmp_path: Path, message: dict, ensure_ascii: bool, chunk: int, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(spill, "CHUNK", chunk)
    line = tmp_path / "line"
    line.write_text(json.dumps(message, ensure_ascii=ensure_ascii), encoding="utf-8")
    return Spiller(tmp_path / "spill").read(line)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64, 1 << 20])
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_long_texts_come_back_identical(
    tmp_path: Path, small_reads: None, monkeypatch: pytest.MonkeyPatch, chunk: int, ensure_ascii: bool
) -> None:
    rng = random.Random(chunk)
    text = _text(rng, 200)
    message = {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"content": [{"type": "text", "text": text}, {"type": "text", "text": "short"}], "isError": False},
    }
    value = _read(tmp_path, message, ensure_ascii, chunk, monkeypatch)
    marker = value["result"]["content"][0]["text"]
    part = spill.of(marker)
    assert part is not None, "the long text is on disk, not in memory"
    assert part.path.read_bytes() == text.encode("utf-8")
    assert (part.size, part.chars) == (len(text.encode("utf-8")), len(text))
    assert value["result"]["content"][1]["text"] == "short"
    assert spill.restored(value) == message


def test_a_structured_copy_of_the_text_is_the_same_part(tmp_path: Path, small_reads: None) -> None:
    text = _text(random.Random(1), 100)
    message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}
    message["result"]["structuredContent"] = {"content": text}
    line = tmp_path / "line"
    line.write_text(json.dumps(message))
    value = Spiller(tmp_path / "spill").read(line)
    assert value["result"]["structuredContent"]["content"] == value["result"]["content"][0]["text"]
    assert len(list((tmp_path / "spill").iterdir())) == 1, "the copy's file is dropped"
    result = types.CallToolResult.model_validate(value["result"])
    restored = spill.restore(result)
    assert restored.structured_content == {"content": text}
    spill.release(result)
    assert not list((tmp_path / "spill").iterdir())


def test_a_structured_content_of_many_values_is_copied_raw(
    tmp_path: Path, small_reads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spill, "VALUE_BUDGET", 50)
    records = [{"id": i, "name": f"고객 {i}", "tags": ["a", "b]"], "ok": i % 2 == 0, "x": 1.5} for i in range(100)]
    message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [], "structuredContent": {"rows": records}}}
    value = _read(tmp_path, message, False, 13, monkeypatch)
    part = spill.of_value(value["result"]["structuredContent"])
    assert part is not None and part.kind == "json"
    assert json.loads(part.path.read_text()) == {"rows": records}
    assert spill.restored(value) == message


def test_long_strings_elsewhere_stay_in_memory(tmp_path: Path, small_reads: None) -> None:
    message = {"jsonrpc": "2.0", "id": 2, "result": {"contents": [{"uri": "a://b", "text": "x" * 1000}]}}
    line = tmp_path / "line"
    line.write_text(json.dumps(message))
    assert Spiller(tmp_path / "spill").read(line) == message


@pytest.mark.parametrize(
    "broken", ['{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"text": "abc', "[1, 2", "nope"]
)
def test_a_broken_line_raises_and_leaves_nothing(tmp_path: Path, small_reads: None, broken: str) -> None:
    line = tmp_path / "line"
    line.write_text(broken + "x" * 100)
    with pytest.raises(ValueError):
        Spiller(tmp_path / "spill").read(line)
    assert not (tmp_path / "spill").exists() or not list((tmp_path / "spill").iterdir())


def test_split_escapes_and_characters(small_reads: None) -> None:
    """The cut never splits an escape, a surrogate pair or a UTF-8 character."""
    for body, whole in [
        (b"abc\\", 3),
        (b"abc\\u00", 3),
        (b"abc\\ud83d", 3),
        (b"abc\\ud83d\\ude00", 15),
        (b"abc\\ud83dx", 10),
        ("ab한".encode()[:-1], 2),
        ("ab😀".encode()[:-2], 2),
        (b"a\\\\", 3),
    ]:
        assert spill._safe_cut(body) == whole, body


def test_stale_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "spill"
    folder.mkdir()
    (folder / "999999999-1.txt").write_text("left by a dead gateway")
    mine = Spiller(folder).new_path(".txt")
    mine.write_text("in use")
    assert Spiller(folder).remove_stale() == 1
    assert mine.exists()


async def _pump(lines: list[bytes], spiller: Spiller, chunk: int) -> list[object]:
    import anyio

    from gateway.proxy.stdio_lines import pump_lines

    data = b"".join(lines)
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    send, receive = anyio.create_memory_object_stream(100)

    async def source() -> bytes:
        if not pieces:
            raise anyio.EndOfStream
        return pieces.pop(0)

    await pump_lines(source, send, spiller=spiller)
    return [m.message.model_dump(by_alias=True, exclude_unset=True) for m in receive._state.buffer]  # type: ignore[attr-defined]


def _reply(msg_id: int, text: str) -> bytes:
    body = {"jsonrpc": "2.0", "id": msg_id, "result": {"content": [{"type": "text", "text": text}]}}
    return json.dumps(body, ensure_ascii=False).encode() + b"\n"


@pytest.mark.anyio
@pytest.mark.parametrize("writable", [True, False])
async def test_the_pump_spools_long_lines_or_keeps_them_in_memory(
    tmp_path: Path, small_reads: None, writable: bool
) -> None:
    """Long lines are spooled (or, when the disk refuses, read in memory as before); short ones are not."""
    folder = tmp_path / "spill"
    if not writable:
        folder.write_text("a file where the folder should be")
    long_text = '한국어 and "quotes" ' * 200
    messages = await _pump([_reply(1, "short"), _reply(2, long_text), _reply(3, "after")], Spiller(folder, 1000), 333)
    assert [m["id"] for m in messages] == [1, 2, 3]
    marker = messages[1]["result"]["content"][0]["text"]
    if writable:
        assert spill.of(marker) is not None and spill.of(marker).read_text() == long_text
        assert [p.suffix for p in folder.iterdir()] == [".txt"], "the spool is gone, the text file stays"
    else:
        assert marker == long_text


def test_a_read_that_falls_back_leaves_no_registry_entries(tmp_path: Path, small_reads: None) -> None:
    """A long text spilled, then a part the reader cannot follow (nesting deeper than its recursion, which
    the plain parser still reads): the whole-line fallback removes the files and their entries, so
    `pending()` does not stay true (every later call would take the slow path) until the sweep."""
    deep: object = "end"
    for _ in range(600):
        deep = {"a": deep}
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": "x" * 1000}], "structuredContent": {"deep": deep}},
    }
    line = tmp_path / "line"
    line.write_text(json.dumps(message))
    assert Spiller(tmp_path / "spill").read(line) == message
    assert not spill.pending()


@pytest.mark.parametrize("bad", [b"\xe2\x82", b"\xed\xa0\x80", b"\xff", b"\xc3", b"\xf0\x9f\x98"])
def test_bytes_that_are_not_utf8_read_as_the_whole_line_path_reads_them(
    tmp_path: Path, small_reads: None, bad: bytes
) -> None:
    head = b'{"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "'
    line = head + b"x" * 500 + bad + b"y" * 500 + b'"}]}}'
    (tmp_path / "line").write_bytes(line)
    spilled = spill.restored(Spiller(tmp_path / "spill").read(tmp_path / "line"))
    assert spilled == json.loads(line.decode("utf-8", "replace"))


def test_many_structured_values_beside_a_long_text_read_the_spool_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """19,000 short values in structuredContent beside one long text: each is told from the text by its
    first bytes in memory, not by opening the spool twice (which made a 5 MB reply take 1.6 s, and
    40 MB with 40 texts over a minute, while the upstream's pings went unanswered)."""
    text = "x" * (200 * 1024)
    structured = {"values": [f"value {i}" for i in range(19000)], "copy": text}
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": text}], "structuredContent": structured},
    }
    line = tmp_path / "line"
    line.write_text(json.dumps(message))
    opened: list[str] = []
    real_open = open

    def counting_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(spill, "open", counting_open, raising=False)
    value = Spiller(tmp_path / "spill").read(line)
    assert spill.restored(value) == message
    assert sum(name == str(line) for name in opened) < 10
    content_marker = value["result"]["content"][0]["text"]
    assert value["result"]["structuredContent"]["copy"] == content_marker  # the copy is the same part


@pytest.mark.parametrize(
    "result",
    [
        {"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png", "text": "T"}]},
        {"content": [{"type": "resource_link", "uri": "a://b", "name": "b", "text": "T"}]},
        {"content": [{"text": "T"}]},
        {"content": {"type": "text", "text": "T"}},
        {"content": [], "structuredContent": ["T"]},
        {"content": [], "structuredContent": "T"},
        {"contents": [{"uri": "a://b", "text": "T"}], "content": "T"},
        {"messages": [{"role": "user", "content": {"type": "text", "text": "T"}}], "structuredContent": {"x": "T"}},
    ],
)
def test_parts_that_validation_drops_are_released_at_once(tmp_path: Path, small_reads: None, result: dict) -> None:
    """Long strings where no tool result keeps them (validation drops them, or the reply is not a tool
    result): their files and entries go as the reply is read, not 15 minutes later."""
    text = "z" * 1000
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).replace('"T"', json.dumps(text))
    (tmp_path / "line").write_text(body)
    Spiller(tmp_path / "spill").read(tmp_path / "line")
    assert not spill.pending()
    assert not list((tmp_path / "spill").glob("*.txt")) and not list((tmp_path / "spill").glob("*.json"))


def test_parts_a_tool_result_keeps_stay_until_released(tmp_path: Path, small_reads: None) -> None:
    text = "z" * 1000
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": text}], "structuredContent": {"copy": text}},
    }
    (tmp_path / "line").write_text(json.dumps(message))
    value = Spiller(tmp_path / "spill").read(tmp_path / "line")
    assert spill.pending() and spill.restored(value) == message


def test_a_text_spilled_again_is_not_counted_again(
    tmp_path: Path, small_reads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file read again spills the same text again: its tokens come from the first count (tens of ms
    for a few MB with the real tokenizers), found by its digest; another text is counted."""
    counted: list[Path] = []
    real = spill.estimate_file
    monkeypatch.setattr(spill, "estimate_file", lambda path, *args: counted.append(path) or real(path, *args))

    def tokens(text: str, folder: str) -> int:
        message = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": text}]}}
        line = tmp_path / f"{folder}.line"
        line.write_text(json.dumps(message), encoding="utf-8")
        part = spill.of(Spiller(tmp_path / folder).read(line)["result"]["content"][0]["text"])
        assert part is not None
        return part.tokens

    text = _text(random.Random(3), 300)
    first = tokens(text, "one")
    assert tokens(text, "two") == first and len(counted) == 1
    assert tokens(text[::-1], "three") > 0 and len(counted) == 2
