"""gateway.services.search_index: FTS5 over identifiers and Korean, and junk queries never raise."""

import pytest

from gateway.services.search_index import SearchIndex, expand, identifier_parts, query_terms


@pytest.fixture
def index():
    idx = SearchIndex(":memory:", table="t", columns=("kind",))
    idx.add(
        [
            ("a", "def getUserName(user_id): return cache[user_id]", ("code",)),
            ("b", "로그인 후 세션토큰 갱신이 두 번 일어난다", ("note",)),
            ("c", "The deploy failed with ERR_TIMEOUT on host db-2", ("note",)),
        ]
    )
    yield idx
    idx.close()


def test_identifier_and_cjk_splits() -> None:
    assert identifier_parts("getUserName") == ["get", "user", "name"]
    assert identifier_parts("snake_case-name.v2") == ["snake", "case", "name", "v", "2"]
    assert "세션 션토" in expand("세션토큰")
    assert query_terms("세션") == ["세션"]


def test_finds_words_inside_identifiers_and_korean_words(index: SearchIndex) -> None:
    assert [h.key for h in index.search("user name")][:1] == ["a"]
    assert [h.key for h in index.search("세션토큰")] == ["b"]
    assert [h.key for h in index.search("세션")] == ["b"]  # a word inside a longer word
    assert [h.key for h in index.search("ERR_TIMEOUT")] == ["c"]
    assert [h.key for h in index.search("deploy", match={"kind": "code"})] == []


@pytest.mark.parametrize("junk", ['"', "AND OR NOT", "*", "(", "NEAR(a b", "'; DROP TABLE t; --", "", "   ", "^$"])
def test_fts5_syntax_in_a_query_never_raises(index: SearchIndex, junk: str) -> None:
    assert isinstance(index.search(junk), list)


def test_expand_gives_the_same_column_with_its_memory_cleared(monkeypatch) -> None:
    import gateway.services.search_index as search_index

    text = "getUserName snake_case-name.v2 세션을 plain Words, getUserName HTTPServer 한국어 plain"
    full = search_index.expand(text)
    assert full.split()[:3] == ["get", "user", "name"] and "세션" in full.split()
    monkeypatch.setattr(search_index, "EXPANDED_KEEP", 1)  # forgets what it saw on almost every call
    search_index._EXPANDED.clear()
    assert [search_index.expand(text) for _ in range(3)] == [full] * 3
    assert len(search_index._EXPANDED) <= len(set(text.split()))


def _rows(n: int, prefix: str = "") -> list[tuple[str, str, tuple[str]]]:
    return [(f"{prefix}{i}", f"section {i} getUserName 세션토큰 " + "filler words " * 40, ("doc",)) for i in range(n)]


def test_a_bulk_write_is_visible_at_once_and_checkpointed_after(tmp_path) -> None:
    import os
    import sqlite3
    import time

    path = tmp_path / "index.sqlite"
    idx = SearchIndex(path, table="t", columns=("kind",))
    before = os.path.getsize(path)
    started: list[bool] = []
    idx._checkpoint_soon = lambda: started.append(True)  # held back, to look at the file first
    with idx.transaction(bulk=True):
        idx.insert(_rows(10_000))  # ~8 MB: past SQLite's own checkpoint mark (1,000 pages)
    # the commit left the pages in the write-ahead log; another connection sees them already
    assert started and os.path.getsize(path) < before + 1_000_000
    other = sqlite3.connect(path)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (10_000,)
    other.close()
    # ... and the thread copies them into the database file after the commit
    SearchIndex._checkpoint_soon(idx)
    deadline = time.monotonic() + 30
    while os.path.getsize(path) < before + 1_000_000:
        assert time.monotonic() < deadline, "the bulk write was never checkpointed"
        time.sleep(0.02)
    # the connection's own settings are back, so later small writes checkpoint and sync as SQLite does
    assert idx.db.execute("PRAGMA wal_autocheckpoint").fetchone() == (1000,)
    assert idx.db.execute("PRAGMA synchronous").fetchone() == (2,)
    assert [h.key for h in idx.search("user name", 1)]
    idx.close()


def test_a_failed_bulk_write_leaves_nothing_and_restores_the_settings(tmp_path) -> None:
    idx = SearchIndex(tmp_path / "index.sqlite", table="t", columns=("kind",))
    idx.add(_rows(2, "old"))
    with pytest.raises(RuntimeError), idx.transaction(bulk=True):
        idx.insert(_rows(50))
        raise RuntimeError("disk full")
    assert idx.db.execute("SELECT count(*) FROM t").fetchone() == (2,)
    assert idx.db.execute("PRAGMA synchronous").fetchone() == (2,)
    assert idx.db.execute("PRAGMA wal_autocheckpoint").fetchone() == (1000,)
    idx.add(_rows(1, "new"))  # the connection is still usable
    idx.close()


def test_a_new_index_keeps_more_pending_terms_before_writing_a_segment(tmp_path) -> None:
    from gateway.services.search_index import HASH_BYTES

    path = tmp_path / "index.sqlite"
    SearchIndex(path, table="t").close()
    idx = SearchIndex(path, table="t")  # opened again: the setting is kept, not written twice
    assert idx.db.execute("SELECT v FROM t_config WHERE k = 'hashsize'").fetchall() == [(HASH_BYTES,)]
    idx.close()
