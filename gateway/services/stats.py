"""What passed through the gateway and what it kept out of the window, per server and tool.

Every tool call (and every tools/list in catalog mode) becomes one row in `{workspace}/stats.db`
(SQLite; on the PostgreSQL backend the table `ctx_usage.calls`, every replica's rows): calls, errors,
bytes of the result, tokens returned to the host, tokens kept out of the window and by what (`offload`: the result's cost minus the fileRef's; `catalog`: the definitions
behind the catalog minus its three meta-tools), and latency. Rows are buffered and written every
few seconds in a worker thread, so a call never waits on the disk. The same figures are kept in
memory since start, for `/metrics` and for each session's line in `context_status`.

These are the gateway's own figures: it sees only what passes through it, not the host's context.
"""

from __future__ import annotations

import bisect
import logging
import socket
import sqlite3
import statistics
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.services.files import move_aside
from gateway.services.storage import Storage

log = logging.getLogger("gateway.stats")

FLUSH_SECONDS = 2.0
MAX_PENDING = 10_000
MAX_SESSIONS = 1024
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds, for /metrics
KEEP_DAYS = 90
PERIODS = {"day": 86_400.0, "week": 7 * 86_400.0, "all": None}
SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    ts {time} NOT NULL,
    session TEXT NOT NULL,
    server TEXT NOT NULL,        -- upstream name, or "gateway" for the gateway's own tools
    tool TEXT NOT NULL,          -- the upstream's own tool name, the gateway tool's name, or "tools/list"
    via TEXT NOT NULL,           -- direct | catalog (through tool_call) | gateway | list
    error INTEGER NOT NULL,
    result_bytes INTEGER NOT NULL,
    tokens_returned INTEGER NOT NULL,
    tokens_saved INTEGER NOT NULL,
    saved_by TEXT NOT NULL,      -- offload | catalog | ""
    ms {time} NOT NULL,
    replica TEXT NOT NULL DEFAULT ''  -- the gateway process that served the call (see `replica_name`)
);
CREATE INDEX IF NOT EXISTS calls_ts ON calls(ts);
"""
# each engine's 8-byte float for timestamps and milliseconds (PostgreSQL's REAL has 4 bytes)
SQLITE_SCHEMA, PG_SCHEMA = SCHEMA.format(time="REAL"), SCHEMA.format(time="DOUBLE PRECISION")
# a table made before the replica column: given it (every row then has replica '')
ADD_REPLICA = "ALTER TABLE calls ADD COLUMN {} replica TEXT NOT NULL DEFAULT ''"
COLUMNS = (
    "ts",
    "session",
    "server",
    "tool",
    "via",
    "error",
    "result_bytes",
    "tokens_returned",
    "tokens_saved",
    "saved_by",
    "ms",
)


def replica_name(configured: str, transport: str, port: int) -> str:
    """The name a gateway's rows and /metrics carry: `[gateway] replica_name`, else HOST:PORT for an HTTP
    gateway (stable across restarts, one per replica), else the machine's name."""
    if configured:
        return configured
    host = socket.gethostname()
    return f"{host}:{port}" if transport == "http" else host


@dataclass(frozen=True)
class Row:
    session: str
    server: str
    tool: str
    via: str
    error: bool
    result_bytes: int
    tokens_returned: int
    tokens_saved: int = 0
    saved_by: str = ""
    ms: float = 0.0
    ts: float = field(default_factory=time.time)

    def values(self) -> tuple[Any, ...]:
        return tuple(int(v) if isinstance(v, bool) else v for v in (getattr(self, c) for c in COLUMNS))


@dataclass
class Totals:
    calls: int = 0
    errors: int = 0
    result_bytes: int = 0
    tokens_returned: int = 0
    saved: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by what kept them out
    seconds: float = 0.0

    def add(self, row: Row) -> None:
        if row.via != "list":
            self.calls += 1
            self.errors += row.error
            self.result_bytes += row.result_bytes
            self.seconds += row.ms / 1000
        self.tokens_returned += row.tokens_returned
        if row.tokens_saved:
            self.saved[row.saved_by] += row.tokens_saved


@dataclass(frozen=True)
class Statements:
    """The figures' statements in one engine's words (its placeholders)."""

    insert: str
    prune: str
    totals: str
    rows: str
    replicas: str  # `{replica}`: the column, or '' for a stats.db older than it


