"""The outline of an offloaded JSON file: type, item counts of arrays and objects, keys and value types to
depth 4, and samples. Biggest parts first, so an outline cut to a budget still shows the top level.

Paths are tracked step by step (never as ijson's dotted prefixes), so a key that is empty, holds dots or
brackets, or is not ASCII is a part like any other. An object with many keys (an API model's `shapes`, a
lockfile's `packages`, an i18n catalog) is a *map*: counted, its value types tallied, only its first entries
described.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from gateway.services.files import VersionedCache
from plugins.offload.json_file import events, is_small, parsed
from plugins.offload.paths import Step, format_path, type_name

log = logging.getLogger("plugins.offload")
OUTLINE_DEPTH = 4
MAX_KEYS = 40  # keys listed per object
MAP_KEYS = 12  # an object with more keys than this is a map: only its first entries are described
MAX_COUNTS = 12  # itemCount lists the largest parts only
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
_OUTLINES: VersionedCache[dict[str, Any]] = VersionedCache(max_items=32)
_NODES: VersionedCache[dict[tuple[Step, ...], Node]] = VersionedCache(max_items=32)


@dataclass
class Node:
    """One part of the document: for arrays and objects, how many children and how many are objects."""

    type: str
    count: int = 0  # array items or object keys
    objects: int = 0  # children that are objects
    arrays: int = 0  # children that are arrays
    keys: list[str] = field(default_factory=list)
    value: Any = None
    samples: list[Any] = field(default_factory=list)
    dotted: bool = False  # a key holds a dot or is empty: ijson's dotted prefixes are ambiguous below it

    @property
    def is_map(self) -> bool:
        return self.type == "object" and self.count > MAP_KEYS


def nodes(path: Path) -> dict[tuple[Step, ...], Node]:
    """Every described part, keyed by its steps (cached per file version)."""
    return _NODES.get(path, lambda: _walk_small(parsed(path)) if is_small(path) else _walk_stream(path))


def outline(path: Path) -> dict[str, Any]:
    """Type, counts, structure and samples. Cached per file version; a caller that arrives while another
    computes it waits for that result instead of parsing again."""
    return _OUTLINES.get(path, lambda: _render(nodes(path), path))


def prefix_is_safe(path: Path, steps: list[Step]) -> bool:
    """Whether ijson's dotted prefix of `steps` (keys only) names exactly that part: no key on the way,
    nor a sibling of one, is empty or holds a dot (`a.b` beside `a` -> `b`). Unknown parts are unsafe."""
    if not all(isinstance(s, str) and s and "." not in s for s in steps):
        return False
    found = nodes(path)
    for i in range(len(steps)):
        node = found.get(tuple(steps[:i]))
        if node is None or node.dotted:
            return False
    return True


def warm_outline(path: Path) -> None:
    """Start the outline of a large file in the background, so response_outline finds it ready."""

    def run() -> None:
        try:
            outline(path)
        except Exception as exc:  # broken JSON: response_outline will say so when asked
            log.debug("background outline of %s failed: %s", path.name, exc)

    threading.Thread(target=run, name=f"outline:{path.name}", daemon=True).start()


def _described(parent: Node | None, depth: int) -> bool:
    """Whether a child is described: not inside an array, within the depth, among a map's first entries."""
    return parent is not None and parent.type == "object" and depth <= OUTLINE_DEPTH and parent.count <= MAP_KEYS


def _tally(parent: Node, child_type: str, key: str | None) -> None:
    parent.count += 1
    parent.objects += child_type == "object"
    parent.arrays += child_type == "array"
    if key is not None:
        parent.dotted = parent.dotted or not key or "." in key
        if len(parent.keys) < MAX_KEYS:
            parent.keys.append(key)


def _walk_small(value: Any) -> dict[tuple[Step, ...], Node]:
    found: dict[tuple[Step, ...], Node] = {}

    def walk(v: Any, steps: tuple[Step, ...]) -> None:
        node = Node(type_name(v))
        found[steps] = node
        if isinstance(v, dict):
            for k, child in v.items():
                _tally(node, type_name(child), k)
                if _described(node, len(steps) + 1):
                    walk(child, (*steps, k))
        elif isinstance(v, list):
            for child in v:
                _tally(node, type_name(child), None)
            node.samples = [preview(x) for x in v[:SAMPLE_ITEMS]]
        else:
            node.value = v

    walk(value, ())
    return found


