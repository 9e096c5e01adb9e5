"""Huge upstream replies without holding them: their big strings go to files as they are read.

A tool result of 100 MB arrives as one JSON-RPC line, often twice over (the text and a
`structuredContent` copy, both escaped). Parsed whole it costs several times its size in memory. An
upstream reader with a `Spiller` writes any line longer than its threshold to a spool file instead,
then reads the spool once (in a worker thread, with the C JSON scanner): the envelope is parsed as
usual, but each long string of a tool result's content (and of its `structuredContent`) is decoded
straight into a file of its own and replaced by a short marker (`MARK` + a registry key). A string
whose escaped bytes repeat an earlier long one in the same reply (a `structuredContent` copy of the
text) gets that one's marker without being decoded again; equal texts otherwise share a marker by
their SHA-256. A `structuredContent` made of many small values is copied to a file as raw JSON and
replaced by `{JSON_KEY: key}`.

Markers never leave the gateway: the plugins that understand them (`reads_spilled`, the offload
plugin) adopt the files; the pipeline restores the text for every other plugin, and the gateway
restores whatever is left before a reply goes out (`restore`), then removes the files (`release`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

import mcp_types as types

from gateway.services.files import sweep_entry, writer_gone, writer_tag
from gateway.services.tokens import ESTIMATOR, SAMPLE_SLICE, SAMPLE_SLICES, estimate_tokens

log = logging.getLogger(__name__)

MARK = "\x00gateway-spilled:"
JSON_KEY = "\x00gateway-spilled"
SPILL_ABOVE = 4 * 1024 * 1024  # lines longer than this are spooled; below, the usual in-memory path
KEEP = 64 * 1024  # strings up to this stay in memory; longer ones at a spillable path go to a file
VALUE_BUDGET = 20_000  # values in structuredContent parsed one by one; more, and it is copied as raw JSON
CHUNK = 1 << 20
REPEAT_PREFIX = 256  # bytes of a long string kept in memory to tell a copy of it at once
STALE_SECONDS = 900  # a spilled part nobody settled (its call was cancelled) is removed after this

_WS = re.compile(rb"[ \t\r\n]*")
_STR_BODY = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.S)  # unrolled: twice the speed of (a|b)*
_SCALAR = re.compile(rb"-?[0-9][0-9.eE+-]*|true|false|null")
_SKIP = re.compile(rb'(?:[^"\[\]{}]++|"(?:[^"\\]++|\\.)*+")*+', re.S)
_HIGH_HEX = (b"d8", b"d9", b"da", b"db")  # \uD800-\uDBFF: the first half of a surrogate pair


class _Bad(Exception):
    """The spool is not the JSON this reader expects: the caller falls back to the whole-line path."""


class _TooMany(Exception):
    """structuredContent has too many values to parse one by one: it is copied as raw JSON instead."""


@dataclass
class Spilled:
    """One spilled string (`kind` text: the decoded UTF-8) or JSON value (`kind` json: compact JSON)."""

    path: Path
    digest: str
    size: int
    chars: int
    kind: str
    head: str
    tail: str
    created: float = field(default_factory=time.monotonic)
    moved_to: Path | None = None
    _tokens: int | None = None

    @property
    def tokens(self) -> int:
        if self._tokens is None:  # by its digest: the same text spilled again (a file read again) is not counted again
            identity = ("spilled", self.kind, self.digest, self.size)
            self._tokens = ESTIMATOR.remembered(identity, lambda: estimate_file(self.current, self.size, self.chars))
        return self._tokens

    @property
    def current(self) -> Path:
        return self.moved_to if self.moved_to is not None and not self.path.exists() else self.path

    def looks_like_json(self) -> bool:
        head, tail = self.head.lstrip(), self.tail.rstrip()
        return bool(head) and ((head[0] == "{" and tail.endswith("}")) or (head[0] == "[" and tail.endswith("]")))

    def read_text(self) -> str:
        return self.current.read_text(encoding="utf-8", errors="surrogatepass")


def estimate_file(path: Path, size: int, chars: int) -> int:
    """Tokens of a spilled file's text, from evenly spaced slices (as the estimate does for long texts)."""
    with open(path, "rb") as fh:
        if size <= SAMPLE_SLICES * SAMPLE_SLICE:
            return estimate_tokens(fh.read().decode("utf-8", "replace"))
        step = size // SAMPLE_SLICES
        sample = []
        for i in range(SAMPLE_SLICES):
            fh.seek(i * step)
            sample.append(fh.read(SAMPLE_SLICE).decode("utf-8", "ignore"))
    per_char = sum(estimate_tokens(s) for s in sample) / max(1, sum(map(len, sample)))
    return int(per_char * chars * 1.05) + 1


