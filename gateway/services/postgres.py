"""The PostgreSQL backend (`[storage] backend = "postgres"`): what several gateway replicas share.

Each store that is one SQLite file on the SQLite backend (a namespace's memory index, its documents) is
one PostgreSQL schema here. `PgDatabase` runs a store's statements, written in PostgreSQL's own words
(`%s` placeholders), on the process's connection pool for the dsn (`psycopg_pool`): the calls a store
makes (`execute`, `executemany`, `copy`, `transaction`, `hold`) are the same on both engines, the SQL
is each engine's (`search_index.IndexCalls.engine` tells a store which).

- `PgSearchIndex` is `SearchIndex` on PostgreSQL. Each row keeps its text and its `extra` column (the
  same identifier splits and CJK bigrams); a postings table holds, per token SQLite's FTS5 would make of
  them and per row, the token's weighted hits and the row's length. A search computes FTS5's own BM25
  (same weights, same statistics of the whole table) for every row that holds a query term, in the
  server, so both backends give the same top results on the same data.
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
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from gateway.services.search_index import Hit, IndexCalls, _row, query_terms
from gateway.services.shares import STORE_THREADS
from gateway.services.storage_error import StorageError
from gateway.services.text import CJK_CLASS

log = logging.getLogger("gateway.postgres")
# the pool's own warnings repeat each failed connection attempt; a call that gets none says why itself
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

K1, B = 1.2, 0.75  # FTS5's bm25 constants
WEIGHTS = (1.0, 0.6)  # body, extra: as `SearchIndex.search` weighs them
MAX_LEXEME = 500  # PostgreSQL refuses lexemes over 2 KB; nobody searches for a token this long
LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"  # held to the end of the transaction
STATEMENT_SECONDS = 10  # a statement the server runs longer is cancelled (statement_timeout)
LOCK_SECONDS = 5  # a lock another connection holds longer fails the statement (lock_timeout)
CONNECT_SECONDS = 5
ANSWER_SECONDS = STATEMENT_SECONDS + 3  # the client's own limit: a stopped server cancels nothing
BATCH = 500  # rows per executemany round trip, each within its own limit
# connections per process and dsn: one for each store thread (whose shares keep callers fair) and the
# usage and definitions writers, so no caller waits for a connection another caller's share holds
POOL_SIZE = STORE_THREADS + 2
POOL_WAIT_SECONDS = CONNECT_SECONDS + 1  # a call waits this long for a connection, then fails saying so
FIRST_WAIT_SECONDS = 0.5  # after this, whether the server refuses is asked directly
POOL_IDLE_SECONDS = 60.0
VACUUM_SECONDS = 300
BACKFILL_BATCH = 500  # old rows given postings per transaction (`PgSearchIndex._backfill`)
VACUUM_AFTER = 20_000  # postings written: then the table is vacuumed (a document, a session's index rebuilt)
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
    """The tokens SQLite's FTS5 makes of a text (unicode61, diacritics removed, `_` a token character).
    unicode61 takes diacritics off Latin letters only (é, ñ, ắ, a lone combining accent): Greek tonos,
    Cyrillic ё, Japanese voicing (が), full-width letters and ligatures stay as they are."""
    folded = text.lower()
    if not folded.isascii() and _LATIN_MARKED.search(folded):
        folded = _LATIN_MARKED.sub(_unmarked, folded)
    return _TOKEN.findall(folded)


_LATIN_MARKED = re.compile("[\u00c0-\u024f\u1e00-\u1eff\u0300-\u036f]")


def _unmarked(match: re.Match[str]) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", match.group()) if not unicodedata.combining(c))


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


def _params(dsn: str) -> dict[str, Any]:
    """The dsn's connection parameters with the gateway's limits (`CONNECTION`, statement and lock
    timeouts) where it does not give its own."""
    params = conninfo_to_dict(dsn)
    for key, value in CONNECTION.items():
        params.setdefault(key, value)
    # the dsn's own `-c` settings come later and win
    limits = f"-c statement_timeout={STATEMENT_SECONDS * 1000} -c lock_timeout={LOCK_SECONDS * 1000}"
    params["options"] = f"{limits} {params.get('options') or ''}".strip()
    return params


def connect(dsn: str) -> psycopg.Connection[Any]:
    """One connection of its own, with the gateway's limits (`inspect`'s check, tests)."""
    try:
        return psycopg.connect(**_params(dsn), autocommit=True)
    except psycopg.Error as exc:
        raise _unreachable(exc) from None


def _unreachable(exc: BaseException) -> StorageError:
    return StorageError(f"PostgreSQL at [storage] dsn could not be reached: {str(exc).strip().splitlines()[0]}")


class _Pools:
    """One connection pool per dsn in this process, shared by every store's schema (a borrowed
    connection is pointed at the caller's schema only when it was last used for another); a pool
    closes with the last database that uses it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[ConnectionPool, int]] = {}

    def take(self, dsn: str) -> ConnectionPool:
        with self._lock:
            pool, users = self._pools.get(dsn, (None, 0))
            if pool is None:
                try:
                    params = _params(dsn)
                except psycopg.Error as exc:  # a dsn that is not one
                    raise _unreachable(exc) from None
                pool = ConnectionPool(
                    kwargs=params | {"autocommit": True},
                    min_size=0,  # connections are made when needed and closed when idle
                    max_size=POOL_SIZE,
                    timeout=POOL_WAIT_SECONDS,
                    max_idle=POOL_IDLE_SECONDS,
                    num_workers=1,
                    name="gateway",
                    open=True,
                )
            self._pools[dsn] = (pool, users + 1)
            return pool

    def give_back(self, dsn: str) -> None:
        with self._lock:
            pool, users = self._pools[dsn]
            if users > 1:
                self._pools[dsn] = (pool, users - 1)
                return
            del self._pools[dsn]
        pool.close(timeout=1.0)


