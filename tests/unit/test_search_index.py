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
    assert [h.key for h in index.search("deploy", where="kind = ?", params=("code",))] == []


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