# -- the registry of spilled parts ---------------------------------------------------------------

_lock = threading.Lock()
_entries: dict[str, Spilled] = {}


def _register(part: Spilled) -> str:
    """A new entry, under a random key (the marker's tail); parts nobody settled are removed."""
    key = secrets.token_hex(16)
    with _lock:
        _entries[key] = part
        now = time.monotonic()
        for old_key, old in list(_entries.items()):
            if now - old.created > STALE_SECONDS:
                _entries.pop(old_key)
                old.path.unlink(missing_ok=True)
    return key


def pending() -> bool:
    """Whether any spilled part is waiting to be settled (the cheap check before looking for markers)."""
    return bool(_entries)


def of(text: Any) -> Spilled | None:
    """The spilled part a marker string stands for."""
    if isinstance(text, str) and text.startswith(MARK) and len(text) < 100:
        return _entries.get(text[len(MARK) :])
    return None


def of_value(value: Any) -> Spilled | None:
    """The spilled part a raw-JSON placeholder (`{JSON_KEY: digest}`) stands for."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get(JSON_KEY), str):
        return _entries.get(value[JSON_KEY])
    return None


def keys_in(value: Any) -> Iterator[str]:
    """The registry keys of every marker anywhere in a JSON-like value."""
    if isinstance(value, str) and value.startswith(MARK) and len(value) < 100:
        yield value[len(MARK) :]
    elif isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(JSON_KEY), str):
            yield value[JSON_KEY]
            return
        for item in value.values():
            yield from keys_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys_in(item)


def parts_of(result: types.CallToolResult) -> list[Spilled]:
    if not _entries:
        return []
    keys = set(keys_in(result.model_dump(include={"content", "structured_content", "meta"})))
    return [part for key in keys if (part := _entries.get(key)) is not None]


def same_json(a: Spilled, b: Spilled) -> bool:
    """Whether two spilled files hold the same JSON (same values in the same order, any spacing),
    compared as two streams of parse events: bounded memory."""
    import ijson  # only for this rare case: a large structuredContent beside a large JSON text

    with open(a.current, "rb") as fa, open(b.current, "rb") as fb:
        try:
            return all(x == y for x, y in itertools.zip_longest(ijson.parse(fa), ijson.parse(fb)))
        except ijson.JSONError:
            return False


def restored(value: Any) -> Any:
    """A JSON-like value with every marker in it replaced by what it stands for."""
    if (part := of(value)) is not None:
        return part.read_text()
    if (part := of_value(value)) is not None:
        with open(part.current, "rb") as fh:
            return json.load(fh)
    if isinstance(value, dict):
        return {k: restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restored(v) for v in value]
    return value


def restore(result: types.CallToolResult) -> types.CallToolResult:
    """The result with every marker replaced by its text again (for whoever reads it whole)."""
    if not parts_of(result):
        return result
    data = result.model_dump(by_alias=True, exclude_unset=True)
    return types.CallToolResult.model_validate(restored(data))


def release(result: types.CallToolResult) -> None:
    """Remove the files of the spilled parts a settled result referenced."""
    if _entries:
        discard(result.model_dump(include={"content", "structured_content", "meta"}))


def discard(value: Any) -> None:
    """Remove the files of the spilled parts anywhere in a JSON-like value (a reply nobody will read)."""
    _drop(set(keys_in(value)))


def _drop(keys: set[str]) -> None:
    for key in keys:
        with _lock:
            part = _entries.pop(key, None)
        if part is not None:
            part.path.unlink(missing_ok=True)


def _kept_by_a_tool_result(value: Any) -> set[str]:
    """The keys of the markers a tool result keeps once validated: the text of text blocks and of
    embedded text resources, and an object's structuredContent. Nothing, when the reply is not a tool
    result (no content list)."""
    result = value.get("result") if isinstance(value, dict) else None
    content = result.get("content") if isinstance(result, dict) else None
    if not isinstance(content, list):
        return set()
    kept: set[str] = set()
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            kept.update(keys_in(block.get("text")))
        elif isinstance(block, dict) and block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            kept.update(keys_in(block["resource"].get("text")))
    if isinstance(result.get("structuredContent"), dict):
        kept.update(keys_in(result["structuredContent"]))
    return kept


def _release_unreachable(value: Any) -> None:
    """Release at once the parts that validation will drop (a `text` on an image or resource-link block,
    content that is not a list, structuredContent that is not an object, a reply that is not a tool
    result): no marker of theirs can come back to be released with the call."""
    _drop(set(keys_in(value)) - _kept_by_a_tool_result(value))


def adopt(part: Spilled, target: Path) -> int:
    """Move a spilled file to `target` (synced first, as every saved result is); a part adopted
    before is copied from where it went. Returns the size."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if part.path.exists():
        with open(part.path, "rb+") as fh:
            os.fsync(fh.fileno())
        try:
            os.replace(part.path, target)
        except OSError:  # another filesystem
            shutil.move(str(part.path), target)
        part.moved_to = target
    else:
        shutil.copyfile(part.current, target)
    return part.size


