"""gateway.early: the enabled plugins' early callables run, chosen as plugins are; one failing stops none."""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

import pytest

from gateway import early

CALLED: list[str] = []


def first() -> None:
    CALLED.append("first")


def second() -> None:
    CALLED.append("second")


def broken() -> None:
    raise RuntimeError("no process to spare")


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    CALLED.clear()
    points = [
        importlib.metadata.EntryPoint(name, f"{__name__}:{name}", early.EARLY_GROUP)
        for name in ("first", "broken", "second")
    ]

    def entry_points(group: str) -> Any:
        return [ep for ep in points if ep.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_every_installed_plugin_starts_early_unless_disabled(installed: None) -> None:
    assert early.run(None, ["broken"]) == ["first", "second"] and CALLED == ["first", "second"]


def test_only_the_named_plugins_start_early(installed: None) -> None:
    assert early.run(["second"], []) == ["second"] and CALLED == ["second"]


def test_a_failing_early_start_is_logged_and_the_others_run(installed: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="gateway.plugins"):
        assert early.run(None, []) == ["first", "second"]
    assert "plugin broken: its early start failed" in caplog.text


def test_start_runs_them_in_a_thread_of_its_own(installed: None) -> None:
    thread = early.start(["first"], [])
    thread.join(10)
    assert not thread.is_alive() and thread.name == "plugins-early" and CALLED == ["first"]
