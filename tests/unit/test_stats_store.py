"""gateway.services.stats: rows buffered and written, periods, a damaged or unwritable file."""

import logging
import sqlite3
import time
from pathlib import Path

import pytest

from gateway.services.stats import Row, Stats, summary


def row(**kw: object) -> Row:
    base = {"session": "s", "server": "fs", "tool": "read", "via": "direct", "error": False}
    return Row(**(base | {"result_bytes": 100, "tokens_returned": 30} | kw))  # type: ignore[arg-type]


def test_periods_and_groups(tmp_path: Path) -> None:
    stats = Stats(tmp_path)
    now = time.time()
    stats.record(row(ts=now - 3 * 86_400, ms=10.0))  # within the week, not the day
    stats.record(row(ts=now - 60, ms=30.0, tokens_saved=500, saved_by="offload"))
    stats.record(row(ts=now - 60, via="list", server="gateway", tool="tools/list", tokens_saved=90, saved_by="catalog"))
    stats.flush()
    assert not stats.pending
    day = summary(tmp_path / "stats.db", "day", now)
    assert day["totals"]["day"] == {"calls": 1, "errors": 0, "tokens_returned": 60, "tokens_saved": 590}
    assert day["totals"]["week"]["calls"] == 2
    rows = {r["tool"]: r for r in summary(tmp_path / "stats.db", "week", now)["rows"]}
    assert rows["read"]["calls"] == 2 and rows["read"]["p50_ms"] == 20.0 and rows["read"]["max_ms"] == 30.0
    assert rows["tools/list"]["calls"] == 1 and rows["tools/list"]["saved_by"] == {"catalog": 90}
    assert rows["tools/list"]["via"] == "list"


def test_session_line() -> None:
    stats = Stats(Path("/nonexistent"))
    assert "no calls" in stats.session_line("s")
    stats.record(row(tokens_saved=12_000, saved_by="offload"))
    assert (
        stats.session_line("s")
        == "1 calls, ~30 tokens returned to you, ~12,000 kept out of the window (12,000 by offload)"
    )


def test_a_damaged_file_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "stats.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        summary(tmp_path / "stats.db")
    stats = Stats(tmp_path)
    stats.record(row())
    with caplog.at_level(logging.WARNING):
        stats.flush()
    aside = list(tmp_path.glob("stats.db.damaged-*"))  # named as every damaged database is (files.move_aside)
    assert "is damaged" in caplog.text and len(aside) == 1
    assert aside[0].read_bytes() == b"this is not sqlite" * 100
    assert summary(tmp_path / "stats.db")["totals"]["all"]["calls"] == 1


def test_an_unwritable_workspace_loses_rows_not_calls(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    stats = Stats(tmp_path / "file" / "ws")  # a folder below a file: it cannot be made
    stats.record(row())
    with caplog.at_level(logging.WARNING):
        stats.flush()
    assert stats.failing and "cannot be written" in caplog.text and not stats.pending
    assert stats.by_session["s"].calls == 1  # the figures in memory still count


def test_sessions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.services import stats as stats_module

    monkeypatch.setattr(stats_module, "MAX_SESSIONS", 3)
    stats = Stats(Path("/nonexistent"))
    for sid in ("a", "b", "c", "a", "d"):  # "a" used again: "b" is the oldest
        stats.record(row(session=sid))
    assert list(stats.by_session) == ["c", "a", "d"] and stats.by_session["a"].calls == 2


def test_a_stats_db_from_before_replicas_is_read_and_then_extended(tmp_path: Path) -> None:
    """A stats.db written before the replica column: `stats` reads it as is, and the next gateway adds
    the column and names its own rows (the old ones show as unnamed)."""
    old = sqlite3.connect(tmp_path / "stats.db")
    old.execute(
        "CREATE TABLE calls (ts REAL NOT NULL, session TEXT NOT NULL, server TEXT NOT NULL, tool TEXT NOT NULL, "
        "via TEXT NOT NULL, error INTEGER NOT NULL, result_bytes INTEGER NOT NULL, tokens_returned INTEGER NOT NULL, "
        "tokens_saved INTEGER NOT NULL, saved_by TEXT NOT NULL, ms REAL NOT NULL)"
    )
    old.execute("INSERT INTO calls VALUES (?, 's', 'fs', 'read', 'direct', 0, 10, 3, 0, '', 1.0)", (time.time(),))
    old.commit()
    old.close()
    assert summary(tmp_path / "stats.db")["replicas"] == [
        {
            "replica": "",
            "calls": 1,
            "errors": 0,
            "tokens_returned": 3,
            "tokens_saved": 0,
            "last_call": pytest.approx(time.time(), abs=60),
        }
    ]
    stats = Stats(tmp_path, replica="gw-a")
    stats.record(row())
    stats.flush()
    assert not stats.failing
    assert [(r["replica"], r["calls"]) for r in summary(tmp_path / "stats.db")["replicas"]] == [("", 1), ("gw-a", 1)]