def _statements(mark: str) -> Statements:
    return Statements(
        insert=f"INSERT INTO calls ({', '.join(COLUMNS)}, replica) VALUES ({', '.join([mark] * (len(COLUMNS) + 1))})",
        prune=f"DELETE FROM calls WHERE ts < {mark}",
        totals="SELECT COUNT(*) FILTER (WHERE via != 'list'), COALESCE(SUM(error), 0), "
        f"COALESCE(SUM(tokens_returned), 0), COALESCE(SUM(tokens_saved), 0) FROM calls WHERE ts >= {mark}",
        rows="SELECT server, tool, via, error, result_bytes, tokens_returned, tokens_saved, saved_by, ms "
        f"FROM calls WHERE ts >= {mark} ORDER BY server, tool",
        replicas="SELECT {replica}, COUNT(*) FILTER (WHERE via != 'list'), COALESCE(SUM(error), 0), "
        "COALESCE(SUM(tokens_returned), 0), COALESCE(SUM(tokens_saved), 0), MAX(ts) "
        f"FROM calls WHERE ts >= {mark} GROUP BY {{replica}} ORDER BY {{replica}}",
    )


SQLITE, POSTGRES = _statements("?"), _statements("%s")


def damaged(exc: sqlite3.DatabaseError) -> bool:
    return "not a database" in str(exc) or "malformed" in str(exc)


def connect(path: Path, storage: Storage | None = None) -> Any:
    """The figures' database: `path` (SQLite), or the shared one on the PostgreSQL backend (the same calls)."""
    if storage is not None and storage.shared:
        pg = storage.database("usage")
        pg.executescript(PG_SCHEMA)
        pg.execute(ADD_REPLICA.format("IF NOT EXISTS"))
        return pg
    db = sqlite3.connect(path, timeout=5.0)
    db.execute("PRAGMA journal_mode=WAL")  # several gateways (one per host) may share a workspace
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SQLITE_SCHEMA)
    if not _has_replica(db):
        try:
            db.execute(ADD_REPLICA.format(""))
        except sqlite3.OperationalError as exc:  # another gateway added it first
            if "duplicate column" not in str(exc):
                raise
    return db


def _has_replica(db: sqlite3.Connection) -> bool:
    return any(row[1] == "replica" for row in db.execute("PRAGMA table_info(calls)"))


def _write_rows(db: Any, rows: list[Row], replica: str) -> None:
    sql = SQLITE if isinstance(db, sqlite3.Connection) else POSTGRES
    with db if isinstance(db, sqlite3.Connection) else db.transaction():
        db.executemany(sql.insert, [(*r.values(), replica) for r in rows])
        db.execute(sql.prune, (time.time() - KEEP_DAYS * 86_400,))


class Stats:
    """The recorder: `record` is cheap (memory); `flush` writes the buffered rows (call it off the loop)."""

    def __init__(self, workspace: Path, storage: Storage | None = None, replica: str = ""):
        self.path = workspace / "stats.db"
        self.storage = storage
        self.replica = replica or socket.gethostname()
        self._pg: Any = None  # the PostgreSQL backend's connection, once written to
        self.pending: list[Row] = []
        self.by_key: dict[tuple[str, str, str], Totals] = defaultdict(Totals)  # (server, tool, via), since start
        self.by_session: OrderedDict[str, Totals] = OrderedDict()  # the most recent MAX_SESSIONS connections
        self.latency: dict[str, list[int]] = {}  # server -> calls per bucket of BUCKETS (and one above)
        self.failing = ""  # why the last write failed (the figures in memory still count)

    def record(self, row: Row) -> None:
        self.by_key[(row.server, row.tool, row.via)].add(row)
        totals = self.by_session.get(row.session)
        if totals is None:
            totals = self.by_session[row.session] = Totals()
            while len(self.by_session) > MAX_SESSIONS:  # HTTP sessions come and go: keep memory bounded
                self.by_session.popitem(last=False)
        self.by_session.move_to_end(row.session)
        totals.add(row)
        if row.via != "list":
            counts = self.latency.setdefault(row.server, [0] * (len(BUCKETS) + 1))
            counts[bisect.bisect_left(BUCKETS, row.ms / 1000)] += 1
        if len(self.pending) < MAX_PENDING:  # a disk that refuses for long loses rows, never memory
            self.pending.append(row)

    def flush(self) -> None:
        rows, self.pending = self.pending, []
        if not rows:
            return
        try:
            try:
                self._write(rows)
            except sqlite3.DatabaseError as exc:
                if not damaged(exc):
                    raise
                aside = move_aside(self.path)
                log.warning("%s is damaged (%s): moved to %s, a new one is started", self.path, exc, aside.name)
                self._write(rows)
        except (OSError, sqlite3.Error, RuntimeError) as exc:  # a full disk, a damaged file, no database: lost
            if not self.failing:
                log.warning("usage figures cannot be written to %s (%s); `stats` will miss them", self.path, exc)
            self.failing = str(exc)
        else:
            if self.failing:
                log.warning("usage figures are written to %s again", self.path)
            self.failing = ""

    def _write(self, rows: list[Row]) -> None:
        if self.storage is not None and self.storage.shared:  # one connection, kept (it reconnects itself)
            if self._pg is None:
                self._pg = connect(self.path, self.storage)
            _write_rows(self._pg, rows, self.replica)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = connect(self.path)
        try:
            _write_rows(db, rows, self.replica)
        finally:
            db.close()

    def close(self) -> None:
        """Let go of the PostgreSQL backend's connection pool (after the last `flush`)."""
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def session_line(self, session_id: str) -> str:
        """One line for `context_status`: this connection's figures since the gateway started."""
        t = self.by_session.get(session_id)
        if t is None or not (t.calls or t.saved):
            return "no calls through the gateway yet in this session"
        kept = sum(t.saved.values())
        how = ", ".join(f"{n:,} by {what}" for what, n in sorted(t.saved.items()) if n)
        line = f"{t.calls} calls, ~{t.tokens_returned:,} tokens returned to you, ~{kept:,} kept out of the window"
        return line + (f" ({how})" if how else "")


