"""The PostgreSQL backend (`[storage] backend = "postgres"`): what several gateway replicas share.

Each store that is one SQLite file on the SQLite backend (a namespace's memory index, its documents) is
one PostgreSQL schema here, so the stores' own SQL runs on either engine: `PgDatabase` takes SQLite's
`?` placeholders and keeps the same calls (`execute`, `executemany`, `fetchone`, `fetchall`).

- `PgSearchIndex` is `SearchIndex` on PostgreSQL. Each row keeps its text, its `extra` column (the same
  identifier splits and CJK bigrams) and a `tsvector` of the tokens SQLite's FTS5 would make of both,
  under a GIN index; a search takes the rows whose vector matches any query term (the best CANDIDATES by
  `ts_rank`), then ranks them with FTS5's own BM25 (same weights, same statistics of the whole table), so both backends give the same
  top results on the same data.
- `PgLog` is `JsonlLog` on PostgreSQL: an append-only table, appends of one log serialized by an
  advisory lock held to the commit (ids are assigned under it and never reused), every acknowledged
  append committed.

A database that stalls costs only the calls that need it, within seconds: every connection has a
`statement_timeout`, a `lock_timeout` and TCP keepalives, and a statement whose server stopped
answering altogether (a stopped process cannot time itself out) has its socket cut by a watchdog
thread at `ANSWER_SECONDS`; each becomes a `StorageError` saying so.

psycopg is imported here, and this module only when the backend is postgres.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from gateway.services.search_index import Hit, IndexCalls, _row, query_terms
from gateway.services.storage_error import StorageError
from gateway.services.text import CJK_CLASS

K1, B = 1.2, 0.75  # FTS5's bm25 constants
WEIGHTS = (1.0, 0.6)  # body, extra: as `SearchIndex.search` weighs them
MAX_LEXEME = 500  # PostgreSQL refuses lexemes over 2 KB; nobody searches for a token this long
CANDIDATES = 500  # rows ranked per search at most (the best by ts_rank; ranking each costs its vector)
LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"  # held to the end of the transaction
MAX_POSITION, MAX_POSITIONS = 16383, 256  # what a tsvector keeps of a lexeme's places
STATEMENT_SECONDS = 10  # a statement the server runs longer is cancelled (statement_timeout)
LOCK_SECONDS = 5  # a lock another connection holds longer fails the statement (lock_timeout)
CONNECT_SECONDS = 5
ANSWER_SECONDS = STATEMENT_SECONDS + 3  # the client's own limit: a stopped server cancels nothing
BATCH = 500  # rows per executemany round trip, each within its own limit
# every connection's limits, where the dsn does not set its own
CONNECTION = {
    "connect_timeout": str(CONNECT_SECONDS),
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
_TOKEN = re.compile(r"\w+")
_CJK_ONE = re.compile(f"^[{CJK_CLASS}]$")  # a one-character CJK term matches as a prefix, as in FTS5


def fts_tokens(text: str) -> list[str]:
    """The tokens SQLite's FTS5 makes of a text (unicode61, diacritics removed, `_` a token character)."""
    folded = text.lower()
    if not folded.isascii():
        folded = "".join(c for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c))
        folded = unicodedata.normalize("NFC", folded)
    return _TOKEN.findall(folded)


_HASHED = re.compile(r"_[0-9a-f]{8}$")  # how a shortened name ends


def schema_name(*parts: str) -> str:
    """A PostgreSQL schema for one store of one namespace (`ctx_memory`, `ctx_documents_alice`). A name
    that is not already lower-case letters, digits and `_`, is long, or ends as a shortened one does
    (`_` and 8 hex digits) is shortened with a hash of it (identifiers are at most 63 bytes): a kept
    name never ends like a shortened one, so no two namespaces share a schema (`team-x` and
    `team_x_70466bce`, `Alice` and `alice`)."""
    name = "_".join(["ctx", *[p for p in parts if p]])
    safe = re.sub(r"[^a-z0-9_]", "_", name.lower())
    if safe != name or len(safe) > 50 or _HASHED.search(safe):
        safe = f"{safe[:40]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return safe


