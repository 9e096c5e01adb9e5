"""Exploring a text file (logs, plain output): outline, line ranges, search. Streamed, bounded memory."""

from __future__ import annotations

import heapq
import itertools
import re
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gateway.services.files import VersionedCache

HEAD_LINES = 8
TAIL_LINES = 4
LINE_PREVIEW = 200
_LEVEL = re.compile(r"\b(TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL|PANIC)\b")
_SHAPE_DIGITS = re.compile(r"\d+")
_SHAPE_HEX = re.compile(r"\b[0-9a-f]{8,}\b", re.IGNORECASE)
_CHUNK = 1 << 20

_INDEX: VersionedCache[array] = VersionedCache(max_items=16)


def _cut(line: str, limit: int = LINE_PREVIEW) -> str:
    line = line.rstrip("\r\n")
    return line if len(line) <= limit else line[:limit] + f"…(+{len(line) - limit} chars)"


def shape(line: str) -> str:
    """A line's shape: numbers and hex ids replaced, first words kept (log lines group by level/route)."""
    text = _SHAPE_HEX.sub("<hex>", line.strip())
    text = _SHAPE_DIGITS.sub("#", text)
    return " ".join(text.split()[:6])[:100]


def line_index(path: Path) -> array:
    """Byte offset of every line start (cached per file version): line ranges seek instead of scanning."""
    return _INDEX.get(path, lambda: _line_starts(path))


def _line_starts(path: Path) -> array:
    offsets = array("q", [0])
    position = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                offsets.append(position + nl + 1)
                start = nl + 1
            position += len(chunk)
    if offsets[-1] == position and len(offsets) > 1:
        offsets.pop()  # a final newline does not start a line
    return offsets


def outline(path: Path) -> dict[str, Any]:
    shapes: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    head: list[str] = []
    tail: list[str] = []
    count = 0
    longest = 0
    for count, line in enumerate(_lines(path), 1):
        if count <= HEAD_LINES:
            head.append(_cut(line))
        tail.append(line)
        if len(tail) > TAIL_LINES:
            tail.pop(0)
        longest = max(longest, len(line))
        if count <= 200_000 or count % 10 == 0:  # shapes from a sample of very long files
            shapes[shape(line)] += 1
        if (level := _LEVEL.search(line, 0, 120)) is not None:
            levels[level.group(1)] += 1
    return {
        "type": "text",
        "size": path.stat().st_size,
        "lines": count,
        "longestLine": longest,
        "head": head,
        "tail": [_cut(t) for t in tail] if count > HEAD_LINES else [],
        "levels": dict(levels.most_common()),
        "commonShapes": [{"shape": s, "lines": n} for s, n in shapes.most_common(8) if n > 1],
    }


def lines(path: Path, start: int, end: int) -> tuple[list[str], int]:
    """Lines start..end (1-based, inclusive) and the total line count."""
    offsets = line_index(path)
    total = len(offsets)
    if start > total:
        return [], total
    end = min(end, total)
    with open(path, "rb") as fh:
        fh.seek(offsets[start - 1])
        stop = offsets[end] if end < total else path.stat().st_size
        data = fh.read(stop - offsets[start - 1])
    return _split(data.decode("utf-8", errors="replace")), total


def _split(text: str) -> list[str]:
    """Lines ended by \n only, as the line index and `grep -n` count them (splitlines would also end
    a line at U+2028, \x0b or a lone \r)."""
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return [line.removesuffix("\r") for line in out]


def _lines(path: Path) -> Iterator[str]:
    """The lines of a file as the line index counts them, decoded one at a time."""
    with open(path, "rb") as fh:
        for raw in fh:
            yield raw.decode("utf-8", errors="replace")


def search(path: Path, terms: list[str], limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Lines containing the terms (case-insensitive, substrings: Korean particles need no stemming)."""
    best: list[tuple[int, int, str]] = []
    total = 0
    keep = offset + limit
    for number, line in enumerate(_lines(path), 1):
        lowered = line.lower()
        score = sum(1 for t in terms if t in lowered)
        if not score:
            continue
        total += 1
        item = (score, -number, line)
        if len(best) < keep:
            heapq.heappush(best, item)
        else:
            heapq.heappushpop(best, item)
    ranked = sorted(best, reverse=True)[offset : offset + limit]
    return [{"line": -n, "score": s, "text": _cut(t)} for s, n, t in ranked], total


def head_preview(text: str, count: int = 3) -> list[str]:
    return [_cut(line, 120) for line in itertools.islice(text.splitlines(), count)]