def _walk_stream(path: Path) -> dict[tuple[Step, ...], Node]:
    found: dict[tuple[Step, ...], Node] = {}
    frames: list[list[Any]] = []  # open containers: [steps, node or None, is_array, last key, last index]
    building: tuple[ijson.ObjectBuilder, Node] | None = None  # a sample item being built, and its array
    level = 0
    skipping = 0  # depth inside a container nothing below which is described (an array's items)
    for event, value in events(path, prefixes=False):
        if skipping:  # the cheapest way through most of a large file's events
            if event in _STARTS:
                skipping += 1
            elif event in _ENDS:
                skipping -= 1
                if not skipping:
                    frames.pop()
            continue
        if building is not None:  # inside a sample item: its events build it
            builder, owner = building
            builder.event(event, value)
            if event in _STARTS:
                level += 1
            elif event in _ENDS:
                level -= 1
                if level == 0:
                    owner.samples.append(preview(builder.value))
                    building = None
            continue
        if event == "map_key":
            frames[-1][3] = value
            continue
        if event in _ENDS:
            frames.pop()
            continue
        kind = _EVENT_TYPES.get(event, event)
        if frames:
            frame = frames[-1]
            steps, parent, is_array = frame[0], frame[1], frame[2]
            if is_array:
                frame[4] += 1
                child: tuple[Step, ...] = (*steps, frame[4])
            else:
                child = (*steps, frame[3])
            if parent is not None:
                _tally(parent, kind, None if is_array else frame[3])
                if is_array and parent.count <= SAMPLE_ITEMS:
                    if event in _STARTS:
                        building, level = (ijson.ObjectBuilder(), parent), 1
                        building[0].event(event, value)
                    else:
                        parent.samples.append(preview(value))
                    continue
            node = Node(kind) if _described(parent, len(child)) else None
        else:
            child, node = (), Node(kind)
        if node is not None:
            found[child] = node
        if event in _STARTS:
            frames.append([child, node, event == "start_array", None, -1])
            skipping = int(node is None)  # its children have no node: none of theirs is described either
        elif node is not None:
            node.value = value
    return found


_STARTS = ("start_map", "start_array")
_ENDS = ("end_map", "end_array")


def preview(value: Any, depth: int = 0) -> Any:
    """A depth-limited sample: long strings cut, arrays cut to 3 items, deep objects summarized."""
    if isinstance(value, str):
        return value if len(value) <= SAMPLE_STRING else value[:SAMPLE_STRING] + f"…(+{len(value) - SAMPLE_STRING})"
    if isinstance(value, list):
        head = [preview(v, depth + 1) for v in value[:SAMPLE_ITEMS]]
        return head + ([f"…(+{len(value) - SAMPLE_ITEMS} items)"] if len(value) > SAMPLE_ITEMS else [])
    if isinstance(value, dict):
        shown = itertools.islice(value.items(), MAX_KEYS)
        out = {k: type_name(v) for k, v in shown} if depth >= 2 else {k: preview(v, depth + 1) for k, v in shown}
        if len(value) > MAX_KEYS:
            out["…"] = f"+{len(value) - MAX_KEYS} more keys"
        return out
    return value


def _values_are(node: Node) -> str:
    if node.objects == node.count:
        return "objects"
    if node.arrays == node.count:
        return "arrays"
    if node.objects or node.arrays:
        return "mixed"
    return "scalars"


def _render(found: dict[tuple[Step, ...], Node], path: Path) -> dict[str, Any]:
    root = found.get((), Node("unknown"))
    out: dict[str, Any] = {"type": root.type, "size": path.stat().st_size}
    if root.type == "object":
        out["keys"] = root.keys
        if root.count > len(root.keys):
            out["keyCount"] = root.count
    maps = {s for s, n in found.items() if n.is_map}
    # a map's entries are rows of its table, not parts to list one by one; biggest first, then shallower
    parts = sorted(
        ((s, n) for s, n in found.items() if not any(s[:i] in maps for i in range(len(s)))),
        key=lambda sn: (-sn[1].count, len(sn[0])),
    )
    counted = [(s, n) for s, n in parts if (n.type == "array" or n.is_map) and n.count]
    out["itemCount"] = {format_path(list(s)): n.count for s, n in counted[:MAX_COUNTS]}
    if len(counted) > MAX_COUNTS:
        out["itemCountNote"] = f"the {MAX_COUNTS} largest of {len(counted)} arrays and maps"
    structure: dict[str, Any] = {}
    for steps, node in sorted(parts, key=lambda sn: len(sn[0])):
        entry: dict[str, Any] = {"type": node.type}
        if node.type == "array":
            entry["items"] = node.count
            if node.count:
                entry["itemsAre"] = _values_are(node)
        elif node.is_map:
            entry["entries"] = node.count
            entry["valuesAre"] = _values_are(node)
            entry["firstKeys"] = node.keys[:5]
        elif node.type == "object":
            entry["keys"] = node.keys
        else:
            entry["value"] = preview(node.value)
        structure[format_path(list(steps))] = entry
    out["structure"] = structure
    out["samples"] = {format_path(list(s)): n.samples for s, n in parts if n.samples}
    return out