# -- writing spilled parts -----------------------------------------------------------------------


def _odd_backslashes_before(data: bytes, end: int, start: int = 0) -> bool:
    """Whether the run of backslashes ending just before `end` is odd (its last one starts an escape)."""
    run = 0
    while end - run > start and data[end - run - 1] == 0x5C:
        run += 1
    return run % 2 == 1


def _safe_cut(data: bytes, start: int = 0, stop: int | None = None) -> int:
    """Where `data[start:stop]` (a string body read so far) can be cut without splitting an escape, a
    surrogate pair or a UTF-8 character: an index into `data`. Only the last few bytes are looked at."""
    cut = len(data) if stop is None else stop
    if _odd_backslashes_before(data, cut, start):  # a lone backslash at the end
        cut -= 1
    while True:  # a \u escape cut short, or a high surrogate whose low half may come next
        k = data.rfind(b"\\u", max(start, cut - 11), cut)
        while k >= 0 and _odd_backslashes_before(data, k, start):  # an escaped backslash, then "u"
            k = data.rfind(b"\\u", max(start, cut - 11), k)
        if k < 0 or not (k + 6 > cut or (k + 6 == cut and data[k + 2 : k + 4].lower() in _HIGH_HEX)):
            break
        cut = k
    for back in range(1, min(4, cut - start) + 1):
        byte = data[cut - back]
        if byte < 0x80:
            break
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if back < need:
                cut -= back
            break
    return cut


_DECODER = json.JSONDecoder(strict=False)
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]+")  # bytes that were not UTF-8, kept by surrogateescape


