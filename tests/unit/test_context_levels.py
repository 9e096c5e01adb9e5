"""gateway.services.context_levels: the get-shit-done thresholds and debounce, and bridge files."""

import json
import time
from pathlib import Path

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
