"""Tool definitions that change under the host: each upstream tool's first definition is remembered in
the workspace (`definitions.json`) by its SHA-256; a later one that differs is reported (log,
`inspect`) and, with `freeze_definitions = true`, not served: the host keeps the first definition and
calls to the tool are refused with what changed. Removing the file accepts the current definitions.
On the PostgreSQL backend the ledger is the table `ctx_definitions.definitions`, shared by the replicas
(the first definition any replica saw wins); deleting its rows accepts the current definitions. It is
read at start and written behind, in a thread of its own: checks use what is in memory, so a database
that stalls never holds up routing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import mcp_types as types

from gateway.services.files import atomic_write, move_aside
from gateway.services.storage import Storage

log = logging.getLogger("gateway.definitions")
FIELDS = ("title", "description", "inputSchema", "outputSchema", "annotations")
DAMAGED = "_damaged"  # the key of the marker left where a damaged ledger was
DAMAGED_SERVERS = "_damaged_servers"  # server -> why: the markers of servers whose entries were damaged


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


PG_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS definitions (server TEXT, tool TEXT, sha TEXT, definition TEXT, "
    "PRIMARY KEY (server, tool));"
    # rows of the wrong shape, moved here for a look when their server's definitions are remembered anew
    "CREATE TABLE IF NOT EXISTS definitions_damaged (server TEXT, tool TEXT, sha TEXT, definition TEXT, "
    "moved TIMESTAMPTZ DEFAULT now());"
)
RETRY_SECONDS = 30  # a background write that failed (the database away) is tried again after this


def shape_problem(tools: Any) -> str:
    """Why one server's ledger entry is not `{tool: {"sha": ..., "definition": a tool}}`, or ""."""
    if not isinstance(tools, dict):
        return f"a {type(tools).__name__}, not an object of tools"
    for name, known in tools.items():
        if not isinstance(known, dict) or not isinstance(known.get("sha"), str):
            return f"tool {name!r} has no sha"
        try:
            types.Tool.model_validate(known.get("definition"))
        except ValueError:
            return f"tool {name!r} has no valid definition"
    return ""


