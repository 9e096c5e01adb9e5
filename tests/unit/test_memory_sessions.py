"""plugins.memory.sessions: two writers on one log (two gateways on one workspace) never fold a note twice."""

from pathlib import Path

import pytest

from plugins.memory.sessions import AlreadyFolded, Session


def test_a_second_compaction_of_the_same_notes_is_refused(tmp_path: Path) -> None:
    first, second = Session("s", tmp_path), Session("s", tmp_path)  # two processes' views of one log
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