def _scan(body: bytes) -> tuple[str, int | None]:
    """Decode a piece of a string body (cut by `_safe_cut`) with the C JSON scanner, which also finds
    the closing quote: the text, and the number of bytes up to and including that quote (None while
    the string goes on). Bytes that are not UTF-8 become U+FFFD, as the whole-line path decodes them."""
    try:
        raw, bad = body.decode("utf-8"), False
    except UnicodeDecodeError:
        raw, bad = body.decode("utf-8", "surrogateescape"), True
    try:
        text, end = _DECODER.raw_decode('"' + raw + '"')
    except ValueError as exc:
        raise _Bad(f"a string with a broken escape ({exc})") from None
    if bad:  # each run of bytes that are not UTF-8 as `bytes.decode(..., "replace")` reads it (the
        # whole-line path): a cut-short sequence is one U+FFFD, a stray byte one each
        text = _ESCAPED_BYTE.sub(lambda m: bytes(ord(c) - 0xDC00 for c in m.group()).decode("utf-8", "replace"), text)
    if end == len(raw) + 2:
        return text, None
    return text, len(raw[: end - 1].encode("utf-8", "surrogateescape"))


class _TextWriter:
    """A long string's text, written to its file piece by piece with its size, digest and ends."""

    def __init__(self, path: Path):
        self.path = path
        self.fh: IO[bytes] = open(path, "wb")  # noqa: SIM115 - closed in finish/abort
        self.size = self.chars = 0
        self.hash = hashlib.sha256()
        self.head = ""
        self.tail = ""

    def write(self, text: str) -> None:
        if not text:
            return
        out = text.encode("utf-8", "surrogatepass")  # a lone surrogate escape (\ud800) kept as it came
        self.fh.write(out)
        self.hash.update(out)
        self.size += len(out)
        self.chars += len(text)
        if len(self.head) < 64:
            self.head += text[: 64 - len(self.head)]
        self.tail = (self.tail + text[-64:])[-64:]

    def finish(self) -> Spilled:
        self.fh.close()
        return Spilled(self.path, self.hash.hexdigest(), self.size, self.chars, "text", self.head, self.tail)

    def abort(self) -> None:
        self.fh.close()
        self.path.unlink(missing_ok=True)


# -- spooling a line as it arrives -----------------------------------------------------------------


def spool_open(spiller: Spiller, pending: list[bytes]) -> BinaryIO | None:
    """A spool file holding the line so far (and `pending` emptied); None (the line stays in memory)
    when the disk refuses."""
    try:
        spool = open(spiller.new_path(".line"), "wb", buffering=0)  # noqa: SIM115 - closed in _read_spool
    except OSError as exc:
        log.warning("cannot spool a long line to disk (%s); it is read in memory", exc)
        return None
    data = b"".join(pending)
    pending.clear()
    return spool_write(spool, data, pending)


def spool_write(spool: BinaryIO, data: bytes, pending: list[bytes]) -> BinaryIO | None:
    """Append to the spool; when the disk refuses (full, a file size limit), the line so far moves back
    into `pending` and None is returned: the line is finished in memory, as without a spiller."""
    view = memoryview(data)
    try:
        while view:
            written = spool.write(view)
            view = view[written or 0 :]
            if not written:
                raise OSError("no progress writing the spool")
    except OSError as exc:
        log.warning("spooling a long line failed (%s); it is read in memory", exc)
        path = Path(spool.name)
        spool.close()
        pending.append(path.read_bytes())
        pending.append(bytes(view))
        path.unlink(missing_ok=True)
        return None
    return spool


class LineBuffer:
    """One line (or body) as it arrives: in memory while short, spooled to disk once it grows past the
    spiller's threshold (kept in memory when the disk refuses, or without a spiller)."""

    def __init__(self, spiller: Spiller | None):
        self.spiller = spiller
        self.pending: list[bytes] = []
        self.size = 0
        self.spool: BinaryIO | None = None
        self.refused = False

    def add(self, data: bytes) -> None:
        if self.spool is not None:
            self.spool = spool_write(self.spool, data, self.pending)
            self.refused = self.spool is None
            return
        self.pending.append(data)
        self.size += len(data)
        if self.spiller is not None and self.size > self.spiller.threshold and not self.refused:
            self.spool = spool_open(self.spiller, self.pending)
            self.refused = self.spool is None  # the disk refused: this line stays in memory

    def take(self) -> bytes | BinaryIO:
        """The finished line: its bytes, or its spool file (to read back); the buffer starts anew."""
        out: bytes | BinaryIO = self.spool if self.spool is not None else b"".join(self.pending)
        self.pending, self.size, self.spool, self.refused = [], 0, None, False
        return out

    def discard(self) -> None:
        """Drop an unfinished line (the stream ended mid-line), its spool file too."""
        if self.spool is not None:
            self.spool.close()
            Path(self.spool.name).unlink(missing_ok=True)
        self.pending, self.size, self.spool, self.refused = [], 0, None, False