class DefinitionLedger:
    """server -> tool -> the first definition seen, kept in one JSON file in the workspace (or in
    PostgreSQL, `storage`). Each server's entry is checked by its shape: a damaged one is unknown to
    that server alone (refused while frozen, else remembered anew) and never to the others."""

    def __init__(self, path: Path, storage: Storage | None = None):
        self.path = path
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one write at a time (the background writer, a direct flush)
        self._seen: dict[str, dict[str, dict[str, Any]]] = {}
        self._reported: set[tuple[str, str, str]] = set()
        self._dirty = False
        self.damaged = ""  # why every first definition is unknown (the ledger could not be read)
        self.damaged_servers: dict[str, str] = {}  # server -> why its first definitions are unknown
        self._renewed: set[str] = set()  # damaged servers remembered anew: their old rows go at the next write
        self._db: Any = None
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self.accept = f"remove {path}"  # how the operator accepts the current definitions
        if storage is not None and storage.shared:
            self.accept = "delete the rows of PostgreSQL's ctx_definitions.definitions"
            self._db = storage.database("definitions")
            self._db.executescript(PG_SCHEMA)
            self._seen, bad = self._shared()
            self.damaged_servers = {
                server: f"the rows of server '{server}' in ctx_definitions.definitions are damaged ({why})"
                for server, why in bad.items()
            }
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            marker, servers = data.pop(DAMAGED, ""), data.pop(DAMAGED_SERVERS, {})
            if not isinstance(marker, str) or not (
                isinstance(servers, dict) and all(isinstance(v, str) for v in servers.values())
            ):
                raise ValueError(f"its {DAMAGED} marker is not a text")
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            aside = move_aside(path)  # kept for a look, like every damaged file
            self.damaged = f"{path.name} could not be read ({exc}) and was moved to {aside.name}"
            log.warning("%s; tool definitions cannot be compared with the first ones", self.damaged)
            # a marker in its place: a restart must not take the damage for a fresh start
            atomic_write(path, json.dumps({DAMAGED: self.damaged}), sync=False)
            return
        self.damaged, self.damaged_servers = marker, servers
        bad = {server: why for server, tools in data.items() if (why := shape_problem(tools))}
        self._seen = {server: tools for server, tools in data.items() if server not in bad}
        if bad:
            aside = move_aside(path)
            for server, why in bad.items():
                self.damaged_servers[server] = (
                    f"the first definitions of server '{server}' in {path.name} are damaged ({why}); the file was "
                    f"moved to {aside.name}"
                )
                log.warning(
                    "%s; its tools cannot be compared with their first definitions", self.damaged_servers[server]
                )
            self._write_file()  # the undamaged servers, and markers: a restart still knows the damage

    def check(self, server: str, tool: types.Tool, frozen: bool = False) -> tuple[dict[str, Any] | None, str]:
        """(the first definition, what changed) when this one differs from it; (None, "") otherwise.
        A tool seen for the first time is remembered. With the ledger (or this server's entry) damaged
        and `frozen`, the tool is unknown (fails closed) and nothing is remembered until the operator
        accepts; without the freeze, the server's definitions are remembered anew."""
        definition = wire(tool)
        sha = fingerprint(definition)
        with self._lock:
            why = self.damaged or self.damaged_servers.get(server, "")
            if why and frozen:
                return None, f"its first definition is unknown: {why}"
            if why:  # remembered anew: the damage goes with the next write
                self.damaged = ""
                if self.damaged_servers.pop(server, None) is not None:
                    self._renewed.add(server)
                self._dirty = True
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

    def _shared(self) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
        """The definitions in PostgreSQL, and the servers whose rows are of the wrong shape (why)."""
        seen: dict[str, dict[str, dict[str, Any]]] = {}
        bad: dict[str, str] = {}
        for server, tool, sha, text in self._db.execute("SELECT server, tool, sha, definition FROM definitions"):
            try:
                definition = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                definition = None
            seen.setdefault(server, {})[tool] = {"sha": sha, "definition": definition}
        for server, tools in seen.items():
            if why := shape_problem(tools):
                bad[server] = why
        return {s: t for s, t in seen.items() if s not in bad}, bad

    def flush_soon(self) -> None:
        """`flush` in the caller's thread for the file; for PostgreSQL in a thread of the ledger's own, so
        a database that stalls never holds up the caller (the routing table, on the event loop)."""
        if self._db is None:
            self.flush()
            return
        with self._lock:
            if not self._dirty:
                return
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_behind, name="definitions-ledger", daemon=True)
                self._writer.start()
        self._wake.set()

    def _write_behind(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while not self.flush():
                time.sleep(RETRY_SECONDS)

    def flush(self) -> bool:
        """Write the definitions seen for the first time since the last flush; False when it failed (they
        stay to be written)."""
        with self._flushing:
            with self._lock:
                if not self._dirty:
                    return True
                self._dirty = False
                renewed, self._renewed = self._renewed, set()
                if self._db is None:
                    return self._write_file()
                rows = [
                    (server, tool, known["sha"], json.dumps(known["definition"], ensure_ascii=False))
                    for server, tools in self._seen.items()
                    for tool, known in tools.items()
                ]
            try:
                with self._db.transaction():
                    if renewed:  # damaged rows, kept for a look
                        self._db.execute(
                            "INSERT INTO definitions_damaged (server, tool, sha, definition) SELECT server, tool, "
                            "sha, definition FROM definitions WHERE server = ANY(?)",
                            (sorted(renewed),),
                        )
                        self._db.execute("DELETE FROM definitions WHERE server = ANY(?)", (sorted(renewed),))
                    # another replica's first definition wins over this one's
                    self._db.executemany("INSERT INTO definitions VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", rows)
                shared, bad = self._shared()
            except RuntimeError as exc:
                log.warning("cannot save the tool definitions to PostgreSQL (tried again later): %s", exc)
                with self._lock:
                    self._dirty = True
                    self._renewed |= renewed
                return False
            with self._lock:
                for server, tools in shared.items():
                    self._seen.setdefault(server, {}).update(tools)
            for server, why in bad.items():
                log.warning("the rows of server '%s' in ctx_definitions.definitions are damaged (%s)", server, why)
            return True

    def _write_file(self) -> bool:
        markers: dict[str, Any] = {DAMAGED: self.damaged} if self.damaged else {}
        if self.damaged_servers:
            markers[DAMAGED_SERVERS] = self.damaged_servers
        try:
            atomic_write(self.path, json.dumps(self._seen | markers, ensure_ascii=False, indent=1), sync=False)
        except OSError as exc:
            log.warning("cannot save %s: %s", self.path, exc)
        return True
