"""Values at a path of an offloaded JSON file: streamed to the first array index instead of parsing everything;
large arrays read item by item."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from gateway.services.files import VersionedCache
from plugins.offload.json_file import children, is_small, items, parsed
from plugins.offload.json_outline import outline, prefix_is_safe
from plugins.offload.paths import PathError, Step, compiled_jsonpath, format_path, ijson_prefix, parse_path, step_into


def value_at(path: Path, steps: list[Step]) -> Any:
    """The value at simple steps. Streams to the first array index instead of parsing everything."""
    if is_small(path):
        value, where = parsed(path), []
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
    found = _item(path, keys, index)
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
_WINDOWS: VersionedCache[tuple[int, list[Any]]] = VersionedCache(max_items=16)


def _item(path: Path, keys: list[str], index: int) -> Any:
    """Item `index` of the array at `prefix`. Streaming to it also keeps a window of its neighbours, so
    paging with next_path/prev_path costs one pass, not one per step."""
    prefix = format_path(list(keys))
    window = _WINDOWS.peek(path, prefix)
    if window is not None and window[0] <= index < window[0] + len(window[1]):
        return window[1][index - window[0]]
    start = max(0, index - WINDOW_BEFORE)
    found = list(itertools.islice(stream_array(path, keys), start, index + WINDOW_AFTER))
    _WINDOWS.put(path, (start, found), prefix)
    return found[index - start] if index - start < len(found) else _MISSING


def _stream_value(path: Path, keys: list[str]) -> Any:
    if not keys:
        info = outline(path)
        raise PathError(
            f"the whole file is {info['size']} bytes; give a json_path below the root, e.g. "
            + ", ".join(repr(k) for k in (info.get("keys") or ["0"])[:3])
        )
    if prefix_is_safe(path, keys):
        found = next(items(path, ijson_prefix(keys)), _MISSING)
    else:  # a key ijson's dotted prefix cannot name exactly: follow the events
        found = next((v for k, v in children(path, keys[:-1], False, False) if k == keys[-1]), _MISSING)
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
    concrete = _concrete(path, steps)
    if remainder:
        matches = compiled_jsonpath(remainder).find(value)
        value = [m.value for m in matches]
    return value, concrete


def _concrete(path: Path, steps: list[Step]) -> list[Step]:
    """The steps with negative indices counted from the front (`data.-1` -> `data.4999`), so the answer
    names the path a next call can use."""
    out: list[Step] = []
    for step in steps:
        if isinstance(step, int) and step < 0:
            if all(isinstance(s, str) for s in out):
                count = array_length(path, out)  # type: ignore[arg-type]
            else:
                parent = value_at(path, out)
                count = len(parent) if isinstance(parent, list) else None
            step = step + count if count is not None else step
        out.append(step)
    return out


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


def large_array(path: Path, steps: list[Step]) -> int | None:
    """The item count when `steps` (keys only) name an array of a large file: stream it, do not load it."""
    if is_small(path) or not all(isinstance(s, str) for s in steps):
        return None
    entry = outline(path)["structure"].get(format_path(list(steps)) if steps else "$")
    return entry.get("items") if entry and entry["type"] == "array" else None


def stream_array(path: Path, keys: list[str]) -> Any:
    """The items of the array at `keys`, one at a time."""
    for _, item in children(path, keys, True, prefix_is_safe(path, keys)):
        yield item


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
