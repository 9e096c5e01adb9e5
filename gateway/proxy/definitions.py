"""Tool definitions that change under the host: each upstream tool's first definition is remembered in
the workspace (`definitions.json`) by its SHA-256; a later one that differs is reported (log,
`inspect`) and, with `freeze_definitions = true`, not served: the host keeps the first definition and
calls to the tool are refused with what changed. Removing the file accepts the current definitions.
On the PostgreSQL backend the ledger is the table `ctx_definitions.definitions`, shared by the replicas
(the first definition any replica saw wins); deleting its rows accepts the current definitions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

import mcp_types as types

from gateway.services.files import atomic_write, move_aside
from gateway.services.storage import Storage

log = logging.getLogger("gateway.definitions")
FIELDS = ("title", "description", "inputSchema", "outputSchema", "annotations")
DAMAGED = "_damaged"  # the key of the marker left where a damaged ledger was


def wire(tool: types.Tool) -> dict[str, Any]:
    return tool.model_dump(mode="json", by_alias=True, exclude_none=True)


def fingerprint(definition: dict[str, Any]) -> str:
    body = {k: definition[k] for k in FIELDS if k in definition}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def what_changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A short account of how a definition changed: the fields, and arguments added or removed."""
    parts = []
    for key in FIELDS:
        if before.get(key) == after.get(key):
            continue
        if key == "inputSchema":
            old = set((before.get(key) or {}).get("properties") or {})
            new = set((after.get(key) or {}).get("properties") or {})
            detail = [f"+{p}" for p in sorted(new - old)] + [f"-{p}" for p in sorted(old - new)]
            parts.append(f"input schema ({', '.join(detail)})" if detail else "input schema")
        else:
            parts.append({"inputSchema": "input schema", "outputSchema": "output schema"}.get(key, key))
    return ", ".join(parts) or "definition"


PG_SCHEMA = "CREATE TABLE IF NOT EXISTS definitions (server TEXT, tool TEXT, sha TEXT, definition TEXT, PRIMARY KEY (server, tool));"


class DefinitionLedger:
    """server -> tool -> the first definition seen, kept in one JSON file in the workspace (or in
    PostgreSQL, `storage`)."""

    def __init__(self, path: Path, storage: Storage | None = None):
        self.path = path
        self._lock = threading.Lock()
        self._seen: dict[str, dict[str, dict[str, Any]]] = {}
        self._reported: set[tuple[str, str, str]] = set()
        self._dirty = False
        self.damaged = ""  # why the first definitions are unknown (the ledger could not be read)
        self._db: Any = None
        self.accept = f"remove {path}"  # how the operator accepts the current definitions
        if storage is not None and storage.shared:
            self.accept = "delete the rows of PostgreSQL's ctx_definitions.definitions"
            self._db = storage.database("definitions")
            self._db.executescript(PG_SCHEMA)
            self._seen = self._shared()
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            aside = move_aside(path)  # kept for a look, like every damaged file
            self.damaged = f"{path.name} could not be read ({exc}) and was moved to {aside.name}"
            log.warning("%s; tool definitions cannot be compared with the first ones", self.damaged)
            # a marker in its place: a restart must not take the damage for a fresh start
            atomic_write(path, json.dumps({DAMAGED: self.damaged}), sync=False)
            return
        if isinstance(data.get(DAMAGED), str):
            self.damaged = data[DAMAGED]
        self._seen = {s: t for s, t in data.items() if isinstance(t, dict)}

    def check(self, server: str, tool: types.Tool, frozen: bool = False) -> tuple[dict[str, Any] | None, str]:
        """(the first definition, what changed) when this one differs from it; (None, "") otherwise.
        A tool seen for the first time is remembered. With the ledger damaged and `frozen`, every tool is
        unknown (fails closed) and nothing is remembered until the operator accepts by removing the file."""
        definition = wire(tool)
        sha = fingerprint(definition)
        if self.damaged and frozen:
            return None, f"its first definition is unknown: {self.damaged}"
        with self._lock:
            known = self._seen.setdefault(server, {}).get(tool.name)
            if known is None:
                self._seen[server][tool.name] = {"sha": sha, "definition": definition}
                self._dirty = True
                return None, ""
        if known.get("sha") == sha:
            return None, ""
        first = known.get("definition") or {}
        change = what_changed(first, definition)
        if (server, tool.name, sha) not in self._reported:
            self._reported.add((server, tool.name, sha))
            log.warning(
                "tool '%s' of server '%s' changed its definition since it was first seen (%s); %s to accept it",
                tool.name,
                server,
                change,
                self.accept,
            )
        return first, change

    def _shared(self) -> dict[str, dict[str, dict[str, Any]]]:
        seen: dict[str, dict[str, dict[str, Any]]] = {}
        for server, tool, sha, definition in self._db.execute("SELECT server, tool, sha, definition FROM definitions"):
            seen.setdefault(server, {})[tool] = {"sha": sha, "definition": json.loads(definition)}
        return seen

    def flush(self) -> None:
        """Write the definitions seen for the first time since the last flush."""
        with self._lock:
            if not self._dirty:
                return
            self.damaged = ""  # remembered anew (freeze off): the marker goes with this write
            self._dirty = False
            if self._db is None:
                data = json.dumps(self._seen, ensure_ascii=False, indent=1)
            else:
                rows = [
                    (server, tool, known["sha"], json.dumps(known["definition"], ensure_ascii=False))
                    for server, tools in self._seen.items()
                    for tool, known in tools.items()
                ]
        if self._db is not None:  # another replica's first definition wins over this one's
            try:
                self._db.executemany("INSERT INTO definitions VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", rows)
                shared = self._shared()
            except RuntimeError as exc:
                log.warning("cannot save the tool definitions to PostgreSQL: %s", exc)
                return
            with self._lock:
                for server, tools in shared.items():
                    self._seen.setdefault(server, {}).update(tools)
            return
        try:
            atomic_write(self.path, data, sync=False)
        except OSError as exc:
            log.warning("cannot save %s: %s", self.path, exc)
