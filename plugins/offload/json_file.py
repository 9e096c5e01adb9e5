"""Reading an offloaded JSON file: small files parsed once per content and cached, large ones streamed with
ijson (C backend) in bounded memory."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ijson
import msgspec

from gateway.services.files import known_digest

SMALL_FILE = 4 * 1024 * 1024  # parsed whole and cached; larger files are streamed
# the files kept parsed, in all: a parsed value takes 4-7x its file's bytes in Python objects (2.6 MB of an
# API model: ~11 MB; 1.1 MB of small records: ~8 MB), and every full pass of the garbage collector walks them
CACHE_BYTES = 16 * 1024 * 1024


class BrokenJSON(Exception):
    pass


_DECODER = msgspec.json.Decoder()  # a small file whole: 2.5-3x the standard library's speed


# (folder, file digest) -> (its size, its parsed value), LRU: a caller's results share a value, never two
# callers' (how fast a document parses would tell one caller what another fetched)
_VALUES: OrderedDict[tuple[str, str], tuple[int, Any]] = OrderedDict()
_VALUES_LOCK = threading.Lock()


def parsed(path: Path) -> Any:
    """The whole value of a small file, parsed once per content and folder: a result read again (another
    file of the caller's with the same bytes) shares the value already parsed, rather than holding
    another copy of it."""
    folder = str(path.parent)
    if (digest := known_digest(path)) is not None and (found := _parsed_as((folder, digest))) is not None:
        return found[0]
    data = path.read_bytes()
    if digest is None:  # a file the responses store did not write (or wrote before a restart)
        digest = hashlib.sha256(data).hexdigest()
        if (found := _parsed_as((folder, digest))) is not None:
            return found[0]
    try:  # the API model 6 ms against 16
        value = _DECODER.decode(data)
    except msgspec.MsgspecError:  # NaN, 1e400, a lone surrogate, bad UTF-8 or not JSON: read as before
        try:
            value = json.loads(data.decode("utf-8"))
        except json.JSONDecodeError as exc:
            raise BrokenJSON(f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    with _VALUES_LOCK:
        _VALUES[(folder, digest)] = (len(data), value)
        while len(_VALUES) > 1 and sum(size for size, _ in _VALUES.values()) > CACHE_BYTES:
            _VALUES.popitem(last=False)
    return value


def _parsed_as(key: tuple[str, str]) -> tuple[Any] | None:
    with _VALUES_LOCK:
        if key not in _VALUES:
            return None
        _VALUES.move_to_end(key)
        return (_VALUES[key][1],)


def is_small(path: Path) -> bool:
    return path.stat().st_size <= SMALL_FILE


@contextmanager
def valid_json() -> Iterator[None]:
    try:
        yield
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc})") from None


def events(path: Path, prefixes: bool = True) -> Any:
    """ijson parse events of the whole file, streamed: (prefix, event, value), or (event, value) without
    `prefixes` (cheaper to make)."""
    fh = open(path, "rb")  # noqa: SIM115 - closed by the generator's finally
    try:
        yield from (ijson.parse if prefixes else ijson.basic_parse)(fh, use_float=True)
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc}); try response_search or a line range instead") from None
    finally:
        fh.close()


def items(path: Path, prefix: str) -> Any:
    """The values at an ijson prefix (`data.item`), one at a time."""
    with open(path, "rb") as fh, valid_json():
        yield from ijson.items(fh, prefix, use_float=True)


def children(path: Path, steps: list[Any], array: bool, by_prefix: bool) -> Iterator[tuple[Any, Any]]:
    """(key or index, value) of each child of the array (or object) at `steps`, one at a time. Unless
    ijson's dotted prefix names it exactly (`by_prefix`: no empty or dotted key on the way), the path is
    followed event by event instead."""
    if is_small(path):
        value = parsed(path)
        for step in steps:
            value = value[step]
        yield from (value.items() if isinstance(value, dict) else enumerate(value))
        return
    if by_prefix:
        prefix = ".".join(steps)
        with open(path, "rb") as fh, valid_json():
            if array:
                yield from enumerate(ijson.items(fh, f"{prefix}.item" if prefix else "item", use_float=True))
            else:
                yield from ijson.kvitems(fh, prefix, use_float=True)
        return
    yield from _children_by_events(path, steps)


def _children_by_events(path: Path, steps: list[Any]) -> Iterator[tuple[Any, Any]]:
    where: list[Any] = []  # the steps of the open containers' current children
    kinds: list[bool] = []  # is each open container an array
    depth = len(steps)
    builder: ijson.ObjectBuilder | None = None
    level = 0
    for _prefix, event, value in events(path):
        if builder is not None:
            builder.event(event, value)
            level += event in ("start_map", "start_array")
            level -= event in ("end_map", "end_array")
            if level == 0:
                yield where[-1], builder.value
                builder = None
            continue
        if event == "map_key":
            where[-1] = value
            continue
        if event in ("end_map", "end_array"):
            where.pop()
            kinds.pop()
            continue
        if kinds and kinds[-1]:
            where[-1] += 1
        if len(where) == depth + 1 and where[:depth] == steps:
            if event in ("start_map", "start_array"):
                builder, level = ijson.ObjectBuilder(), 1
                builder.event(event, value)
            else:
                yield where[-1], value
            continue
        if event in ("start_map", "start_array"):
            kinds.append(event == "start_array")
            where.append(-1 if event == "start_array" else None)