def summary(
    path: Path, period: str = "all", now: float | None = None, storage: Storage | None = None
) -> dict[str, Any]:
    """Figures per server and tool for `day`, `week` or `all`, totals per period, and each replica's
    share, from `stats.db` (or from PostgreSQL, every replica's)."""
    shared = storage is not None and storage.shared
    if not shared and not path.is_file():
        return {"period": period, "totals": {p: _empty() for p in PERIODS}, "rows": [], "replicas": []}
    now = time.time() if now is None else now
    db = connect(path, storage) if shared else sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    sql = POSTGRES if shared else SQLITE
    try:
        totals = {}
        for name, span in PERIODS.items():
            since = now - span if span else 0.0
            (calls, errors, returned, saved) = db.execute(sql.totals, (since,)).fetchone()
            totals[name] = {"calls": calls, "errors": errors, "tokens_returned": returned, "tokens_saved": saved}
        span = PERIODS[period]
        since = now - span if span else 0.0
        groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        latencies: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for server, tool, via, error, size, returned, saved, saved_by, ms in db.execute(sql.rows, (since,)):
            key = (server, tool, via)
            g = groups.setdefault(
                key,
                {
                    "server": server,
                    "tool": tool,
                    "via": key[2],
                    "calls": 0,
                    "errors": 0,
                    "result_bytes": 0,
                    "tokens_returned": 0,
                    "tokens_saved": 0,
                    "saved_by": {},
                },
            )
            g["calls"] += 1  # a tools/list row counts the listings served
            if via != "list":
                latencies[key].append(ms)
            g["errors"] += error
            g["result_bytes"] += size
            g["tokens_returned"] += returned
            g["tokens_saved"] += saved
            if saved:
                g["saved_by"][saved_by] = g["saved_by"].get(saved_by, 0) + saved
        rows = []
        for key, g in groups.items():
            ms_values = latencies.get(key) or []
            g["p50_ms"] = round(statistics.median(ms_values), 1) if ms_values else None
            g["max_ms"] = round(max(ms_values), 1) if ms_values else None
            rows.append(g)
        replica = "replica" if shared or _has_replica(db) else "''"  # a stats.db older than the column
        replicas = [
            {
                "replica": name,
                "calls": calls,
                "errors": errors,
                "tokens_returned": returned,
                "tokens_saved": saved,
                "last_call": last,
            }
            for name, calls, errors, returned, saved, last in db.execute(sql.replicas.format(replica=replica), (since,))
        ]
        return {"period": period, "totals": totals, "rows": rows, "replicas": replicas}
    finally:
        db.close()


def _empty() -> dict[str, int]:
    return {"calls": 0, "errors": 0, "tokens_returned": 0, "tokens_saved": 0}
