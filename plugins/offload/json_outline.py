"""The outline of an offloaded JSON file: type, keys, item counts and value types to depth 3, and samples."""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.services.files import VersionedCache
from plugins.offload.json_file import events, is_small, items, parsed
from plugins.offload.paths import format_path, type_name

log = logging.getLogger("plugins.offload")
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
_OUTLINES: VersionedCache[dict[str, Any]] = VersionedCache(max_items=32)


@dataclass
class _Node:
    type: str
    count: int = 0
    keys: list[str] = field(default_factory=list)
    value: Any = None


def outline(path: Path) -> dict[str, Any]:
    """Type, keys, item counts and value types to depth 3, plus sample items. Cached per file version;
    a caller that arrives while another computes it waits for that result instead of parsing again."""
    return _OUTLINES.get(path, lambda: _outline_small(path) if is_small(path) else _outline_stream(path))


def warm_outline(path: Path) -> None:
    """Start the outline of a large file in the background, so response_outline finds it ready."""

    def run() -> None:
        try:
            outline(path)
        except Exception as exc:  # broken JSON: response_outline will say so when asked
            log.debug("background outline of %s failed: %s", path.name, exc)

    threading.Thread(target=run, name=f"outline:{path.name}", daemon=True).start()


def _outline_small(path: Path) -> dict[str, Any]:
    value = parsed(path)
    nodes: dict[str, _Node] = {}
    arrays: dict[str, list[Any]] = {}

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
            if v:
                arrays[".".join(prefix)] = v
        else:
            node.value = v

    walk(value, [])
    samples = {prefix: [preview(v) for v in array[:SAMPLE_ITEMS]] for prefix, array in arrays.items()}
    return _render_outline(nodes, samples, path)


def _outline_stream(path: Path) -> dict[str, Any]:
    nodes: dict[str, _Node] = {}
    deep: set[str] = set()  # prefixes below the outline depth or inside array items
    for prefix, event, value in events(path):
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
    return [preview(v) for v in itertools.islice(items(path, item_prefix), SAMPLE_ITEMS)]


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