# -- reading a spooled line ---------------------------------------------------------------------------


class _Source:
    """A buffered byte reader over the spool with the few moves a JSON reader needs."""

    def __init__(self, fh: IO[bytes]):
        self.fh = fh
        self.buf = b""
        self.pos = 0
        self.base = 0

    def more(self) -> bool:
        data = self.fh.read(CHUNK)
        if not data:
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        return True

    def peek(self) -> int:
        """The next byte after whitespace, -1 at the end."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return -1

    def expect(self, byte: bytes) -> None:
        if self.peek() != byte[0]:
            raise _Bad(f"expected {byte!r} at byte {self.tell()}")
        self.pos += 1

    def tell(self) -> int:
        return self.base + self.pos

    def seek(self, offset: int) -> None:
        self.fh.seek(offset)
        self.buf, self.pos, self.base = b"", 0, offset


def _spillable(path: tuple[Any, ...]) -> bool:
    """Strings a tool result's size is made of: content texts and anything in structuredContent."""
    if len(path) < 2 or path[0] != "result":
        return False
    if path[1] == "structuredContent":
        return True
    return path[1] == "content" and (path[3:] == ("text",) or path[3:] == ("resource", "text"))


class Spiller:
    """Spools long upstream lines to `folder` and reads them back with long strings kept on disk."""

    def __init__(self, folder: Path, threshold: int = SPILL_ABOVE):
        self.folder = folder
        self.threshold = threshold
        self._count = 0
        self.spooled = 0  # long lines read back from a spool (status figures, tests)

    def remove_stale(self) -> int:
        """Remove what gateways no longer running left here (files are named after their process)."""
        if not self.folder.is_dir():
            return 0
        removed = 0
        for item in list(self.folder.iterdir()):
            if writer_gone(item.name.split("-", 1)[0], item):
                removed += sweep_entry(item)
        return removed

    def new_path(self, suffix: str) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        with _lock:
            self._count += 1
            return self.folder / f"{writer_tag()}-{self._count}{suffix}"

    def read(self, spool: Path, skip: int = 0) -> Any:
        """The JSON value of a spooled line (after its first `skip` bytes: an SSE `data: ` prefix), long
        strings replaced by markers. Raises ValueError (with nothing left behind) when the line is not
        JSON; anything unusual falls back to a plain load."""
        made: list[Path] = []
        self.spooled += 1
        try:
            with open(spool, "rb") as fh:
                src = _Source(fh)
                src.seek(skip)  # offsets stay those of the file
                value = _Reader(self, src, made, spool).value(())
                if src.peek() != -1:
                    raise _Bad("data after the JSON value")
                _release_unreachable(value)
                return value
        except (_Bad, RecursionError, ValueError, OSError) as exc:  # OSError: a full disk, a file size limit
            for path in made:
                path.unlink(missing_ok=True)
            gone = set(made)
            with _lock:  # their registry entries too: pending() must not stay true for nothing
                for key in [k for k, part in _entries.items() if part.path in gone]:
                    del _entries[key]
            log.debug("spooled line read whole (%s)", exc)
            with open(spool, "rb") as fh:
                fh.seek(skip)
                try:
                    return json.loads(fh.read().decode("utf-8", "replace"))
                except RecursionError:
                    raise ValueError("the line is nested too deeply to read (over 1,000 levels)") from None