POOLS = _Pools()


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
    if watch is not None and watch.fired:
        return StorageError(STALLED)
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StorageError(
            f"PostgreSQL cancelled a statement that ran over {STATEMENT_SECONDS} s (a database under heavy load, "
            "or more data than one call should touch); try again"
        )
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


CLOSED = "PostgreSQL: this store was closed (the gateway is stopping)"


@contextmanager
def _told(conn: psycopg.Connection[Any]) -> Iterator[_Watch]:
    """Statements on `conn` under the watchdog; a failure becomes a `StorageError` saying what to check."""
    with WATCHDOG.watch(conn) as watch:
        try:
            yield watch
        except psycopg.Error as exc:
            raise _storage_error(exc, watch) from None


class Result:
    """What a statement returned, read before its connection went back to the pool."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int):
        self.rows, self.rowcount = rows, rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)


class PgDatabase:
    """One store's schema on the process's connection pool for its dsn: SQL in PostgreSQL's own words
    (`%s` placeholders). A statement outside a transaction borrows a connection for itself; a
    transaction holds one for the thread that opened it (its statements and nested transactions, as
    savepoints, run there) until it ends. A connection the server dropped (a restart, a failover) is
    replaced for the next statement outside a transaction; a failure becomes a `StorageError` that says
    what to check."""

    def __init__(self, dsn: str, schema: str):
        self.dsn, self.schema = dsn, schema
        self._held = threading.local()  # `conn`: the connection of this thread's open transaction
        self.pool = POOLS.take(dsn)
        self._closed = False
        try:
            with self._borrowed() as conn, _told(conn), conn.transaction():
                # two replicas starting at once: one creates the schema, the other waits for it
                conn.execute(LOCK, (f"schema:{schema}",))
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _borrowed(self, fresh: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, pointed at this schema. `fresh`: after one the server dropped, the
        pool's idle connections are checked first (a restart dropped them all)."""
        try:
            if fresh:
                self.pool.check()
            try:
                # a short wait first: a database that refuses is said at once, not after the whole wait
                cm = self.pool.connection(timeout=FIRST_WAIT_SECONDS)
                conn = cm.__enter__()
            except PoolTimeout:
                if self.pool.pop_stats().get("connections_errors"):  # the pool failed to connect: why?
                    self._refused()
                cm = self.pool.connection(timeout=POOL_WAIT_SECONDS - FIRST_WAIT_SECONDS)
                conn = cm.__enter__()
        except PoolTimeout:
            raise self._no_connection() from None
        except PoolClosed:
            raise StorageError(CLOSED) from None
        try:
            if getattr(conn, "_ctx_schema", None) != self.schema:
                with _told(conn):
                    conn.execute(f'SET search_path TO "{self.schema}"')
                conn._ctx_schema = self.schema  # type: ignore[attr-defined]
            yield conn
        except BaseException as exc:
            cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        cm.__exit__(None, None, None)

    def _refused(self) -> None:
        """Raise what the server says when it refuses a connection now (down, no such database)."""
        try:
            psycopg.connect(**_params(self.dsn), autocommit=True).close()
        except psycopg.Error as exc:
            raise _unreachable(exc) from None

    def _no_connection(self) -> StorageError:
        """Why the pool had no connection to give: the server's own words when it refuses, else the wait."""
        try:
            self._refused()
        except StorageError as refused:
            return refused
        return StorageError(
            f"PostgreSQL: no connection free within {POOL_WAIT_SECONDS} s ({POOL_SIZE} in use by this gateway); "
            "try again"
        )

    def _run(self, work: Callable[[psycopg.Connection[Any]], Any]) -> Any:
        """`work(conn)` on this thread's transaction's connection, or on one borrowed for it alone."""
        if self._closed:
            raise StorageError(CLOSED)
        held = getattr(self._held, "conn", None)
        if held is not None:
            with _told(held):
                return work(held)
        with self._borrowed() as conn, WATCHDOG.watch(conn) as watch:
            try:
                return work(conn)
            except psycopg.Error as exc:
                failed, dropped = exc, _dropped(exc, conn, watch)
        if not dropped:
            raise _storage_error(failed, watch)
        with self._borrowed(fresh=True) as conn, _told(conn):
            return work(conn)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        def run(conn: psycopg.Connection[Any]) -> Result:
            cur = conn.execute(sql, tuple(params))  # type: ignore[arg-type]
            return Result(cur.fetchall() if cur.description else [], cur.rowcount)

        return self._run(run)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """The rows in batches of `BATCH`, each batch within the time one statement may take."""
        for batch in _batches(rows, BATCH):

            def run(conn: psycopg.Connection[Any], batch: list[Sequence[Any]] = batch) -> None:
                with conn.cursor() as cur:
                    cur.executemany(sql, batch)  # type: ignore[arg-type]

            self._run(run)

    def copy(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        """`COPY ... FROM STDIN` of `rows`, in batches each within the time one statement may take (the
        fastest way rows reach PostgreSQL: no statement per row)."""
        for batch in _batches(rows, BATCH * 40):

            def run(conn: psycopg.Connection[Any], batch: list[Sequence[Any]] = batch) -> None:
                with conn.cursor() as cur, cur.copy(statement) as copy:  # type: ignore[arg-type]
                    for row in batch:
                        copy.write_row(row)

            self._run(run)

    def executescript(self, script: str) -> None:
        with self.transaction():
            self.hold(f"schema:{self.schema}")
            for statement in filter(str.strip, script.split(";")):
                self.execute(statement)

    def hold(self, key: str) -> None:
        """An advisory lock on `key` for the rest of the current transaction: every replica's holder of
        the same key waits for its commit (at most `LOCK_SECONDS`)."""
        self.execute(LOCK, (key,))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """A transaction on a connection this thread holds until it ends (a savepoint inside another)."""
        held = getattr(self._held, "conn", None)
        if held is not None:
            with _told(held):
                tx = held.transaction()
                tx.__enter__()
            with self._ended(held, tx):
                yield
            return
        if self._closed:
            raise StorageError(CLOSED)
        borrowed, conn, tx = self._begin()
        self._held.conn = conn
        try:
            with self._ended(conn, tx):
                yield
        finally:
            self._held.conn = None
            borrowed.__exit__(None, None, None)  # the transaction has ended either way

    def _begin(self) -> tuple[Any, psycopg.Connection[Any], psycopg.Transaction]:
        """A borrowed connection (its context manager) with a transaction begun on it: on a new one when
        the server dropped the first since its last use (a restart, a failover), as `_run` does."""
        fresh = False
        while True:
            borrowed = self._borrowed(fresh)
            conn = borrowed.__enter__()
            with WATCHDOG.watch(conn) as watch:
                try:
                    tx = conn.transaction()
                    tx.__enter__()
                    return borrowed, conn, tx
                except psycopg.Error as exc:
                    failed, dropped = exc, _dropped(exc, conn, watch)
            borrowed.__exit__(None, None, None)
            if not dropped or fresh:
                raise _storage_error(failed, watch)
            fresh = True

    @contextmanager
    def _ended(self, conn: psycopg.Connection[Any], tx: psycopg.Transaction) -> Iterator[None]:
        """The block of a begun transaction, then its commit (or its rollback), told as `StorageError`."""
        try:
            yield
        except BaseException as exc:
            with contextlib.suppress(psycopg.Error), WATCHDOG.watch(conn):  # the block's own error is the one to tell
                tx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        with _told(conn):
            tx.__exit__(None, None, None)  # the commit

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            POOLS.give_back(self.dsn)


def _dropped(exc: psycopg.Error, conn: psycopg.Connection[Any], watch: _Watch) -> bool:
    """Whether a statement failed because the server dropped its connection between statements (worth
    once more on a new one), not because it stalled (it would wait as long again) or refused it."""
    return isinstance(exc, psycopg.OperationalError) and conn.broken and not watch.fired


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


def _term_counts(body: list[str], extra: list[str]) -> dict[str, float]:
    """Each token's weighted hits in one row: body hits weigh 1.0, `extra` hits 0.6, as `SearchIndex`
    weighs the columns in FTS5's bm25()."""
    hits: dict[str, float] = {}
    for weight, tokens in zip(WEIGHTS, (body, extra), strict=True):
        for token in tokens:
            if len(token) <= MAX_LEXEME:
                hits[token] = hits.get(token, 0.0) + weight
    return hits


def _folded(term: str) -> str:
    """A query term as FTS5's tokenizer would index it (lower case, diacritics removed), when it is one token."""
    tokens = fts_tokens(term)
    return tokens[0] if len(tokens) == 1 else term


class PgSearchIndex(IndexCalls):
    """`SearchIndex` on PostgreSQL: the same calls, the same rows, the same ranking.

    Beside the rows, a postings table keeps one row per (term, row): the term's weighted hits there and
    the row's length, under a B-tree on the term. A search reads the postings of its terms only and
    computes FTS5's BM25 for every matching row in the server (same constants, same statistics of the
    whole table), so no row that FTS5 would rank first is ever left out (there is no candidate cap)."""

    engine = "postgres"

    def __init__(self, dsn: str, schema: str, table: str = "docs", columns: Sequence[str] = (), script: str = ""):
        self.table = table
        self.columns = list(columns)
        self.lock = threading.RLock()
        self.recovered_from = None  # nothing is moved aside: the database keeps its own integrity
        self.path = None
        self._vacuuming: threading.Thread | None = None
        self._written = 0  # postings committed since the last vacuum began (`VACUUM_AFTER`)
        self._vacuum_lock = threading.Lock()
        self._vacuum_again = False
        self.db = PgDatabase(dsn, schema)
        cols = "".join(f", {c} TEXT" for c in self.columns)
        self.db.executescript(
            # `tsv` is no longer written: it is read once, to make the postings of rows written before them
            f"CREATE TABLE IF NOT EXISTS {table} (key TEXT{cols}, body TEXT, extra TEXT, "
            "body_tokens INTEGER, extra_tokens INTEGER, tsv TSVECTOR);"
            + "".join(f"CREATE INDEX IF NOT EXISTS {table}_{c} ON {table} ({c});" for c in self.columns)
            + f"CREATE SEQUENCE IF NOT EXISTS {table}_order;"
            + f'CREATE TABLE IF NOT EXISTS {table}_terms (term TEXT COLLATE "C" NOT NULL, row BIGINT NOT NULL, '
            f"key TEXT{cols}, hits DOUBLE PRECISION NOT NULL, length INTEGER NOT NULL);"
            # covering: a search reads the index alone once the table is vacuumed (`_vacuum_soon`)
            + f"CREATE INDEX IF NOT EXISTS {table}_terms_term ON {table}_terms (term) "
            + f"INCLUDE (row, key, hits, length{cols.replace(' TEXT', '')});"
            + "".join(f"CREATE INDEX IF NOT EXISTS {table}_terms_{c} ON {table}_terms ({c});" for c in self.columns)
            # BM25's statistics of the whole table, kept with every change (a scan took most of a search)
            + f"CREATE TABLE IF NOT EXISTS {table}_totals (id INTEGER PRIMARY KEY, rows BIGINT, tokens BIGINT);"
            + f"INSERT INTO {table}_totals SELECT 1, count(*), coalesce(sum(body_tokens + extra_tokens), 0) "
            + f"FROM {table} ON CONFLICT DO NOTHING;"
            + script
        )
        self._backfill()

    def _backfill(self) -> None:
        """Postings for rows an earlier version wrote with only their `tsvector` (its weights are the columns)."""
        cols = "".join(f", d.{c}" for c in self.columns)
        t = self.table
        # in batches, each its own transaction within the statement timeout (an old store may be large);
        # a batch's rows lose their vector as their postings are written, so an interrupted one goes on
        while True:
            with self.lock, self.db.transaction():
                self.db.hold(f"{self.db.schema}.{t}")
                done = self.db.execute(
                    f"WITH o AS MATERIALIZED (SELECT ctid, nextval('{t}_order') AS row FROM {t} "
                    f"WHERE tsv IS NOT NULL LIMIT {BACKFILL_BATCH}), "
                    f"p AS (INSERT INTO {t}_terms (term, row, key{cols.replace('d.', '')}, hits, length) "
                    f"SELECT u.lexeme, o.row, d.key{cols}, (SELECT sum(CASE w WHEN 'A' THEN {WEIGHTS[0]} "
                    f"ELSE {WEIGHTS[1]} END) FROM unnest(u.weights) w), d.body_tokens + d.extra_tokens "
                    f"FROM o JOIN {t} d ON d.ctid = o.ctid, unnest(d.tsv) u) "
                    f"UPDATE {t} SET tsv = NULL WHERE ctid IN (SELECT ctid FROM o)"
                ).rowcount
            if done < BACKFILL_BATCH:
                return

    def insert(self, rows: Iterable[tuple[Any, ...]]) -> None:
        cols = ", ".join(["key", *self.columns, "body", "extra", "body_tokens", "extra_tokens"])
        term_cols = ", ".join(["term", "row", "key", *self.columns, "hits", "length"])
        added = [0, 0]  # rows, tokens
        with self.lock, self.db.transaction():
            for batch in _batches((_row(*row) for row in rows), BATCH):
                first = self.db.execute(
                    f"SELECT nextval('{self.table}_order') FROM generate_series(1, %s)", (len(batch),)
                ).fetchall()
                docs, postings = [], []
                for (order,), (key, *values, body, extra) in zip(first, batch, strict=True):
                    body_tokens, extra_tokens = fts_tokens(body), fts_tokens(extra)
                    length = len(body_tokens) + len(extra_tokens)
                    added[0] += 1
                    added[1] += length
                    docs.append((key, *values, body, extra, len(body_tokens), len(extra_tokens)))
                    for term, hits in _term_counts(body_tokens, extra_tokens).items():
                        postings.append((term, order, key, *values, hits, length))
                self.db.copy(f"COPY {self.table} ({cols}) FROM STDIN", docs)
                self.db.copy(f"COPY {self.table}_terms ({term_cols}) FROM STDIN", postings)
                self._written += len(postings)
            self._count(*added)

    def _count(self, rows: int, tokens: int) -> None:
        if rows:
            self.db.execute(
                f"UPDATE {self.table}_totals SET rows = rows + %s, tokens = tokens + %s WHERE id = 1", (rows, tokens)
            )

    def delete(self, match: Mapping[str, object]) -> None:
        where, params = self.condition(match, "%s")
        with self.lock, self.db.transaction():
            gone = self.db.execute(
                f"DELETE FROM {self.table} WHERE {where} RETURNING body_tokens + extra_tokens", params
            ).fetchall()
            self.db.execute(f"DELETE FROM {self.table}_terms WHERE {where}", params)
            self._count(-len(gone), -sum(n for (n,) in gone))

    @contextmanager
    def transaction(self, bulk: bool = False, key: str = "") -> Iterator[None]:
        """One transaction; after its commit, a large write's postings are vacuumed (`_vacuum_soon`)."""
        with self.lock, self.db.transaction():
            if key:  # every replica's transaction of the same key waits for this one's commit
                self.db.hold(f"{self.db.schema}.{self.table}:{key}")
            yield
        self._after_commit()

    def _after_commit(self) -> None:
        with self.lock:
            due = self._written >= VACUUM_AFTER
            if due:
                self._written = 0
        if due:
            self._vacuum_soon()

    def _vacuum_soon(self) -> None:
        """VACUUM (ANALYZE) of the postings in a thread of its own: pages written since the last one are
        not yet marked visible to all, and a search then reads each posting from the table as well as
        from the index (the covering index alone was 2-3x faster on 100,000 chunks). Autovacuum would
        get there too, a minute or more later."""
        with self._vacuum_lock:
            self._vacuum_again = True  # a write committed since the running vacuum began: once more after it
            if self._vacuuming is not None:
                return
            self._vacuuming = threading.Thread(target=self._vacuum, name="postings-vacuum", daemon=True)
            self._vacuuming.start()

    def _vacuum(self) -> None:
        """The vacuum thread: once, and once more for each write committed meanwhile."""
        while True:
            with self._vacuum_lock:
                if not self._vacuum_again:
                    self._vacuuming = None
                    return
                self._vacuum_again = False
            # a connection of its own: a vacuum may take longer than a statement may
            try:
                with connect(self.db.dsn) as conn:
                    conn.execute(f"SET statement_timeout = {VACUUM_SECONDS * 1000}")
                    conn.execute(f'VACUUM (ANALYZE) "{self.db.schema}".{self.table}_terms')
            except (StorageError, psycopg.Error) as exc:
                log.debug("vacuum of %s_terms after a large write: %s", self.table, exc)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """A transaction no other writer of this table (another replica's too) interleaves with."""
        with self.lock, self.db.transaction():
            self.db.hold(f"{self.db.schema}.{self.table}")
            yield
        self._after_commit()

    def search(self, query: str, limit: int = 10, match: Mapping[str, object] | None = None) -> list[Hit]:
        # folded as FTS5 folds them; two query words that fold alike ("café cafe") count twice, as there
        terms = [t for t in map(_folded, query_terms(query)) if len(t) <= MAX_LEXEME]
        if not terms:
            return []
        where, params = self.condition(match or {}, "%s")
        # a term matches its own postings; a one-character CJK term every term it begins, as in FTS5
        exact = [t for t in terms if not _CJK_ONE.match(t)]
        prefixes = [t for t in terms if _CJK_ONE.match(t)]
        t = self.table
        # One statement: each term's rows over the whole table (FTS5's idf), its postings among the rows
        # `match` keeps (index-only scans of the covering index), BM25 per row, the best `limit`.
        sql = (
            f"WITH tot AS (SELECT rows::float8 AS n, tokens::float8 / greatest(rows, 1) AS avgdl "
            f"FROM {t}_totals WHERE id = 1), "
            "qx(i, term) AS (SELECT * FROM unnest(%s::int[], %s::text[])), "
            "qp(i, lo, hi) AS (SELECT * FROM unnest(%s::int[], %s::text[], %s::text[])), "
            f"mx AS (SELECT qx.i, p.row, p.key, p.hits AS f, p.length FROM qx JOIN {t}_terms p "
            f"ON p.term = qx.term WHERE {where}), "
            "mp AS (SELECT qp.i, p.row, min(p.key) AS key, sum(p.hits) AS f, max(p.length) AS length "
            f"FROM qp JOIN {t}_terms p ON p.term >= qp.lo AND p.term < qp.hi WHERE {where} GROUP BY qp.i, p.row), "
            f"df AS (SELECT qx.i, count(*) AS n FROM qx JOIN {t}_terms p ON p.term = qx.term GROUP BY qx.i "
            f"UNION ALL SELECT qp.i, count(DISTINCT p.row) FROM qp JOIN {t}_terms p "
            "ON p.term >= qp.lo AND p.term < qp.hi GROUP BY qp.i), "
            "idf AS (SELECT df.i, greatest(ln((tot.n - df.n + 0.5) / (df.n + 0.5)), 1e-6) AS w FROM df, tot), "
            "m AS (SELECT * FROM mx UNION ALL SELECT * FROM mp) "
            f"SELECT min(m.key), sum(idf.w * m.f * {K1 + 1} / (m.f + {K1} * ({1 - B} + {B} * m.length / tot.avgdl))) "
            "AS score FROM m JOIN idf USING (i), tot GROUP BY m.row ORDER BY score DESC, m.row LIMIT %s"
        )
        first = len(exact)
        args = [
            list(range(first)),
            exact,
            list(range(first, len(terms))),
            prefixes,
            [chr(ord(p) + 1) for p in prefixes],
            *params,
            *params,
            limit,
        ]
        with self.lock:
            found = self.db.execute(sql, args).fetchall()
        return [Hit(key, float(score)) for key, score in found]

    def settle(self) -> None:
        """The vacuum after a large write, done (it runs once more for each write committed meanwhile)."""
        while (vacuuming := self._vacuuming) is not None:
            vacuuming.join()

    def close(self) -> None:
        vacuuming = self._vacuuming
        if vacuuming is not None:
            vacuuming.join(1.0)  # a vacuum not done by then ends with its connection
        with self.lock:
            self.db.close()


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
            return self.db.execute("SELECT 1 FROM log WHERE name = %s LIMIT 1", (self.name,)).fetchone() is not None

    def append(self, records: Sequence[dict[str, Any]] | Callable[[], Sequence[dict[str, Any]]]) -> int:
        """The records in one transaction, under this log's lock (every replica's), committed before
        this returns. `records` may be a function called under the lock, as `JsonlLog.append`'s."""
        with self.lock, self.db.transaction():
            self.db.hold(f"log:{self.db.schema}:{self.name}")
            rows = records() if callable(records) else records
            self.db.executemany("INSERT INTO log (name, record) VALUES (%s, %s)", [(self.name, Jsonb(r)) for r in rows])
            last = self.db.execute("SELECT max(seq) FROM log WHERE name = %s", (self.name,)).fetchone()
        return int(last[0] or 0)

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Records after `start` (a sequence number; 0 reads all) and the last one read. Appends to one
        log commit in the order of their numbers (the lock), so nothing committed is ever skipped."""
        with self.lock:
            rows = self.db.execute(
                "SELECT seq, record FROM log WHERE name = %s AND seq > %s ORDER BY seq", (self.name, start)
            ).fetchall()
        records = [r if isinstance(r, dict) else json.loads(r) for _, r in rows]
        return [r for r in records if isinstance(r, dict)], int(rows[-1][0]) if rows else start

    def touch(self) -> None:
        """Mark the log as existing (an opened session with nothing written yet)."""
        with self.lock, self.db.transaction():
            self.db.hold(f"log:{self.db.schema}:{self.name}")
            if self.db.execute("SELECT 1 FROM log WHERE name = %s LIMIT 1", (self.name,)).fetchone() is None:
                self.db.execute(
                    "INSERT INTO log (name, record) VALUES (%s, %s)", (self.name, Jsonb({"type": "opened"}))
                )


def names(db: PgDatabase, lock: threading.RLock) -> list[str]:
    with lock:
        return [r[0] for r in db.execute("SELECT DISTINCT name FROM log ORDER BY name").fetchall()]
