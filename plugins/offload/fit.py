"""Cutting a JSON value to a token budget, saying what was left out.

A cut keeps the longest prefix whose whole estimate fits (a binary search over the prefix length), not
a sum of per-item estimates: each estimate rounds up and each item carries its own slack, so summing
them left a reply of short lines at two thirds of its budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.services.tokens import estimate_tokens
from gateway.services.tokens import json_tokens as cost


def fit(value: Any, max_tokens: int) -> tuple[Any, bool]:
    """`(value, was_cut)`: the value itself when it fits, else a prefix of it with markers."""
    if cost(value) <= max_tokens:
        return value, False
    return _shrink(value, max(8, max_tokens)), True


def longest_prefix(count: int, cost_of: Callable[[int], int], budget: int) -> int:
    """The largest k in 0..count with cost_of(k) <= budget; cost_of grows with k."""
    lo, hi = 0, count
    step = 1
    while step < hi and cost_of(step) <= budget:  # gallop: the answer is usually small
        lo, step = step, step * 2
    hi = min(hi, step)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost_of(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def take_within(items: Any, budget: int) -> tuple[list[Any], list[Any], bool]:
    """A prefix of an iterable of JSON values whose list fits `budget`: (prefix, every item read,
    whether items were left unread). Reads only a little past the budget (per-item estimates lean
    high), so a huge stream is never read whole."""
    read: list[Any] = []
    rough = 2
    unread = False
    for item in items:
        read.append(item)
        rough += cost(item)
        if rough > budget * 1.5 + 50:
            unread = True
            break
    k = longest_prefix(len(read), lambda n: cost(read[:n]), budget)
    return read[:k], read, unread


def _shrink(value: Any, budget: int) -> Any:
    if isinstance(value, str):
        keep = max(1, longest_prefix(len(value), lambda n: estimate_tokens(value[:n]), budget - 12))
        return value[:keep] + f"…(+{len(value) - keep} chars)"
    if isinstance(value, list):
        marker = 12  # "…(+N more items)"
        k = longest_prefix(len(value), lambda n: cost(value[:n]), budget - marker)
        out = value[:k]
        if k == 0 and value and cost(value[0]) > 24:  # not even one item fits: cut the first one
            out, k = [_shrink(value[0], budget - marker - 4)], 1
        if k < len(value):
            out = [*out, f"…(+{len(value) - k} more items)"]
        return out
    if isinstance(value, dict):
        marker = 12  # "…": "+N more keys"
        items = list(value.items())
        k = longest_prefix(len(items), lambda n: cost(dict(items[:n])), budget - marker)
        result = dict(items[:k])
        if k < len(items):
            room = budget - marker - cost(result) - estimate_tokens(items[k][0]) - 4
            if room > 24:  # the first part that does not fit, cut to the room left
                result[items[k][0]] = _shrink(items[k][1], room)
                k += 1
        if k < len(items):
            result["…"] = f"+{len(items) - k} more keys"
        return result
    return value
