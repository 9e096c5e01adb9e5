"""response_slice's JSONPath answer: the value or the matches that fit the budget. Run in the gateway for
small files and in a worker process (`sql_worker`) for large ones, so it imports neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plugins.offload.json_values as json_values
from plugins.offload.fit import fit, take_within
from plugins.offload.paths import format_path, parse_path

SLICE_FRAME = 90  # json_path, shown/total or the marker, a note with a next step (tokens)


MORE = "__more__"  # in json_slice's answer: matches were left out (the caller names the next step)


def json_slice(path: Path, json_path: str, budget: int) -> dict[str, Any]:
    """response_slice's answer for a JSONPath (run in the gateway for small files, in a worker process for
    large ones): the value or the matches that fit `budget`. A cut list of matches carries MORE, for the
    caller to add the next step (it knows the result's tables)."""
    steps, remainder = parse_path(json_path)
    count = json_values.large_array(path, steps)
    stream = json_values.stream_matches(path, steps, remainder) if count is not None else None
    if stream is not None:  # a large array: take what fits, never load it whole
        shown, read, unread = take_within(stream, budget - SLICE_FRAME)
        more = unread or len(read) > len(shown)
        if remainder is not None:
            total = len(read) + (sum(1 for _ in stream) if unread else 0)
            return _matches(json_path, steps, shown, total)
        if more:
            shown.append(f"…(+{count - len(shown)} more items)")
        return _slice_answer(json_path, steps, remainder, shown, more, format_path([*steps, 0]), budget)
    value, steps = json_values.resolve(path, json_path)
    nxt, prev = (None, None)
    if remainder is None:
        nxt, prev = json_values.neighbours(path, steps)
    shown, cut = fit(value, budget)
    if remainder is not None:  # a wildcard or filter: its matches, counted
        # fit ends a cut list with its "…(+N more items)" marker: the answer counts instead
        marker = f"…(+{len(value) - len(shown) + 1} more items)"
        return _matches(json_path, steps, shown[:-1] if cut and shown and shown[-1] == marker else shown, len(value))
    return _slice_answer(json_path, steps, remainder, shown, cut, _deeper(steps, value), budget, nxt, prev)


def _matches(json_path: str, steps: list[Any], shown: list[Any], total: int) -> dict[str, Any]:
    """What a wildcard or filter selected: the matches that fit and how many there are."""
    out: dict[str, Any] = {"json_path": json_path, "value": shown, "shown": len(shown), "total": total}
    if len(shown) < total:
        out[MORE] = {"path": format_path(steps)}
    return out


def _slice_answer(
    json_path: str,
    steps: list[Any],
    remainder: str | None,
    shown: Any,
    cut: bool,
    deeper: str,
    budget: int,
    next_path: str | None = None,
    prev_path: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"json_path": format_path(steps) if remainder is None else json_path, "value": shown}
    if cut:
        out["note"] = (
            f"value cut to the token budget ({budget} tokens); go deeper, e.g. json_path='{deeper}', "
            "or use response_compress"
        )
    out["next_path"], out["prev_path"] = next_path, prev_path
    return out


def _deeper(steps: list[Any], value: Any) -> str:
    if isinstance(value, list):
        return format_path([*steps, 0])
    if isinstance(value, dict) and value:
        return format_path([*steps, next(iter(value))])
    return format_path(steps)
