"""response_query's answers: every row saved when they do not fit, and never more than a reply may read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import plugins.offload.query as query
from gateway.args import Args
from gateway.services.files import temp_beside
from gateway.services.responses import ResponseStore
from plugins.offload.explore import Explorer


@pytest.fixture
def explorer(tmp_path: Path) -> tuple[Explorer, str]:
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i} for i in range(10)]), "json")
    return Explorer(store), saved.id


def _ask(explorer: tuple[Explorer, str], sql: str, max_tokens: int = 300) -> dict:
    tool, rid = explorer
    return tool.query(Args({"path": rid, "sql": sql, "max_tokens": max_tokens}, "t"), max_tokens)


def test_rows_beyond_the_budget_are_all_saved(explorer: tuple[Explorer, str]) -> None:
    answer = _ask(explorer, "SELECT i, i * 2 AS twice FROM range(20000) t(i) -- a comment at the end")
    assert answer["row_count"] == 20000 and len(answer["rows"]) < 100
    tool, _ = explorer
    saved = _ask((tool, answer["fileRef"]["id"]), "SELECT count(*), max(i), sum(twice) FROM items")
    assert saved["rows"] == [[20000, 19999, 2 * sum(range(20000))]]


def test_huge_rows_stop_at_the_answer_cap(explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query, "ANSWER_BYTES", 4_000_000)
    answer = _ask(explorer, "SELECT i, repeat('x', 500000) AS s FROM range(1000) t(i)")
    assert str(answer["row_count"]).startswith("more than ") and "larger than 4.0 MB" in answer["note"]
    saved = Path(answer["fileRef"]["path"])
    assert saved.stat().st_size < 6 * 1024 * 1024  # 1,000 rows of 0.5 MB were never all read


def test_a_conversions_temp_files_survive_another_gateways_start(tmp_path: Path) -> None:
    """Temp files of a conversion carry this process's id: a second gateway starting on the same
    workspace (its sweep of stale temp files) leaves a live one's alone, and removes a dead one's."""
    result = tmp_path / "r.json"
    live = temp_beside(result, "duckdb")
    live.write_bytes(b"being written")
    dead = tmp_path / ".r.json.duckdb.999999999.1.tmp"
    dead.write_bytes(b"left by a gateway that died")
    ResponseStore(tmp_path).remove_stale_temp_files()
    assert live.exists() and not dead.exists()


def test_a_conversion_needing_more_than_the_small_limit_still_gets_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion starts with a small memory limit (its worker stays small) and raises it once for a
    statement that needs more: long records still become a table."""
    monkeypatch.setattr(query, "BUILD_MEMORY_LIMIT", "8MB")
    store = ResponseStore(tmp_path)
    rows = [{"id": i, "body": "가나다 " * 30_000 if i % 50 == 0 else "short"} for i in range(400)]
    saved = store.save_text("t", json.dumps(rows), "json")
    answer = _ask((Explorer(store), saved.id), "SELECT count(*), max(length(body)) FROM items")
    assert answer.get("rows") == [[400, len("가나다 " * 30_000)]], answer
