"""gateway.services.context_levels: the get-shit-done thresholds and debounce, and bridge files."""

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.services.context_levels import Debounce, HostFigure, fresh_bridges, level_for, note_text, read_bridge
from gateway.services.tokens import estimate_tokens


def test_levels() -> None:
    assert [level_for(p) for p in (80, 35, 30, 25, 0)] == [None, "WARNING", "WARNING", "CRITICAL", "CRITICAL"]


def test_first_warning_at_once_then_every_five_calls_and_escalation_skips_the_wait() -> None:
    d = Debounce()
    warned = [d.should_warn("WARNING") for _ in range(7)]
    assert warned == [True, False, False, False, False, True, False]
    assert d.should_warn("CRITICAL")  # escalation: at once
    assert not d.should_warn(None) and d.should_warn("WARNING")  # back to ok resets


def test_notes_are_short() -> None:
    for level in ("WARNING", "CRITICAL"):
        assert estimate_tokens(note_text(level, 20, 8192, "gateway estimate: tool traffic only")) <= 60


def test_bridge_files(tmp_path: Path) -> None:
    good = tmp_path / "claude-ctx-s1.json"
    good.write_text(json.dumps({"remaining_percentage": 30, "timestamp": time.time() * 1000}))
    stale = tmp_path / "claude-ctx-s2.json"
    stale.write_text(json.dumps({"remaining_percentage": 30, "timestamp": time.time() - 600}))
    (tmp_path / "claude-ctx-s3.json").write_text("{broken")
    assert read_bridge(good) == 30 and read_bridge(stale) is None
    assert fresh_bridges(tmp_path) == [("s1", HostFigure(30.0, None))]


def _within(seconds: float, fn: Any) -> Any:
    """`fn()`, which must return within `seconds` (a thread of its own: a read blocked on a FIFO would
    hang the test for good)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out[0]


def _fresh(remaining: float = 20) -> str:
    return json.dumps({"remaining_percentage": remaining, "timestamp": time.time()})


def test_a_bridge_file_over_64_kb_is_never_read(tmp_path: Path) -> None:
    """A statusline writes a few hundred bytes; a bigger file (a valid figure padded, or a 400 MB sparse
    file that took seconds per call to read) is ignored by its size, before it is opened."""
    padded = tmp_path / "claude-ctx-padded.json"
    padded.write_text(_fresh() + " " * 100_000)  # valid JSON all the same
    sparse = tmp_path / "claude-ctx-sparse.json"
    with open(sparse, "wb") as fh:
        fh.write(_fresh().encode())
        fh.truncate(400 * 1024 * 1024)
    small = tmp_path / "claude-ctx-small.json"
    small.write_text(_fresh(30))
    assert read_bridge(padded) is None and read_bridge(sparse) is None and read_bridge(small) == 30
    assert fresh_bridges(tmp_path) == [("small", HostFigure(30.0, None))]


def test_a_bridge_file_of_another_user_or_not_a_file_is_ignored(tmp_path: Path) -> None:
    """Another local user cannot set this user's window: their file (same name, same temp folder) is
    ignored, and so are a FIFO (opening it would wait for a writer for good), a folder and a symlink."""
    theirs = tmp_path / "claude-ctx-theirs.json"
    theirs.write_text(_fresh())
    if os.geteuid() == 0:
        os.chown(theirs, 54321, 54321)
    else:
        pytest.skip("giving a file to another user needs root")
    os.mkfifo(tmp_path / "claude-ctx-fifo.json")
    (tmp_path / "claude-ctx-folder.json").mkdir()
    mine = tmp_path / "mine.json"
    mine.write_text(_fresh(40))
    (tmp_path / "claude-ctx-link.json").symlink_to(mine)
    assert read_bridge(theirs) is None and read_bridge(tmp_path / "claude-ctx-link.json") is None
    assert _within(10, lambda: read_bridge(tmp_path / "claude-ctx-fifo.json")) is None
    assert _within(10, lambda: fresh_bridges(tmp_path)) == []
    os.chown(theirs, os.geteuid(), os.getegid())
    assert read_bridge(theirs) == 20  # the same file, once it is this user's
