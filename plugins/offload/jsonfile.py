"""Exploring a JSON file in bounded memory: outline, values at a path, search, compression.

Large files are streamed with ijson (C backend); small ones are parsed once and kept in a
small LRU. Every answer is cut to a token budget by the caller (see `bounded`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from plugins.offload.paths import (
    PathError,
    Step,
    compiled_jsonpath,
    format_path,
    ijson_prefix,
    parse_path,
    step_into,
    type_name,
)
from plugins.offload.store import file_version

log = logging.getLogger("plugins.offload")
SMALL_FILE = 4 * 1024 * 1024  # parsed whole and cached; larger files are streamed
CACHE_BYTES = 64 * 1024 * 1024  # total size of files kept parsed
OUTLINE_DEPTH = 3
MAX_KEYS = 40
SAMPLE_ITEMS = 3
SAMPLE_STRING = 80
_EVENT_TYPES = {
    "start_map": "object",
    "start_array": "array",
    "string": "string",
    "number": "number",
    "integer": "number",
    "double": "number",
    "boolean": "boolean",
    "null": "null",
}
_END = ("end_map", "end_array")


class BrokenJSON(Exception):
    pass


class _ParsedCache:
    """A few small parsed files, bounded by their total file size."""

    def __init__(self) -> None:
        self._items: OrderedDict[tuple[str, int, int], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> Any:
        key = file_version(path)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        with open(path, encoding="utf-8") as fh:
            try:
                value = json.load(fh)
            except json.JSONDecodeError as exc:
                raise BrokenJSON(
                    f"the file is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                ) from None
        with self._lock:
            self._items[key] = value
            while sum(k[1] for k in self._items) > CACHE_BYTES and len(self._items) > 1:
                self._items.popitem(last=False)
        return value


PARSED = _ParsedCache()
_OUTLINES: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
_OUTLINE_LOCK = threading.Lock()


def is_small(path: Path) -> bool:
    return path.stat().st_size <= SMALL_FILE


@contextmanager
def _valid_json() -> Iterator[None]:
    try:
        yield
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc})") from None


def _events(path: Path) -> Any:
    fh = open(path, "rb")  # noqa: SIM115 - closed by the generator's finally
    try:
        yield from ijson.parse(fh, use_float=True)
    except ijson.JSONError as exc:
        raise BrokenJSON(f"the file is not valid JSON ({exc}); try response_search or a line range instead") from None
    finally:
        fh.close()


# -- outline ----------------------------------------------------------------------------------


@dataclass
class _Node:
    type: str
    count: int = 0
    keys: list[str] = field(default_factory=list)
    value: Any = None


_PENDING: dict[tuple[str, int, int], threading.Event] = {}


def outline(path: Path) -> dict[str, Any]:
    """Type, keys, item counts and value types to depth 3, plus sample items. Cached per file version;
    a caller that arrives while another computes it waits for that result instead of parsing again."""
    key = file_version(path)
    while True:
        with _OUTLINE_LOCK:
            if key in _OUTLINES:
                return _OUTLINES[key]
            pending = _PENDING.get(key)
            if pending is None:
                _PENDING[key] = threading.Event()
                break
        pending.wait()
    try:
        result = _outline_small(path) if is_small(path) else _outline_stream(path)
        with _OUTLINE_LOCK:
            _OUTLINES[key] = result
            while len(_OUTLINES) > 32:
                _OUTLINES.popitem(last=False)
        return result
    finally:
        with _OUTLINE_LOCK:
            _PENDING.pop(key).set()


def warm_outline(path: Path) -> None:
    """Start the outline of a large file in the background, so response_outline finds it ready."""

    def run() -> None:
        try:
            outline(path)
        except Exception as exc:  # broken JSON: response_outline will say so when asked
            log.debug("background outline of %s failed: %s", path.name, exc)

    threading.Thread(target=run, name=f"outline:{path.name}", daemon=True).start()


def _outline_small(path: Path) -> dict[str, Any]:
    value = PARSED.get(path)
    nodes: dict[str, _Node] = {}

    def walk(v: Any, prefix: list[str]) -> None:
        node = _Node(type_name(v))
        nodes[".".join(prefix)] = node
        if isinstance(v, dict):
            node.keys = list(v)[:MAX_KEYS]
            if len(prefix) < OUTLINE_DEPTH:
                for k, child in v.items():
                    walk(child, [*prefix, k])
        elif isinstance(v, list):
            node.count = len(v)
        else:
            node.value = v

    walk(value, [])
    samples = {}
    for prefix, node in nodes.items():
        if node.type == "array" and node.count:
            array = value_at(path, prefix.split(".") if prefix else [])
            samples[prefix] = [preview(v) for v in array[:SAMPLE_ITEMS]]
    return _render_outline(nodes, samples, path)


def _outline_stream(path: Path) -> dict[str, Any]:
    nodes: dict[str, _Node] = {}
    deep: set[str] = set()  # prefixes below the outline depth or inside array items
    for prefix, event, value in _events(path):
        if event == "map_key":
            node = nodes.get(prefix)
            if node is not None and len(node.keys) < MAX_KEYS:
                node.keys.append(value)
            continue
        if event in _END:
            continue
        if prefix == "item" or prefix.endswith(".item"):
            parent = nodes.get(prefix[:-5] if prefix != "item" else "")
            if parent is not None:
                parent.count += 1
            continue
        if prefix in nodes or prefix in deep:
            continue
        parts = prefix.split(".") if prefix else []
        if len(parts) > OUTLINE_DEPTH or "item" in parts:
            deep.add(prefix)
            continue
        node = _Node(_EVENT_TYPES.get(event, event))
        if node.type not in ("object", "array"):
            node.value = value
        nodes[prefix] = node
    samples = {p: _first_items(path, p) for p, n in nodes.items() if n.type == "array" and n.count}
    return _render_outline(nodes, samples, path)


def _first_items(path: Path, prefix: str) -> list[Any]:
    item_prefix = f"{prefix}.item" if prefix else "item"
    with open(path, "rb") as fh:
        return [preview(v) for v in itertools.islice(ijson.items(fh, item_prefix, use_float=True), SAMPLE_ITEMS)]


def preview(value: Any, depth: int = 0) -> Any:
    """A depth-limited sample: long strings cut, arrays cut to 3 items, deep objects summarized."""
    if isinstance(value, str):
        return value if len(value) <= SAMPLE_STRING else value[:SAMPLE_STRING] + f"…(+{len(value) - SAMPLE_STRING})"
    if isinstance(value, list):
        head = [preview(v, depth + 1) for v in value[:SAMPLE_ITEMS]]
        return head + ([f"…(+{len(value) - SAMPLE_ITEMS} items)"] if len(value) > SAMPLE_ITEMS else [])
    if isinstance(value, dict):
        if depth >= 2:
            return {k: type_name(v) for k, v in itertools.islice(value.items(), MAX_KEYS)}
        return {k: preview(v, depth + 1) for k, v in itertools.islice(value.items(), MAX_KEYS)}
    return value


def _render_outline(nodes: dict[str, _Node], samples: dict[str, list[Any]], path: Path) -> dict[str, Any]:
    root = nodes.get("", _Node("unknown"))
    structure: dict[str, Any] = {}
    for prefix, node in nodes.items():
        entry: dict[str, Any] = {"type": node.type}
        if node.type == "array":
            entry["items"] = node.count
        elif node.type == "object":
            entry["keys"] = node.keys
        else:
            entry["value"] = preview(node.value)
        structure[format_path(prefix.split(".")) if prefix else "$"] = entry
    arrays = {format_path(p.split(".")) if p else "$": n.count for p, n in nodes.items() if n.type == "array"}
    out: dict[str, Any] = {"type": root.type, "size": path.stat().st_size}
    if root.type == "object":
        out["keys"] = root.keys
    out["itemCount"] = arrays
    out["structure"] = structure
    out["samples"] = {format_path(p.split(".")) if p else "$": s for p, s in samples.items()}
    return out


# -- values -----------------------------------------------------------------------------------


def value_at(path: Path, steps: list[Step]) -> Any:
    """The value at simple steps. Streams to the first array index instead of parsing everything."""
    if is_small(path):
        value, where = PARSED.get(path), []
        for step in steps:
            value = step_into(value, step, where)
            where.append(step)
        return value
    keys: list[str] = []
    for i, step in enumerate(steps):
        if isinstance(step, int):
            return _stream_index(path, keys, step, steps[i + 1 :])
        keys.append(step)
    return _stream_value(path, keys)


def _stream_index(path: Path, keys: list[str], index: int, rest: list[Step]) -> Any:
    where: list[Step] = list(keys)
    if index < 0:
        count = array_length(path, keys)
        if count is None:
            raise PathError(f"{format_path(where)} is not an array in this file")
        if index < -count:
            raise PathError(f"index {index} is out of range at {format_path(where)}: the array has {count} items")
        index += count
    prefix = f"{ijson_prefix(keys)}.item" if keys else "item"
    found = _item(path, prefix, index)
    if found is _MISSING:
        count = array_length(path, keys)
        if count is None:
            raise PathError(
                f"{format_path(where) if keys else 'the root'} is not an array; index {index} does not apply"
            )
        raise PathError(
            f"index {index} is out of range at {format_path(where)}: the array has {count} items (0..{count - 1}, or -1 for the last)"
        )
    value = found
    where.append(index)
    for step in rest:
        value = step_into(value, step, where)
        where.append(step)
    return value


_MISSING = object()
WINDOW_BEFORE, WINDOW_AFTER = 10, 40
_WINDOWS: OrderedDict[tuple[tuple[str, int, int], str], tuple[int, list[Any]]] = OrderedDict()


def _item(path: Path, prefix: str, index: int) -> Any:
    """Item `index` of the array at `prefix`. Streaming to it also keeps a window of its neighbours, so
    paging with next_path/prev_path costs one pass, not one per step."""
    key = (file_version(path), prefix)
    with _OUTLINE_LOCK:
        window = _WINDOWS.get(key)
        if window is not None and window[0] <= index < window[0] + len(window[1]):
            _WINDOWS.move_to_end(key)
            return window[1][index - window[0]]
    start = max(0, index - WINDOW_BEFORE)
    with open(path, "rb") as fh, _valid_json():
        items = list(itertools.islice(ijson.items(fh, prefix, use_float=True), start, index + WINDOW_AFTER))
    with _OUTLINE_LOCK:
        _WINDOWS[key] = (start, items)
        while len(_WINDOWS) > 16:
            _WINDOWS.popitem(last=False)
    return items[index - start] if index - start < len(items) else _MISSING


def _stream_value(path: Path, keys: list[str]) -> Any:
    if not keys:
        info = outline(path)
        raise PathError(
            f"the whole file is {info['size']} bytes; give a json_path below the root, e.g. "
            + ", ".join(repr(k) for k in (info.get("keys") or ["0"])[:3])
        )
    with open(path, "rb") as fh, _valid_json():
        found = next(ijson.items(fh, ijson_prefix(keys), use_float=True), _MISSING)
    if found is _MISSING:
        parent = keys[:-1]
        known = (outline(path)["structure"].get(format_path(parent) if parent else "$") or {}).get("keys")
        hint = f"; keys there: {', '.join(known[:15])}" if known else ""
        raise PathError(f"no value at {format_path(list(keys))}{hint}")
    return found


def array_length(path: Path, keys: list[str]) -> int | None:
    info = outline(path)
    entry = info["structure"].get(format_path(list(keys)) if keys else "$")
    if entry is not None:
        return entry.get("items") if entry["type"] == "array" else None
    value = value_at(path, list(keys))
    return len(value) if isinstance(value, list) else None


def resolve(path: Path, json_path: str | None) -> tuple[Any, list[Step]]:
    """The value at a dotted path or JSONPath, and the concrete steps that reached it."""
    steps, remainder = parse_path(json_path)
    value = value_at(path, steps)
    concrete = list(steps)
    if remainder:
        matches = compiled_jsonpath(remainder).find(value)
        value = [m.value for m in matches]
    return value, concrete


def neighbours(path: Path, steps: list[Step]) -> tuple[str | None, str | None]:
    """next_path / prev_path for a slice that ends in an array index."""
    if not steps or not isinstance(steps[-1], int):
        return None, None
    parent = list(steps[:-1])
    index = steps[-1]
    if all(isinstance(s, str) for s in parent):
        count = array_length(path, parent)  # type: ignore[arg-type]
    else:
        value = value_at(path, parent)
        count = len(value) if isinstance(value, list) else None
    if count is None:
        return None, None
    if index < 0:
        index += count
    nxt = format_path([*parent, index + 1]) if index + 1 < count else None
    prev = format_path([*parent, index - 1]) if index > 0 else None
    return nxt, prev


# -- search -----------------------------------------------------------------------------------


def search(path: Path, terms: list[str], limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Records (array items, else top-level values) whose scalars contain the terms, best first."""
    scored: list[tuple[int, int, str, dict[str, str]]] = []
    total = 0
    order = itertools.count()
    for record, fields in _records_with_matches(path, terms):
        total += 1
        matched = {t for t in terms for v in fields.values() if t in v.lower()}
        item = (len(matched), -next(order), record, fields)
        keep = offset + limit
        if len(scored) < keep:
            heapq.heappush(scored, item)
        else:
            heapq.heappushpop(scored, item)
    ranked = sorted(scored, reverse=True)[offset : offset + limit]
    return [{"path": r, "score": s, "matches": dict(itertools.islice(f.items(), 6))} for s, _, r, f in ranked], total


