"""Smaller views of JSON values: first item of each array, samples, cut strings, keys only, chosen keys."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from plugins.offload.json_values import stream_array
from plugins.offload.paths import PathError, type_name


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
    stream = stream_array(path, keys)
    if mode == "first_of_array":
        for item in itertools.islice(stream, 1):
            yield compress(item, mode, head=head, tail=tail, max_length=max_length, keys=wanted)
        if count > 1:
            yield f"…(+{count - 1} more items)"
        return
    for i, item in enumerate(stream):
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


def _keys_only(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _keys_only(v) for k, v in value.items()}
    if isinstance(value, list):
        if not value:
            return []
        return [_keys_only(value[0]), f"…({len(value)} items)"] if len(value) > 1 else [_keys_only(value[0])]
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
