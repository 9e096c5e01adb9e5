"""Cutting a JSON value to a token budget, saying what was left out."""

from __future__ import annotations

from typing import Any

from gateway.services.tokens import estimate_tokens
from gateway.services.tokens import json_tokens as cost


def fit(value: Any, max_tokens: int) -> tuple[Any, bool]:
    """`(value, was_cut)`: the value itself when it fits, else a prefix of it with markers."""
    if cost(value) <= max_tokens:
        return value, False
    return _shrink(value, max(8, max_tokens)), True


def _shrink(value: Any, budget: int) -> Any:
    if isinstance(value, str):
        keep = max(1, len(value) * budget // max(1, estimate_tokens(value)) - 20)
        while keep > 1 and estimate_tokens(value[:keep]) + 12 > budget:
            keep = keep * 3 // 4
        return value[:keep] + f"…(+{len(value) - keep} chars)"
    if isinstance(value, list):
        out: list[Any] = []
        used = 4
        for i, item in enumerate(value):
            c = cost(item)
            if used + c + 12 > budget:
                if not out and c > 24:  # not even one item fits: cut the first one
                    out.append(_shrink(item, budget - 16))
                    i += 1
                if i < len(value):
                    out.append(f"…(+{len(value) - i} more items)")
                return out
            out.append(item)
            used += c
        return out
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        used = 4
        items = list(value.items())
        for i, (key, item) in enumerate(items):
            c = cost(item) + estimate_tokens(key) + 2
            if used + c + 12 > budget:
                room = budget - used - 16
                if room > 24:
                    result[key] = _shrink(item, room)
                    i += 1
                if i < len(items):
                    result["…"] = f"+{len(items) - i} more keys"
                return result
            result[key] = item
            used += c
        return result
    return value
