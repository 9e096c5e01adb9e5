"""The PostgreSQL search index ranks as SQLite's FTS5 does: the same top results on the same rows, for
English, code identifiers and Korean (the rows: this repository's own docs and the memory test notes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from memory_sessions import HELD_OUT, TUNING

from gateway.services.postgres import fts_tokens
from gateway.services.search_index import SearchIndex
from gateway.services.storage import Storage
from gateway.settings import StorageSettings

ROOT = Path(__file__).resolve().parent.parent.parent


def _rows() -> list[tuple[str, str, tuple[str]]]:
    rows = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for i, para in enumerate(p for p in doc.read_text(encoding="utf-8").split("\n\n") if p.strip()):
            rows.append((f"{doc.stem}:{i}", para, (doc.stem,)))
    for n, note in enumerate(TUNING + HELD_OUT):
        rows.append((f"note:{n}", note.text if hasattr(note, "text") else str(note), ("notes",)))
    return rows


QUERIES = [
    "offload a large result",
    "response_query DuckDB",
    "getUserName",
    "context window budget",
    "세션 메모리",
    "한국어 검색",
    "token estimate held out",
    "lean path stdio",
    "Streamable HTTP front bearer token",
    "deploy Friday",
]


def test_fts_tokens_are_fts5s() -> None:
    assert fts_tokens("getUserName snake_case Café 세션을, v2.1") == [
        "getusername",
        "snake_case",
        "cafe",
        "세션을",
        "v2",
        "1",
    ]


@pytest.mark.parametrize("match", [None, {"src": "notes"}])
def test_the_same_top_results_as_sqlite(tmp_path: Path, postgres_dsn: str, match: dict[str, Any] | None) -> None:
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    rows = _rows()
    lite = SearchIndex(tmp_path / "s.sqlite", table="t", columns=("src",))
    pg = storage.search_index(tmp_path / "unused.sqlite", "test", "", "t", ("src",))
    lite.add(rows)
    pg.add(rows)
    compared = 0
    for query in QUERIES:
        want = [h.key for h in lite.search(query, 5, match)]
        got = [h.key for h in pg.search(query, 5, match)]
        assert got == want, query
        compared += bool(want)
    assert compared >= (3 if match else 8)  # the queries find something
    lite.close()
    pg.close()


def test_namespaces_whose_names_look_alike_never_share_a_schema(tmp_path: Path, postgres_dsn: str) -> None:
    """`team-x` is shortened to `..._team_x_70466bce`; a token named `team_x_70466bce` (and `Alice` beside
    `alice`) keeps its notes to itself all the same."""
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    for one, other in (("team-x", "team_x_70466bce"), ("Alice", "alice")):
        storage.logs(tmp_path, "memory", one).log("plan").append([{"type": "entry", "text": f"secret of {one}"}])
        assert storage.logs(tmp_path, "memory", other).log("plan").read()[0] == []
        index = storage.search_index(tmp_path / "x", "documents", one, "chunk_index", ("doc",))
        index.add([("k", "only for one", ("d",))])
        theirs = storage.search_index(tmp_path / "x", "documents", other, "chunk_index", ("doc",))
        assert theirs.search("only for one") == []


def test_a_short_row_that_bm25_ranks_first_is_found_among_a_thousand_longer_ones(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """1,000 long rows hold the term three times, one short row once: FTS5's BM25 ranks the short row
    first (its length counts), ts_rank ranks it last. A search that first takes the best few hundred
    rows by ts_rank never sees it; every row with the term must be scored."""
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    filler = " ".join(f"word{i}" for i in range(400))
    rows = [(f"long:{i}", f"alpha {filler} alpha beta{i} alpha", ("x",)) for i in range(1000)]
    rows.append(("short", "alpha omega", ("x",)))
    lite = SearchIndex(tmp_path / "s.sqlite", table="t", columns=("src",))
    pg = storage.search_index(tmp_path / "unused.sqlite", "test", "", "t", ("src",))
    lite.add(rows)
    pg.add(rows)
    want = [h.key for h in lite.search("alpha", 3)]
    assert want[0] == "short"
    assert [h.key for h in pg.search("alpha", 3)] == want
    assert [h.key for h in pg.search("alpha", 3, {"src": "x"})] == want
    pg.delete({"key": "short"})
    lite.delete({"key": "short"})
    assert [h.key for h in pg.search("alpha", 3)] == [h.key for h in lite.search("alpha", 3)]
    lite.close()
    pg.close()


def _old_index(dsn: str, rows: str) -> str:
    """The table an earlier version wrote (a `tsvector` per row, no postings), filled by `rows` (SQL);
    its schema's name."""
    import psycopg

    from gateway.services.postgres import schema_name

    schema = schema_name("test", "")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}".t (key TEXT, src TEXT, body TEXT, extra TEXT, body_tokens INTEGER, '
            "extra_tokens INTEGER, tsv TSVECTOR)"
        )
        conn.execute(f'INSERT INTO "{schema}".t {rows}')
    return schema


def test_rows_written_before_the_postings_are_found(tmp_path: Path, postgres_dsn: str) -> None:
    """An index an earlier version wrote holds each row's `tsvector` only: opening it makes their postings."""
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    _old_index(
        postgres_dsn,
        "VALUES ('old:1', 'notes', 'getUserName fails', 'get user name', 2, 3, $$'getusername':1A 'fails':2A "
        "'get':3B 'user':4B 'name':5B$$), ('old:2', 'notes', 'name name', '', 2, 0, $$'name':1A,2A$$)",
    )
    pg = storage.search_index(tmp_path / "unused.sqlite", "test", "", "t", ("src",))
    lite = SearchIndex(tmp_path / "s.sqlite", table="t", columns=("src",))
    lite.add([("old:1", "getUserName fails", ("notes",)), ("old:2", "name name", ("notes",))])
    for query in ("user name", "getUserName", "fails"):
        assert [h.key for h in pg.search(query, 5)] == [h.key for h in lite.search(query, 5)], query
    pg.add([("new:1", "user name", ("notes",))])
    lite.add([("new:1", "user name", ("notes",))])
    assert [h.key for h in pg.search("user name", 5)] == [h.key for h in lite.search("user name", 5)]
    pg.close()
    lite.close()


def test_a_large_store_written_before_the_postings_opens_in_batches(tmp_path: Path, postgres_dsn: str) -> None:
    """Thousands of old rows: their postings are made a few hundred rows per transaction, each within the
    statement timeout (one statement for all of them was cancelled at 10 s, at every opening)."""
    import psycopg

    from gateway.services.postgres import BACKFILL_BATCH

    rows = 2 * BACKFILL_BATCH + 37
    schema = _old_index(
        postgres_dsn,
        "SELECT 'old:' || i, 'notes', 'common word' || i, '', 2, 0, ('common:1A word' || i || ':2A')::tsvector "
        f"FROM generate_series(1, {rows}) i",
    )
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    pg = storage.search_index(tmp_path / "unused.sqlite", "test", "", "t", ("src",))
    assert [h.key for h in pg.search("word777", 5)] == ["old:777"]
    assert len(pg.search("common", 2000)) == rows
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        left = conn.execute(f'SELECT count(*) FROM "{schema}".t WHERE tsv IS NOT NULL').fetchone()
    assert left == (0,)
    pg.close()