def _records_with_matches(path: Path, terms: list[str]) -> Any:
    """Stream scalars with their concrete paths; group matches by record (the first array item on the path)."""
    frames: list[list[Any]] = []  # open containers: [is_array, step in parent, last index used]
    key: str | None = None
    current: str | None = None
    fields: dict[str, str] = {}
    for _prefix, event, value in _events(path):
        if event == "map_key":
            key = value
            continue
        if event in _END:
            frames.pop()
            continue
        step: Step | None = None
        if frames:
            top = frames[-1]
            if top[0]:
                top[2] += 1
                step = top[2]
            else:
                step = key
        if event in ("start_map", "start_array"):
            frames.append([event == "start_array", step, -1])
            continue
        if value is None:
            continue
        text = value if isinstance(value, str) else str(value)
        lowered = text.lower()
        if not any(t in lowered for t in terms):
            continue
        steps = [f[1] for f in frames if f[1] is not None] + ([step] if step is not None else [])
        record, inner = _split_record(steps)
        if record != current:
            if current is not None and fields:
                yield current, fields
            current, fields = record, {}
        if len(fields) < 12:
            fields[inner] = text if len(text) <= 200 else text[:200] + "…"
    if current is not None and fields:
        yield current, fields


def _split_record(steps: list[Step]) -> tuple[str, str]:
    """`data.12` and `customer.city` for `data.12.customer.city`; a top-level key when there is no array."""
    cut = next((i + 1 for i, s in enumerate(steps) if isinstance(s, int)), min(1, len(steps)))
    inner = steps[cut:]
    return format_path(steps[:cut]), format_path(inner) if inner else "(value)"


