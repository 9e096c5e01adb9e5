"""Tool definitions that change under the host: each upstream tool's first definition is remembered in
the workspace (`definitions.json`) by its SHA-256; a later one that differs is reported (log,
`inspect`) and, with `freeze_definitions = true`, not served: the host keeps the first definition and
calls to the tool are refused with what changed. The operator accepts one server's current definitions
with `mcp-context-gateway accept SERVER`; they are also taken anew when that server's own config entry
changes (the ledger keeps a fingerprint of each entry: an edited command is a new server). Other
servers keep theirs. On the PostgreSQL backend the ledger is the tables `ctx_definitions.definitions`
and `configs`, shared by the replicas (the first definition any replica saw wins). It is read at start
and written behind, in a thread of its own: checks use what is in memory, so a database that stalls
never holds up routing. The file is merged with what is on disk when written, as the database is: a
server accepted while a gateway runs keeps its accepted definitions.
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
from gateway.settings import ServerConfig, Settings

log = logging.getLogger("gateway.definitions")
FIELDS = ("title", "description", "inputSchema", "outputSchema", "annotations")
DAMAGED = "_damaged"  # the key of the marker left where a damaged ledger was
DAMAGED_SERVERS = "_damaged_servers"  # server -> why: the markers of servers whose entries were damaged
CONFIGS = "_configs"  # server -> the fingerprint of its config entry when its definitions were taken
MARKERS = (DAMAGED, DAMAGED_SERVERS, CONFIGS)


def wire(tool: types.Tool) -> dict[str, Any]:
    return tool.model_dump(mode="json", by_alias=True, exclude_none=True)


def fingerprint(definition: dict[str, Any]) -> str:
    body = {k: definition[k] for k in FIELDS if k in definition}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def config_fingerprint(cfg: ServerConfig) -> str:
    """What makes a server's tools its own: the command, args, env keys (values may be secrets and
    change without the server changing), url and tool filters, as written (before `${VAR}` expansion)."""
    body = {
        "command": cfg.command,
        "args": cfg.args,
        "env": sorted(cfg.env),
        "url": cfg.url,
        "tools": cfg.tools.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


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
    "CREATE TABLE IF NOT EXISTS configs (server TEXT PRIMARY KEY, sha TEXT);"
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
        self._replaced: set[str] = set()  # servers accepted anew: their old rows go at the next write
        self._configs: dict[str, str] = {}  # server -> config_fingerprint when its definitions were taken
        self._configs_set: set[str] = set()  # the fingerprints this process took, to be written
        self.config_path: Path | None = None  # the gateway's config file, named in how to accept
        self._db: Any = None
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._closed = False
        if storage is not None and storage.shared:
            self._db = storage.database("definitions")
            self._db.executescript(PG_SCHEMA)
            self._seen, bad = self._shared()
            self._configs = {server: sha for server, sha in self._db.execute("SELECT server, sha FROM configs")}
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
            configs = data.pop(CONFIGS, {})
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
        if isinstance(configs, dict):  # else unknown: no entry counts as changed
            self._configs = {server: sha for server, sha in configs.items() if isinstance(sha, str)}
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
            self._write_file(set(), set())  # the undamaged servers, and markers: a restart still knows the damage

    def how_to_accept(self, server: str) -> str:
        config = f" --config {self.config_path}" if self.config_path else ""
        return f"run `mcp-context-gateway accept {server}{config}`"

    def configure(self, settings: Settings) -> None:
        """Note each server's config entry (at start and on reload): a server whose entry changed since
        its definitions were taken has them taken anew, as if accepted."""
        self.config_path = settings.config_path
        with self._lock:
            for server, cfg in settings.enabled_servers.items():
                sha = config_fingerprint(cfg)
                before = self._configs.get(server)
                if before == sha:
                    continue
                self._configs[server] = sha
                self._configs_set.add(server)
                self._dirty = True
                if before is None:  # first seen, or a ledger from before fingerprints: nothing to compare
                    continue
                self._take_anew(server)
                log.warning(
                    "server '%s': its config entry changed, so its current tool definitions are taken as its first",
                    server,
                )

    def accept(self, server: str, tools: list[types.Tool], cfg: ServerConfig | None = None) -> list[str]:
        """Take `tools` as the server's first definitions (the operator accepts them): one line per tool
        that changed, came or went since the first ones."""
        now = {tool.name: wire(tool) for tool in tools}
        with self._lock:
            before = self._seen.get(server, {})
            lines = []
            for name in sorted(set(before) | set(now)):
                if name not in now:
                    lines.append(f"{server}: {name}: no longer listed, forgotten")
                elif name not in before:
                    lines.append(f"{server}: {name}: new")
                elif before[name]["sha"] != fingerprint(now[name]):
                    lines.append(f"{server}: {name}: {what_changed(before[name]['definition'] or {}, now[name])}")
            self._take_anew(server)
            self._seen[server] = {name: {"sha": fingerprint(d), "definition": d} for name, d in now.items()}
            if cfg is not None:
                self._configs[server] = config_fingerprint(cfg)
                self._configs_set.add(server)
            self._dirty = True
        return lines

    def forget_damage(self) -> None:
        """Every server was accepted anew: the damaged ledger no longer makes any first definition unknown."""
        with self._lock:
            self.damaged = ""
            self._dirty = True

    def _take_anew(self, server: str) -> None:
        """Forget the server's first definitions (the lock held): the next ones seen are its first."""
        self._seen.pop(server, None)
        if self.damaged_servers.pop(server, None) is not None:
            self._renewed.add(server)
        self._replaced.add(server)
        self._reported = {seen for seen in self._reported if seen[0] != server}
        self._dirty = True

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
                self.how_to_accept(server),
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
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            while not self._closed and not self.flush():
                self._wake.wait(RETRY_SECONDS)  # woken early only by `close`

    def close(self) -> None:
        """Write what is left (once: a database that is away keeps it) and let go of the database."""
        if self._db is None or self._closed:
            return
        self.flush()
        self._closed = True
        self._wake.set()
        self._db.close()

    def flush(self) -> bool:
        """Write the definitions seen for the first time since the last flush; False when it failed (they
        stay to be written)."""
        with self._flushing:
            with self._lock:
                if not self._dirty:
                    return True
                self._dirty = False
                renewed, self._renewed = self._renewed, set()
                replaced, self._replaced = self._replaced, set()
                configs_set, self._configs_set = self._configs_set, set()
                if self._db is None:
                    return self._write_file(renewed | replaced, configs_set)
                configs = [(server, self._configs[server]) for server in sorted(configs_set)]
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
                            "sha, definition FROM definitions WHERE server = ANY(%s)",
                            (sorted(renewed),),
                        )
                    if renewed | replaced:
                        self._db.execute(
                            "DELETE FROM definitions WHERE server = ANY(%s)", (sorted(renewed | replaced),)
                        )
                    # another replica's first definition wins over this one's
                    self._db.executemany("INSERT INTO definitions VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", rows)
                    self._db.executemany(
                        "INSERT INTO configs VALUES (%s, %s) ON CONFLICT (server) DO UPDATE SET sha = excluded.sha",
                        configs,
                    )
                shared, bad = self._shared()
            except RuntimeError as exc:
                log.warning("cannot save the tool definitions to PostgreSQL (tried again later): %s", exc)
                with self._lock:
                    self._dirty = True
                    self._renewed |= renewed
                    self._replaced |= replaced
                    self._configs_set |= configs_set
                return False
            with self._lock:
                for server, tools in shared.items():
                    self._seen.setdefault(server, {}).update(tools)
            for server, why in bad.items():
                log.warning("the rows of server '%s' in ctx_definitions.definitions are damaged (%s)", server, why)
            return True

    def _write_file(self, replaced: set[str], configs_set: set[str]) -> bool:
        """Write the file (the lock held), merged with what is on disk: there, as in PostgreSQL, the first
        definition written wins (another process may have accepted a server meanwhile), except for the
        servers this process took anew (`replaced`) and the config fingerprints it took."""
        on_disk, configs = self._on_disk()
        for server, tools in on_disk.items():
            if server not in replaced:
                self._seen[server] = self._seen.get(server, {}) | tools
        own = {server: self._configs[server] for server in configs_set if server in self._configs}
        self._configs = self._configs | configs | own
        markers: dict[str, Any] = {DAMAGED: self.damaged} if self.damaged else {}
        if self.damaged_servers:
            markers[DAMAGED_SERVERS] = self.damaged_servers
        if self._configs:
            markers[CONFIGS] = self._configs
        try:
            atomic_write(self.path, json.dumps(self._seen | markers, ensure_ascii=False, indent=1), sync=False)
        except OSError as exc:
            log.warning("cannot save %s: %s", self.path, exc)
        return True

    def _on_disk(self) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, str]]:
        """The file's well-formed servers and config fingerprints; nothing when it cannot be read."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}, {}
        if not isinstance(data, dict):
            return {}, {}
        configs = data.get(CONFIGS)
        tools = {s: t for s, t in data.items() if s not in MARKERS and not shape_problem(t)}
        if not isinstance(configs, dict):
            return tools, {}
        return tools, {server: sha for server, sha in configs.items() if isinstance(sha, str)}