def connect(dsn: str) -> psycopg.Connection[Any]:
    """A connection with the gateway's limits (`CONNECTION`, statement and lock timeouts) where the dsn
    does not give its own."""
    try:
        params = conninfo_to_dict(dsn)
        for key, value in CONNECTION.items():
            params.setdefault(key, value)
        # the dsn's own `-c` settings come later and win
        limits = f"-c statement_timeout={STATEMENT_SECONDS * 1000} -c lock_timeout={LOCK_SECONDS * 1000}"
        params["options"] = f"{limits} {params.get('options') or ''}".strip()
        return psycopg.connect(**params, autocommit=True)
    except psycopg.Error as exc:
        raise StorageError(
            f"PostgreSQL at [storage] dsn could not be reached: {str(exc).strip().splitlines()[0]}"
        ) from None


class _Watch:
    """One statement under the watchdog: `fired` once its socket was cut."""

    def __init__(self, fd: int, deadline: float):
        self.fd, self.deadline, self.fired = fd, deadline, False


class _Watchdog:
    """Cuts the socket of a connection whose statement waits past its deadline: a server process that
    stopped (SIGSTOP, a frozen VM) still has its kernel acknowledge every packet, so neither the
    server's timeouts nor TCP keepalives end the wait. The blocked call then fails at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: psycopg.Connection[Any], seconds: float = ANSWER_SECONDS) -> Iterator[_Watch]:
        try:
            fd = conn.pgconn.socket
        except psycopg.Error:  # closed: the statement fails by itself
            fd = -1
        watch = _Watch(fd, time.monotonic() + seconds)
        with self._lock:
            if fd >= 0:
                self._watches.add(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="postgres-watchdog", daemon=True)
                self._thread.start()
        try:
            yield watch
        finally:
            with self._lock:  # under the lock: a socket is never cut after its statement ended
                self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                for watch in [w for w in self._watches if w.deadline <= now]:
                    self._watches.discard(watch)
                    watch.fired = True
                    with contextlib.suppress(OSError):
                        sock = socket.socket(fileno=os.dup(watch.fd))
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        finally:
                            sock.close()


WATCHDOG = _Watchdog()
STALLED = (
    f"PostgreSQL did not answer within {ANSWER_SECONDS} s; check that it runs and [storage] dsn (notes and "
    "documents live there; the gateway keeps serving)"
)


def _storage_error(exc: psycopg.Error, watch: _Watch | None = None) -> StorageError:
    """What a failed statement tells the caller: a stall, a lock held elsewhere, a conflict with another
    writer, or the database's own words."""
    if (watch is not None and watch.fired) or isinstance(exc, psycopg.errors.QueryCanceled):
        return StorageError(STALLED)
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        return StorageError(
            f"PostgreSQL: what this call needs stayed locked by another connection for over {LOCK_SECONDS} s "
            "(another call writing the same thing, or a stuck client of the database); try again"
        )
    if isinstance(exc, psycopg.IntegrityError):
        return StorageError(
            f"PostgreSQL refused a write that another call made at the same moment ({_said(exc)}); try again"
        )
    return StorageError(f"PostgreSQL: {_first_line(exc)}")


def _sqlite_to_pg(sql: str) -> str:
    """The stores' SQL as PostgreSQL takes it: `?` placeholders, REAL as double precision."""
    sql = sql.replace("%", "%%").replace("?", "%s")
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