# -- compression ----------------------------------------------------------------------------


def compress(value: Any, mode: str, *, head: int, tail: int, max_length: int, keys: list[str] | None) -> Any:
    if mode == "first_of_array":
        return _map(
            value, lambda arr, f: [f(arr[0]), f"…(+{len(arr) - 1} more items)"] if len(arr) > 1 else [f(v) for v in arr]
        )
    if mode == "sample_array":

        def sample(arr: list[Any], f: Any) -> list[Any]:
            if len(arr) <= head + tail:
                return [f(v) for v in arr]
            kept = [f(v) for v in arr[:head]] + [f"…({len(arr) - head - tail} items omitted)"]
            return kept + ([f(v) for v in arr[-tail:]] if tail else [])

        return _map(value, sample)
    if mode == "truncate_strings":
        return _map(value, None, lambda s: s if len(s) <= max_length else s[:max_length] + f"…(+{len(s) - max_length})")
    if mode == "keys_only":
        return _keys_only(value)
    if mode == "select_keys":
        wanted = set(keys or [])
        return _select(value, wanted)
    raise PathError(f"unknown mode {mode!r}")


def large_array(path: Path, steps: list[Step]) -> int | None:
    """The item count when `steps` (keys only) name an array of a large file: stream it, do not load it."""
    if is_small(path) or not all(isinstance(s, str) for s in steps):
        return None
    entry = outline(path)["structure"].get(format_path(list(steps)) if steps else "$")
    return entry.get("items") if entry and entry["type"] == "array" else None


