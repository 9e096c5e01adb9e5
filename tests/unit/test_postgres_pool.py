"""The PostgreSQL backend's connections: a pool per dsn, a transaction held by the thread that opened it."""

from __future__ import annotations

import threading
import time

import psycopg

from gateway.services.postgres import PgDatabase


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
    assert 1 <= _connections(postgres_dsn) <= 8
    for db in stores:
        db.close()
    deadline = time.monotonic() + 10  # a server process ends a moment after its client hung up
    while _connections(postgres_dsn) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _connections(postgres_dsn) == 0