class PgDatabase:
    """One connection whose `search_path` is one store's schema, with the calls the stores make of a
    sqlite3 connection. Shared by the store's threads under its lock. A connection the server dropped
    (a restart, a failover) is made again for the next statement outside a transaction; a failure
    becomes a `StorageError` that says what to check."""

    def __init__(self, dsn: str, schema: str):
        self.dsn, self.schema = dsn, schema
        self.depth = 0  # transactions open on this connection
        self.conn = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect(self.dsn)
        try:
            with WATCHDOG.watch(conn) as watch:
                with conn.transaction():
                    # two replicas starting at once: one creates the schema, the other waits for it
                    conn.execute(LOCK, (f"schema:{self.schema}",))
                    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                conn.execute(f'SET search_path TO "{self.schema}"')
        except psycopg.Error as exc:
            conn.close()
            raise _storage_error(exc, watch) from None
        return conn

    def _watched(self, work: Callable[[], Any]) -> Any:
        """`work()` under the watchdog; a failure becomes a `StorageError` saying what to check."""
        with WATCHDOG.watch(self.conn) as watch:
            try:
                return work()
            except psycopg.Error as exc:
                raise _storage_error(exc, watch) from None

    def _run(self, work: Callable[[], Any]) -> Any:
        if self.conn.broken and not self.depth:
            self.conn = self._connect()
        with WATCHDOG.watch(self.conn) as watch:
            try:
                return work()
            except psycopg.Error as exc:
                failed = exc
        # a connection the server dropped between statements (a restart, a failover): once more on a
        # new one; never one that stalled (it would wait as long again) nor inside a transaction
        if not isinstance(failed, psycopg.OperationalError) or not self.conn.broken or self.depth or watch.fired:
            raise _storage_error(failed, watch)
        self.conn = self._connect()
        return self._watched(work)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        return self._run(lambda: self.conn.execute(_sqlite_to_pg(sql), tuple(params)))  # type: ignore[arg-type]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """The rows in batches of `BATCH`, each batch within the time one statement may take."""
        query = _sqlite_to_pg(sql)
        for batch in _batches(rows, BATCH):

            def run(batch: list[Sequence[Any]] = batch) -> None:
                with self.conn.cursor() as cur:
                    cur.executemany(query, batch)  # type: ignore[arg-type]

            self._run(run)

    def executescript(self, script: str) -> None:
        with self.transaction():
            self.hold(f"schema:{self.schema}")
            for statement in filter(str.strip, script.split(";")):
                self.execute(statement)

    def hold(self, key: str) -> None:
        """An advisory lock on `key` for the rest of the current transaction: every replica's holder of
        the same key waits for its commit (at most `LOCK_SECONDS`)."""
        self._watched(lambda: self.conn.execute(LOCK, (key,)))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A transaction (a savepoint inside another). An outermost one begins on a new connection when
        the server dropped this one since its last statement (a restart, a failover)."""
        begun: list[psycopg.Transaction] = []

        def begin() -> None:
            begun.append(self.conn.transaction())
            begun[-1].__enter__()

        self._run(begin)
        tx = begun[-1]
        self.depth += 1
        try:
            yield
        except BaseException as exc:
            self.depth -= 1
            with contextlib.suppress(StorageError):  # the block's own error is the one to tell
                self._watched(functools.partial(tx.__exit__, type(exc), exc, exc.__traceback__))
            raise
        self.depth -= 1
        self._watched(lambda: tx.__exit__(None, None, None))  # the commit

    def close(self) -> None:
        self.conn.close()


def _said(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _first_line(exc: BaseException) -> str:
    """The error's first line, and what to do: a database that stopped or refused is the operator's to fix."""
    return f"{_said(exc)} (notes and documents live there: check that it runs and [storage] dsn; the gateway keeps serving)"


def _batches(rows: Iterable[Sequence[Any]], size: int) -> Iterator[list[Sequence[Any]]]:
    batch: list[Sequence[Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _tsquery(terms: Sequence[str]) -> str:
    """A tsquery of the terms as lexemes (never parsed: nothing in them is syntax), OR-ed."""
    return " | ".join(_quoted(t) + (":*" if _CJK_ONE.match(t) else "") for t in terms)


def _quoted(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _vector(body: list[str], extra: list[str]) -> str:
    """A tsvector (as text) of both columns' tokens: each token's positions, weight A in the body and B in
    `extra`, so a search reads each term's count per column without the text. PostgreSQL keeps at most
    256 positions of a lexeme, the last ones at 16,383: counts that high add nothing to BM25 anyway."""
    places: dict[str, list[str]] = {}
    for weight, tokens, start in (("A", body, 1), ("B", extra, len(body) + 1)):
        for i, token in enumerate(tokens, start):
            if len(token) <= MAX_LEXEME:
                places.setdefault(token, []).append(f"{min(i, MAX_POSITION)}{weight}")
    return " ".join(f"{_quoted(t)}:{','.join(p[:MAX_POSITIONS])}" for t, p in places.items())


class PgSearchIndex(IndexCalls):
    """`SearchIndex` on PostgreSQL: the same calls, the same rows, the same ranking."""

    def __init__(self, dsn: str, schema: str, table: str = "docs", columns: Sequence[str] = (), script: str = ""):
        self.table = table
        self.columns = list(columns)
        self.lock = threading.RLock()
        self.recovered_from = None  # nothing is moved aside: the database keeps its own integrity
        self.path = None
        self.db = PgDatabase(dsn, schema)
        cols = "".join(f", {c} TEXT" for c in self.columns)
        self.db.executescript(
            f"CREATE TABLE IF NOT EXISTS {table} (key TEXT{cols}, body TEXT, extra TEXT, "
            "body_tokens INTEGER, extra_tokens INTEGER, tsv TSVECTOR);"
            f"CREATE INDEX IF NOT EXISTS {table}_tsv ON {table} USING GIN (tsv);"
            + "".join(f"CREATE INDEX IF NOT EXISTS {table}_{c} ON {table} ({c});" for c in self.columns)
            # BM25's statistics of the whole table, kept with every change (a scan took most of a search)
            + f"CREATE TABLE IF NOT EXISTS {table}_totals (id INTEGER PRIMARY KEY, rows BIGINT, tokens BIGINT);"
            + f"INSERT INTO {table}_totals SELECT 1, count(*), coalesce(sum(body_tokens + extra_tokens), 0) "
            + f"FROM {table} ON CONFLICT DO NOTHING;"
            + script
        )

    def insert(self, rows: Iterable[tuple[Any, ...]]) -> None:
        cols = ", ".join(["key", *self.columns, "body", "extra", "body_tokens", "extra_tokens", "tsv"])
        marks = ", ".join(["?"] * (len(self.columns) + 5) + ["?::tsvector"])

        added = [0, 0]  # rows, tokens

        def made() -> Iterator[tuple[Any, ...]]:
            for row in rows:
                key, *values, body, extra = _row(*row)
                body_tokens, extra_tokens = fts_tokens(body), fts_tokens(extra)
                added[0] += 1
                added[1] += len(body_tokens) + len(extra_tokens)
                yield (
                    key,
                    *values,
                    body,
                    extra,
                    len(body_tokens),
                    len(extra_tokens),
                    _vector(body_tokens, extra_tokens),
                )

        with self.lock, self.db.transaction():
            self.db.executemany(f"INSERT INTO {self.table} ({cols}) VALUES ({marks})", made())
            self._count(*added)

    def _count(self, rows: int, tokens: int) -> None:
        if rows:
            self.db.execute(
                f"UPDATE {self.table}_totals SET rows = rows + ?, tokens = tokens + ? WHERE id = 1", (rows, tokens)
            )

    def delete(self, where: str, params: Sequence[object] = ()) -> None:
        with self.lock, self.db.transaction():
            gone = self.db.execute(
                f"DELETE FROM {self.table} WHERE {where} RETURNING body_tokens + extra_tokens", params
            ).fetchall()
            self._count(-len(gone), -sum(n for (n,) in gone))

    @contextmanager
    def transaction(self, bulk: bool = False, key: str = "") -> Iterator[None]:
        with self.lock, self.db.transaction():
            if key:  # every replica's transaction of the same key waits for this one's commit
                self.db.hold(f"{self.db.schema}.{self.table}:{key}")
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """A transaction no other writer of this table (another replica's too) interleaves with."""
        with self.lock, self.db.transaction():
            self.db.hold(f"{self.db.schema}.{self.table}")
            yield

    def search(self, query: str, limit: int = 10, where: str = "", params: Sequence[object] = ()) -> list[Hit]:
        terms = query_terms(query)
        if not terms:
            return []
        condition = f" AND {where}" if where else ""
        tsquery = _tsquery(terms)
        # each term's row count from the GIN index, one term at a time (a filter over all rows read them all)
        counts = ", ".join(f"(SELECT count(*) FROM {self.table} WHERE tsv @@ ?::tsquery)" for _ in terms)
        exact = [t for t in terms if not _CJK_ONE.match(t)]
        prefixes = [t + "%" for t in terms if _CJK_ONE.match(t)]
        with self.lock:
            stats = self.db.execute(
                f"SELECT rows, tokens::float8 / greatest(rows, 1), {counts} FROM {self.table}_totals WHERE id = 1",
                [_tsquery([t]) for t in terms],
            ).fetchone()
            # each matching row's places of each term (from its vector: the text is never read back)
            places = self.db.execute(
                f"WITH hits AS (SELECT key, body_tokens + extra_tokens AS length, tsv FROM {self.table} "
                f"WHERE tsv @@ ?::tsquery{condition} ORDER BY ts_rank(tsv, ?::tsquery) DESC LIMIT ?) "
                "SELECT key, length, lexeme, weights FROM hits, unnest(tsv) "
                "WHERE lexeme = ANY(?::text[]) OR lexeme LIKE ANY(?::text[])",
                (tsquery, *params, tsquery, CANDIDATES, exact, prefixes),
            ).fetchall()
        total, avgdl, hits = stats[0], float(stats[1]) or 1.0, stats[2:]
        idf = {t: max(math.log((total - n + 0.5) / (n + 0.5)), 1e-6) for t, n in zip(terms, hits, strict=True)}
        freq: dict[str, dict[str, float]] = {}
        lengths: dict[str, int] = {}
        for key, length, lexeme, weights in places:
            lengths[key] = length
            row = freq.setdefault(key, {})
            hits_here = sum(WEIGHTS[0] if w == "A" else WEIGHTS[1] for w in weights)
            for term in terms:
                if lexeme == term or (_CJK_ONE.match(term) and lexeme.startswith(term)):
                    row[term] = row.get(term, 0.0) + hits_here
        scored = [(key, _bm25(idf, row, lengths[key], avgdl)) for key, row in freq.items()]
        scored.sort(key=lambda s: -s[1])
        return [Hit(key, score) for key, score in scored[:limit]]

    def close(self) -> None:
        with self.lock:
            self.db.close()


def _bm25(idf: dict[str, float], freq: dict[str, float], length: int, avgdl: float) -> float:
    """FTS5's bm25() for one row: per term, its weighted hits in the row's columns against the row's length."""
    norm = K1 * (1 - B + B * length / avgdl)
    return sum(idf[t] * (f * (K1 + 1)) / (f + norm) for t, f in freq.items() if f)


class PgLog:
    """`JsonlLog` on PostgreSQL: one log's records in order, appended under a lock held to the commit."""

    def __init__(self, db: PgDatabase, lock: threading.RLock, name: str):
        self.db, self.lock, self.name = db, lock, name
        self.damaged: list[bytes] = []  # a committed row is whole: nothing is ever damaged here

    @property
    def where(self) -> str:
        return f"PostgreSQL {self.db.schema}.log, {self.name}"

    @staticmethod
    def schema() -> str:
        return (
            "CREATE TABLE IF NOT EXISTS log (name TEXT NOT NULL, seq BIGSERIAL, record JSONB NOT NULL, "
            "PRIMARY KEY (name, seq));"
        )

    def exists(self) -> bool:
        with self.lock:
            return self.db.execute("SELECT 1 FROM log WHERE name = ? LIMIT 1", (self.name,)).fetchone() is not None

    def append(self, records: Sequence[dict[str, Any]] | Callable[[], Sequence[dict[str, Any]]]) -> int:
        """The records in one transaction, under this log's lock (every replica's), committed before
        this returns. `records` may be a function called under the lock, as `JsonlLog.append`'s."""
        with self.lock, self.db.transaction():
            self.db.hold(f"log:{self.db.schema}:{self.name}")
            rows = records() if callable(records) else records
            self.db.executemany("INSERT INTO log (name, record) VALUES (?, ?)", [(self.name, Jsonb(r)) for r in rows])
            last = self.db.execute("SELECT max(seq) FROM log WHERE name = ?", (self.name,)).fetchone()
        return int(last[0] or 0)

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Records after `start` (a sequence number; 0 reads all) and the last one read. Appends to one
        log commit in the order of their numbers (the lock), so nothing committed is ever skipped."""
        with self.lock:
            rows = self.db.execute(
                "SELECT seq, record FROM log WHERE name = ? AND seq > ? ORDER BY seq", (self.name, start)
            ).fetchall()
        records = [r if isinstance(r, dict) else json.loads(r) for _, r in rows]
        return [r for r in records if isinstance(r, dict)], int(rows[-1][0]) if rows else start

    def touch(self) -> None:
        """Mark the log as existing (an opened session with nothing written yet)."""
        with self.lock, self.db.transaction():
            self.db.hold(f"log:{self.db.schema}:{self.name}")
            if self.db.execute("SELECT 1 FROM log WHERE name = ? LIMIT 1", (self.name,)).fetchone() is None:
                self.db.execute("INSERT INTO log (name, record) VALUES (?, ?)", (self.name, Jsonb({"type": "opened"})))


def names(db: PgDatabase, lock: threading.RLock) -> list[str]:
    with lock:
        return [r[0] for r in db.execute("SELECT DISTINCT name FROM log ORDER BY name").fetchall()]
