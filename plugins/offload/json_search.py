"""Searching an offloaded JSON file: records (array items, else top-level values) whose scalars contain the
query terms, streamed."""

from __future__ import annotations

import heapq
import itertools
from pathlib import Path
from typing import Any

from plugins.offload.json_file import events
from plugins.offload.paths import Step, format_path

_END = ("end_map", "end_array")


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
    for _prefix, event, value in events(path):
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