class _Reader:
    def __init__(self, spiller: Spiller, src: _Source, made: list[Path], spool: Path):
        self.spiller = spiller
        self.src = src
        self.made = made
        self.spool = spool
        self.budget: int | None = None
        self.seen: dict[str, str] = {}  # digest -> marker: a text repeated in one reply is one part
        # (start, end, marker, first bytes) of each long string in the spool
        self.spans: list[tuple[int, int, str, bytes]] = []

    def _repeat(self) -> str | None:
        """The marker of an earlier long string whose escaped bytes this string repeats exactly (a
        structuredContent copy of the text): compared in the spool, never decoded a second time."""
        here = self.src.tell()
        ahead = self._ahead(REPEAT_PREFIX)
        # first the first bytes, in memory: a string that does not start like a long one is no copy of it
        # (19,000 small structured values used to open the spool twice each, per long text)
        candidates = [(start, end, marker) for start, end, marker, head in self.spans if ahead.startswith(head)]
        if not candidates:
            return None
        with open(self.spool, "rb") as earlier, open(self.spool, "rb") as this:
            for start, end, marker in candidates:
                earlier.seek(start)
                this.seek(here)
                left = end - start
                while left > 0:
                    block = earlier.read(min(CHUNK, left))
                    if not block or this.read(len(block)) != block:
                        break
                    left -= len(block)
                else:
                    if this.read(1) == b'"':
                        self.src.seek(here + (end - start) + 1)
                        return marker
        return None

    def _ahead(self, count: int) -> bytes:
        """Up to `count` bytes from the current position, without moving it."""
        src = self.src
        while len(src.buf) - src.pos < count and src.more():
            pass
        return src.buf[src.pos : src.pos + count]

    def _marker(self, part: Spilled, json_value: bool = False) -> Any:
        key = self.seen.get(part.digest)
        if key is None:
            key = self.seen[part.digest] = _register(part)
        else:
            part.path.unlink(missing_ok=True)
        return {JSON_KEY: key} if json_value else MARK + key

    def _count(self) -> None:
        if self.budget is not None:
            self.budget -= 1
            if self.budget < 0:
                raise _TooMany

    def value(self, path: tuple[Any, ...]) -> Any:
        src = self.src
        byte = src.peek()
        self._count()
        if byte == 0x22:
            return self.string(path)
        if byte == 0x7B:
            if path == ("result", "structuredContent"):
                return self.structured(path)
            return self.object(path)
        if byte == 0x5B:
            return self.array(path)
        if byte < 0:
            raise _Bad("unexpected end")
        while len(src.buf) - src.pos < 512 and src.more():
            pass
        match = _SCALAR.match(src.buf, src.pos)
        if match is None:
            raise _Bad(f"unexpected byte at {src.tell()}")
        src.pos = match.end()
        return json.loads(match.group())

    def object(self, path: tuple[Any, ...]) -> dict[str, Any]:
        src = self.src
        src.expect(b"{")
        out: dict[str, Any] = {}
        if src.peek() == 0x7D:
            src.pos += 1
            return out
        while True:
            if src.peek() != 0x22:
                raise _Bad("expected a key")
            key = self.string(())
            src.expect(b":")
            out[key] = self.value((*path, key))
            byte = src.peek()
            src.pos += 1
            if byte == 0x7D:
                return out
            if byte != 0x2C:
                raise _Bad("expected , or }")

    def array(self, path: tuple[Any, ...]) -> list[Any]:
        src = self.src
        src.expect(b"[")
        out: list[Any] = []
        if src.peek() == 0x5D:
            src.pos += 1
            return out
        while True:
            out.append(self.value((*path, len(out))))
            byte = src.peek()
            src.pos += 1
            if byte == 0x5D:
                return out
            if byte != 0x2C:
                raise _Bad("expected , or ]")

    def structured(self, path: tuple[Any, ...]) -> Any:
        """structuredContent: parsed when it has few values (its long strings spilled), else copied raw."""
        start, made = self.src.tell(), len(self.made)
        self.budget = VALUE_BUDGET
        try:
            return self.object(path)
        except _TooMany:
            for p in self.made[made:]:
                p.unlink(missing_ok=True)
            del self.made[made:]
            self.src.seek(start)
            return self._marker(self.raw_copy(), json_value=True)
        finally:
            self.budget = None

    def string(self, path: tuple[Any, ...]) -> str:
        src = self.src
        src.pos += 1  # the opening quote
        if self.spans and _spillable(path) and (marker := self._repeat()) is not None:
            return marker
        start = src.tell()
        texts: list[str] = []
        kept = 0
        writer: _TextWriter | None = None
        spillable = _spillable(path)
        window = 256  # most strings are short: decode a little first, then larger pieces
        try:
            while True:
                stop = _safe_cut(src.buf, src.pos, min(len(src.buf), src.pos + window))
                if stop <= src.pos:  # nothing whole to decode yet: a wider window, or more data
                    if src.pos + window < len(src.buf):
                        window *= 16
                    elif not src.more():
                        raise _Bad("unterminated string")
                    continue
                text, end = _scan(src.buf[src.pos : stop])
                src.pos = stop if end is None else src.pos + end
                window = min(window * 16, 1 << 20)
                if writer is not None:
                    writer.write(text)
                else:
                    texts.append(text)
                    kept += len(text)
                    if spillable and kept > KEEP:
                        target = self.spiller.new_path(".txt")
                        self.made.append(target)
                        writer = _TextWriter(target)
                        for kept_text in texts:
                            writer.write(kept_text)
                        texts.clear()
                if end is not None:
                    break
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        if writer is None:
            return "".join(texts)
        marker = self._marker(writer.finish())
        end = src.tell() - 1
        with open(self.spool, "rb") as fh:  # its first bytes, to tell copies from other strings in memory
            fh.seek(start)
            head = fh.read(min(REPEAT_PREFIX, end - start))
        self.spans.append((start, end, marker, head))
        return marker

    def raw_copy(self) -> Spilled:
        """Copy one JSON container as it is (compact or not) to a file; strings skipped in C."""
        src = self.src
        target = self.spiller.new_path(".json")
        self.made.append(target)
        digest = hashlib.sha256()
        size = depth = 0
        head = b""
        tail = b""
        with open(target, "wb") as out:

            def write(data: bytes) -> None:
                nonlocal size, head, tail
                out.write(data)
                digest.update(data)
                size += len(data)
                if len(head) < 64:
                    head += data[: 64 - len(head)]
                tail = (tail + data[-64:])[-64:]

            src.peek()
            while True:
                end = _SKIP.match(src.buf, src.pos).end()  # type: ignore[union-attr]
                write(src.buf[src.pos : end])
                src.pos = end
                if end == len(src.buf):
                    if not src.more():
                        raise _Bad("unexpected end in structuredContent")
                    continue
                byte = src.buf[end]
                if byte == 0x22:  # a string running past the buffer: copy it piece by piece
                    src.pos += 1
                    write(b'"')
                    while True:
                        stop = _STR_BODY.match(src.buf, src.pos).end()  # type: ignore[union-attr]
                        closed = stop < len(src.buf) and src.buf[stop] == 0x22
                        write(src.buf[src.pos : stop + (1 if closed else 0)])
                        src.pos = stop + 1 if closed else stop
                        if closed:
                            break
                        if not src.more():
                            raise _Bad("unterminated string")
                    continue
                write(bytes([byte]))
                src.pos += 1
                depth += 1 if byte in (0x7B, 0x5B) else -1
                if depth == 0:
                    break
        text_head, text_tail = head.decode("utf-8", "ignore"), tail.decode("utf-8", "ignore")
        return Spilled(target, digest.hexdigest(), size, size, "json", text_head, text_tail)
