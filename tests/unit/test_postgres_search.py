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


@pytest.mark.parametrize("where", [("", ()), ("src = ?", ("notes",))])
def test_the_same_top_results_as_sqlite(tmp_path: Path, postgres_dsn: str, where: tuple[str, tuple[Any, ...]]) -> None:
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    rows = _rows()
    lite = SearchIndex(tmp_path / "s.sqlite", table="t", columns=("src",))
    pg = storage.search_index(tmp_path / "unused.sqlite", "test", "", "t", ("src",))
    lite.add(rows)
    pg.add(rows)
    compared = 0
    for query in QUERIES:
        want = [h.key for h in lite.search(query, 5, *where)]
        got = [h.key for h in pg.search(query, 5, *where)]
        assert got == want, query
        compared += bool(want)
    assert compared >= (3 if where[0] else 8)  # the queries find something
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
