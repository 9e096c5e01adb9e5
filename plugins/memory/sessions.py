"""Session memory state: rebuilt from the append-only log (the truth), indexed for recall."""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.services.tokens import estimate_tokens

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DAMAGED_ID = re.compile(r'"id"\s*:\s*"([es])(\d{5,})"')


class SessionError(ValueError):
    pass


class AlreadyFolded(Exception):
    """Another compaction (another gateway on the same workspace) folded some of these notes first."""

    def __init__(self, ids: list[str]):
        super().__init__(", ".join(ids))
        self.ids = ids


def check_session_id(value: Any) -> str:
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value) or ".." in value:
        raise SessionError(
            "session_id must be 1-64 characters: letters, digits, '.', '_' or '-', starting with a letter "
            f"or digit (got {value!r})"
        )
    return value


@dataclass
class Entry:
    id: str
    text: str
    ts: float
    pinned: bool = False
    kind: str = "note"  # note | summary
    tokens: int = 0
    superseded_by: str | None = None
    folds: list[str] = field(default_factory=list)
    writer: str = ""

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.pinned:
            out["pinned"] = True
        if self.kind == "summary":
            out["summary_of"] = len(self.folds)
        return out


class Session:
    def __init__(self, session_id: str, log: Any):
        """`log`: a `JsonlLog` or its PostgreSQL twin (`Storage.logs`)."""
        self.id = session_id
        self.log = log
        self.entries: dict[str, Entry] = {}
        self.chars = 0  # of every note's text held: what the session costs in memory
        self.offset = 0
        self.last_compaction: dict[str, Any] | None = None

    @property
    def exists(self) -> bool:
        return self.log.exists()

    def refresh(self) -> list[dict[str, Any]]:
        """Apply what was appended since the last read (by this or another process)."""
        records, self.offset = self.log.read(self.offset)
        for record in records:
            self._apply(record)
        return records

    def _apply(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "entry" and isinstance(record.get("id"), str) and isinstance(record.get("text"), str):
            text = record["text"]
            replaced = self.entries.get(record["id"])
            self.chars += len(text) - (len(replaced.text) if replaced else 0)
            self.entries[record["id"]] = Entry(
                id=record["id"],
                text=text,
                ts=float(record.get("ts") or 0),
                pinned=bool(record.get("pinned")),
                kind=record.get("kind", "note"),
                tokens=int(record.get("tokens") or estimate_tokens(text)),
                folds=list(record.get("folds") or []),
                writer=str(record.get("writer") or ""),
            )
            if record.get("kind") == "summary":
                self.last_compaction = {
                    "at": record.get("ts"),
                    "summary": record["id"],
                    "folded": len(record.get("folds") or []),
                    "writer": record.get("writer"),
                    "gate": record.get("gate", "-"),
                }
        elif kind == "patch" and record.get("id") in self.entries:
            entry = self.entries[record["id"]]
            if "superseded_by" in record:
                entry.superseded_by = record["superseded_by"]
            if "pinned" in record:
                entry.pinned = bool(record["pinned"])

    def active(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.superseded_by is None]

    def used_tokens(self) -> int:
        return sum(e.tokens for e in self.active())

    def next_id(self, prefix: str) -> str:
        """Never an id used before: one past the highest id of every line that parses and of every damaged
        line whose id can still be read, plus one for each damaged line whose id cannot."""
        numbers = [int(e[len(prefix) :]) for e in self.entries if e.startswith(prefix) and e[len(prefix) :].isdigit()]
        unreadable = 0
        for line in self.log.damaged:
            found = _DAMAGED_ID.findall(line.decode("utf-8", "replace"))
            numbers += [int(n) for p, n in found if p == prefix]
            unreadable += not found
        return f"{prefix}{max(numbers, default=0) + unreadable + 1:05d}"

    @property
    def damaged_lines(self) -> int:
        return len(self.log.damaged)

    def append_entry(self, text: str, pinned: bool) -> Entry:
        created: list[dict[str, Any]] = []

        def records() -> list[dict[str, Any]]:
            self.refresh()  # under the lock: ids follow what any process wrote
            created[:] = [
                {
                    "type": "entry",
                    "id": self.next_id("e"),
                    "ts": time.time(),
                    "text": text,
                    "pinned": pinned,
                    "tokens": estimate_tokens(text),
                }
            ]
            return created

        self.log.append(records)
        self.refresh()
        return self.entries[created[0]["id"]]

    def append_compaction(self, summary: str, folded: list[Entry], writer: str, gate: str = "-") -> Entry:
        created: list[dict[str, Any]] = []

        def records() -> list[dict[str, Any]]:
            self.refresh()  # under the log's lock: what another process folded meanwhile is seen here
            taken = [e.id for e in folded if e.id not in self.entries or self.entries[e.id].superseded_by]
            if taken:
                raise AlreadyFolded(taken)
            sid = self.next_id("s")
            now = time.time()
            created[:] = [
                {
                    "type": "entry",
                    "id": sid,
                    "ts": now,
                    "text": summary,
                    "kind": "summary",
                    "tokens": estimate_tokens(summary),
                    "folds": [e.id for e in folded],
                    "writer": writer,
                    "gate": gate,
                }
            ]
            created.extend({"type": "patch", "id": e.id, "ts": now, "superseded_by": sid} for e in folded)
            return created

        self.log.append(records)  # the summary and its patches: one write
        self.refresh()
        return self.entries[created[0]["id"]]


class SessionCache:
    """The sessions of one namespace held in memory, refreshed from their logs: the least recently used
    is dropped past `count` sessions or `chars` characters of notes (a session larger than that is read
    for each call and never held). A dropped session is read back whole from its log on its next use:
    the log is the truth, so nothing is lost."""

    def __init__(self, count: int = 32, chars: int = 16_000_000):
        self.count, self.chars = count, chars
        self._held: OrderedDict[str, Session] = OrderedDict()
        self._dropped = 0  # characters of the sessions dropped since the last `settle`
        self._lock = threading.Lock()  # calls on different sessions run in threads at once

    def __len__(self) -> int:
        return len(self._held)

    def held_chars(self) -> int:
        with self._lock:
            return sum(s.chars for s in self._held.values())

    def get(self, session_id: str, make: Callable[[], Session]) -> Session:
        """The session, brought up to its log. The caller holds the session's own lock: no other call
        uses this session id meanwhile."""
        with self._lock:
            session = self._held.pop(session_id, None)
        if session is None:
            session = make()
        session.refresh()
        with self._lock:
            self._held[session_id] = session  # the most recently used: last
            self._evict()
        return session

    def settle(self) -> int:
        """Drop what is over the caps now (a call's notes grow its session after `get`); the characters
        dropped since the last settle: worth giving back to the system when large (a thread's heap keeps
        freed pages)."""
        with self._lock:
            self._evict()
            dropped, self._dropped = self._dropped, 0
        return dropped

    def _evict(self) -> None:
        """Under the lock: a session over `chars` alone first (it is read per call), then the least recently
        used while over either cap."""
        for name in [n for n, s in self._held.items() if s.chars > self.chars]:
            self._dropped += self._held.pop(name).chars
        held = sum(s.chars for s in self._held.values())
        while self._held and (len(self._held) > self.count or held > self.chars):
            _, dropped = self._held.popitem(last=False)
            held -= dropped.chars
            self._dropped += dropped.chars


class RecallIndex:
    """FTS5 over active entries of every session; follows each log incrementally, rebuilt when stale."""

    TABLE, COLUMNS = "entries", ("session",)
    SCHEMA = 'CREATE TABLE IF NOT EXISTS indexed (session TEXT PRIMARY KEY, "offset" BIGINT);'
    # how far each session's log is indexed, in each engine's words
    DONE: ClassVar[dict[str, str]] = {
        "sqlite": 'SELECT "offset" FROM indexed WHERE session = ?',
        "postgres": 'SELECT "offset" FROM indexed WHERE session = %s',
    }
    MARK: ClassVar[dict[str, str]] = {
        "sqlite": 'INSERT INTO indexed VALUES (?, ?) ON CONFLICT (session) DO UPDATE SET "offset" = excluded."offset"',
        "postgres": 'INSERT INTO indexed VALUES (%s, %s) ON CONFLICT (session) DO UPDATE SET "offset" = excluded."offset"',
    }

    def __init__(self, index: Any):
        """`index`: a `SearchIndex` (or its PostgreSQL twin) made with TABLE, COLUMNS and SCHEMA. A damaged
        file is moved aside by SearchIndex; the logs are the truth, so it is rebuilt from them."""
        self.index = index
        self._lock = threading.Lock()

    def sync(self, session: Session) -> None:
        """Bring the index up to the session's log. Exclusive across processes: two gateways (replicas)
                following one log never index an entry twice. What the log gained is read before the exclusive
                transaction begins: on PostgreSQL the log is another store, and reading it inside would need a
                second connection while this one is held (as many sessions at once as the pool has connections held
        every one of them, each waiting for one more)."""
        with self._lock:
            done = self._done(session)
            if done == session.offset:  # up to date: no write lock taken
                return
            gained = session.log.read(done) if 0 <= done < session.offset else None
            with self.index.exclusive():
                self._catch_up(session, done, gained)

    def _done(self, session: Session) -> int:
        row = self.index.db.execute(self.DONE[self.index.engine], (session.id,)).fetchone()
        return row[0] if row else -1

    def _catch_up(self, session: Session, seen: int, gained: tuple[list[dict[str, Any]], int] | None) -> None:
        """Inside the exclusive transaction: what another process indexed meanwhile is seen here. `gained`:
        the log's records after `seen`, read before; they apply only if nobody indexed since."""
        done = self._done(session)
        if done == session.offset:
            return
        if done < 0 or done > session.offset or done != seen or not self._incremental(session, gained):
            self.index.delete({"session": session.id})
            self.index.insert((e.id, e.text, (session.id,)) for e in session.active())
        self.index.db.execute(self.MARK[self.index.engine], (session.id, session.offset))

    def _incremental(self, session: Session, gained: tuple[list[dict[str, Any]], int] | None) -> bool:
        if gained is None:
            return False
        records, end = gained
        if end != session.offset:
            return False
        new = [r for r in records if r.get("type") == "entry" and r.get("id") in session.entries]
        gone = [r["id"] for r in records if r.get("type") == "patch" and r.get("superseded_by")]
        for entry_id in gone:
            self.index.delete({"session": session.id, "key": entry_id})
        self.index.insert(
            (r["id"], r["text"], (session.id,)) for r in new if session.entries[r["id"]].superseded_by is None
        )
        return True

    def search(self, session: Session, query: str, limit: int) -> list[tuple[str, float]]:
        self.sync(session)
        return [(h.key, h.score) for h in self.index.search(query, limit, {"session": session.id})]
