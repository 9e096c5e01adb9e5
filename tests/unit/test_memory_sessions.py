"""plugins.memory.sessions: two writers on one log (two gateways on one workspace, or two replicas on one
PostgreSQL) never fold a note twice; on either backend."""

from pathlib import Path
from typing import Any

import pytest

from gateway.services.storage import Storage
from plugins.memory.sessions import AlreadyFolded, RecallIndex, Session, SessionCache


def _session(storage: Any, folder: Path, name: str = "s") -> Session:
    return Session(name, storage.logs(folder, "memory", "").log(name))


def test_a_second_compaction_of_the_same_notes_is_refused(tmp_path: Path, storage: Any) -> None:
    first, second = _session(storage, tmp_path), _session(storage, tmp_path)  # two processes' views of one log
    for i in range(6):
        first.append_entry(f"note {i}", False)
    second.refresh()
    fold_a = first.active()[:4]
    fold_b = second.active()[:4]  # both decided to fold the same notes, then summarized (slowly)
    first.append_compaction("summary A", fold_a, "fallback")
    with pytest.raises(AlreadyFolded):
        second.append_compaction("summary B", fold_b, "fallback")
    second.refresh()
    summaries = [e for e in second.active() if e.kind == "summary"]
    assert [s.text for s in summaries] == ["summary A"] and len(second.active()) == 3


def test_ids_follow_every_writer_and_recall_finds_korean_and_identifiers(tmp_path: Path, storage: Any) -> None:
    first, second = _session(storage, tmp_path), _session(storage, tmp_path)
    assert not first.exists
    a = first.append_entry("세션을 저장하는 getUserName 함수", False)
    b = second.append_entry("the deploy runs on Friday", True)  # the other writer sees a's id first
    assert (a.id, b.id) == ("e00001", "e00002") and first.exists
    first.refresh()
    assert [e.id for e in first.active()] == ["e00001", "e00002"]
    index = RecallIndex(
        storage.search_index(
            tmp_path / "index.sqlite", "memory", "", RecallIndex.TABLE, RecallIndex.COLUMNS, RecallIndex.SCHEMA
        )
    )
    assert [k for k, _ in index.search(first, "세션", 5)] == ["e00001"]
    assert [k for k, _ in index.search(first, "user name", 5)] == ["e00001"]
    second.append_entry("Friday deploy moved to Monday", False)
    first.refresh()
    assert {k for k, _ in index.search(first, "deploy Friday", 5)} == {"e00002", "e00003"}
    index.index.close()


def test_the_cache_drops_the_least_recently_used_and_reads_them_back_whole(tmp_path: Path) -> None:
    """At most `count` sessions and `chars` characters held; one larger than that is never held; a dropped
    session comes back from its log with every note."""
    logs = Storage().logs(tmp_path, "memory", "")
    cache = SessionCache(count=2, chars=1_000)

    def get(name: str) -> Session:
        return cache.get(name, lambda: Session(name, logs.log(name)))

    for name in ("a", "b", "c"):
        get(name).append_entry(f"note of {name}", False)
    get("b")  # b used last: a goes next
    get("d").append_entry("x" * 2_000, False)  # over `chars` alone once written: not held past the call
    assert cache.settle() >= 2_000 and cache.settle() == 0
    assert len(cache) == 1 and cache.held_chars() <= 1_000
    for name in ("a", "b", "c"):
        assert [e.text for e in get(name).active()] == [f"note of {name}"]
    assert get("a").append_entry("second", False).id == "e00002" and len(get("d").active()) == 1