def stream_array(path: Path, keys: list[str]) -> Any:
    """The items of the array at `keys`, one at a time."""
    prefix = f"{ijson_prefix(keys)}.item" if keys else "item"
    with open(path, "rb") as fh:
        yield from ijson.items(fh, prefix, use_float=True)


_SLICE = re.compile(r"^\$\[-?\d*:")


def stream_matches(path: Path, keys: list[str], remainder: str | None) -> Any:
    """Values of a large array, or what a JSONPath remainder selects from each item (wildcards and
    filters apply item by item, so the array is never loaded whole). None when that cannot be done."""
    if remainder is None:
        return stream_array(path, keys)
    if not remainder.startswith("$[") or _SLICE.match(remainder):
        return None
    expression = compiled_jsonpath(remainder)
    return (match.value for item in stream_array(path, keys) for match in expression.find([item]))


def compress_stream(
    path: Path,
    keys: list[str],
    count: int,
    mode: str,
    *,
    head: int,
    tail: int,
    max_length: int,
    wanted: list[str] | None,
) -> Any:
    """The compressed items of a large array, one at a time (bounded memory)."""
    prefix = f"{ijson_prefix(keys)}.item" if keys else "item"
    with open(path, "rb") as fh:
        items = ijson.items(fh, prefix, use_float=True)
        if mode == "first_of_array":
            for item in itertools.islice(items, 1):
                yield compress(item, mode, head=head, tail=tail, max_length=max_length, keys=wanted)
            if count > 1:
                yield f"…(+{count - 1} more items)"
            return
        for i, item in enumerate(items):
            if mode == "sample_array" and head <= i < count - tail:
                if i == head:
                    yield f"…({count - head - tail} items omitted)"
                continue
            yield compress(item, mode, head=head, tail=tail, max_length=max_length, keys=wanted)


def _map(value: Any, on_array: Any, on_string: Any = None) -> Any:
    def f(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: f(x) for k, x in v.items()}
        if isinstance(v, list):
            return on_array(v, f) if on_array else [f(x) for x in v]
        if isinstance(v, str) and on_string:
            return on_string(v)
        return v

    return f(value)


def _keys_only(value: Any, depth: int = 0) -> Any:
    if isinstance(value, dict):
        return {k: _keys_only(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if not value:
            return []
        return [_keys_only(value[0], depth + 1), f"…({len(value)} items)"] if len(value) > 1 else [_keys_only(value[0])]
    return type_name(value)


def _select(value: Any, wanted: set[str]) -> Any:
    if isinstance(value, list):
        return [_select(v, wanted) for v in value]
    if isinstance(value, dict):
        picked = {k: v for k, v in value.items() if k in wanted}
        if picked:
            return picked
        return {k: _select(v, wanted) for k, v in value.items() if isinstance(v, (dict, list))}
    return value
