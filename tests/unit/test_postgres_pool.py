"""The PostgreSQL backend's connections: a pool per dsn, a transaction held by the thread that opened it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.services.postgres import POOL_SIZE, PgDatabase, PgLog
from gateway.services.storage import Storage
from gateway.services.storage_error import StorageError
from gateway.settings import StorageSettings
from plugins.memory.sessions import RecallIndex, Session


def _connections(dsn: str) -> int:
    """Client connections to this test's database, other than the one asking."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def test_another_threads_statement_never_runs_inside_an_open_transaction(postgres_dsn: str) -> None:
    """One thread's transaction has written a row and not committed; another thread's statement on the
    same store runs on its own connection: it neither sees the row nor waits for the commit. (One
    connection shared by every thread ran it inside the open transaction.)"""
    db = PgDatabase(postgres_dsn, "ctx_pool_test")
    db.execute("CREATE TABLE t (n INTEGER)")
    written, counted = threading.Event(), threading.Event()
    seen: list[int] = []

    def writer() -> None:
        with db.transaction():
            db.execute("INSERT INTO t VALUES (%s)", (1,))
            written.set()
            assert counted.wait(10)  # still open while the other thread counts

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(10)
    row = db.execute("SELECT count(*) FROM t").fetchone()
    seen.append(row[0] if row else -1)
    counted.set()
    thread.join(10)
    assert seen == [0]
    assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)  # committed since
    db.close()


def test_nested_transactions_are_savepoints_on_the_same_connection(postgres_dsn: str) -> None:
    db = PgDatabase(postgres_dsn, "ctx_pool_test")
    db.execute("CREATE TABLE t (n INTEGER)")
    with db.transaction():
        db.execute("INSERT INTO t VALUES (1)")
        try:
            with db.transaction():
                db.execute("INSERT INTO t VALUES (2)")
                raise RuntimeError("the inner block fails")
        except RuntimeError:
            pass
        db.execute("INSERT INTO t VALUES (3)")
    assert db.execute("SELECT n FROM t ORDER BY n").fetchall() == [(1,), (3,)]
    db.close()


def test_the_pool_closes_with_the_last_store_that_uses_it(postgres_dsn: str) -> None:
    """Stores of several schemas share one pool; its connections end when the last of them closes."""
    stores = [PgDatabase(postgres_dsn, f"ctx_pool_{i}") for i in range(3)]
    for db in stores:
        db.execute("SELECT 1")
    assert 1 <= _connections(postgres_dsn) <= POOL_SIZE
    for db in stores:
        db.close()
    deadline = time.monotonic() + 10  # a server process ends a moment after its client hung up
    while _connections(postgres_dsn) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _connections(postgres_dsn) == 0


def test_sessions_catching_up_at_once_never_need_two_connections_each(postgres_dsn: str, tmp_path: Path) -> None:
    """As many memory namespaces as the pool has connections bring their recall index up to their log
    at the same moment. Reading the log inside the index's exclusive transaction took a second
    connection per thread while the first was held: with every connection held, all of them waited for
    one more and failed after 6 s."""
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    work = []
    for i in range(POOL_SIZE):
        logs = storage.logs(tmp_path, "memory", f"ns{i}")
        index = RecallIndex(
            storage.search_index(
                tmp_path / "unused", "memory", f"ns{i}", RecallIndex.TABLE, RecallIndex.COLUMNS, RecallIndex.SCHEMA
            )
        )
        session = Session("s1", logs.log("s1"))
        session.log.append([{"type": "entry", "id": "e00001", "text": "hello world", "ts": 1.0}])
        session.refresh()
        index.sync(session)
        session.log.append([{"type": "entry", "id": "e00002", "text": "more words", "ts": 2.0}])
        session.refresh()
        work.append((index, session))
    together = threading.Barrier(POOL_SIZE, timeout=30)
    read = PgLog.read
    outcomes: list[str] = []

    def read_together(self: PgLog, start: int = 0) -> Any:
        together.wait()  # every thread is at its log read at once
        return read(self, start)

    def sync(index: RecallIndex, session: Session) -> None:
        try:
            index.sync(session)
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")

    PgLog.read = read_together  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=sync, args=w) for w in work]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        PgLog.read = read  # type: ignore[method-assign]
    assert outcomes == ["ok"] * POOL_SIZE
    for index, session in work:
        assert [key for key, _ in index.search(session, "more words", 5)] == ["e00002"]
        index.index.close()


def test_a_call_racing_the_gateways_end_gets_a_storage_error(postgres_dsn: str) -> None:
    """A writer thread (usage figures, the definitions ledger) whose store's pool was closed at shutdown
    gets the one error every store call raises, never the pool's own exception."""
    db = PgDatabase(postgres_dsn, "ctx_pool_test")
    db.pool.close()
    with pytest.raises(StorageError, match="closed"):
        db.execute("SELECT 1")
    with pytest.raises(StorageError, match="closed"), db.transaction():
        pass
    db.close()


def test_a_transaction_after_the_server_dropped_its_connection_begins_on_a_new_one(postgres_dsn: str) -> None:
    """The server ends the pooled connection between two calls (a restart, a failover, an operator): the
    next transaction begins on a new connection instead of failing on the dead one."""
    db = PgDatabase(postgres_dsn, "ctx_pool_test")
    db.execute("CREATE TABLE t (n INTEGER)")
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    with db.transaction():
        db.execute("INSERT INTO t VALUES (1)")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)
    db.close()
