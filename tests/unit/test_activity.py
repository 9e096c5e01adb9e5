"""A pause between a host's calls, as background work that holds the GIL waits for one."""

from __future__ import annotations

import threading
import time
from typing import Any

from gateway.services import activity


def test_a_pause_comes_only_once_calls_stop_starting(host_calls: Any) -> None:
    done = host_calls(0.05)
    threading.Timer(0.8, done.set).start()
    began = time.monotonic()
    assert activity.wait_for_pause(at_most=10)
    waited = time.monotonic() - began
    assert done.is_set() and waited >= 0.8 + activity.QUIET_SECONDS - 0.1


def test_calls_back_to_back_wait_at_most_as_long_as_asked(host_calls: Any) -> None:
    host_calls(0.05)
    began = time.monotonic()
    assert activity.wait_for_pause(at_most=0.7)  # the work runs anyway
    assert 0.6 <= time.monotonic() - began < 5


def test_a_stop_ends_the_wait(host_calls: Any) -> None:
    host_calls(0.05)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    assert not activity.wait_for_pause(at_most=10, stop=stop)
    assert time.monotonic() - began < 5


def test_a_call_records_when_it_started() -> None:
    from gateway.plugin import ToolCall

    before = time.monotonic()
    call = ToolCall(name="t", arguments={})
    assert before <= call.started <= time.monotonic()
    assert time.monotonic() - call.started < activity.QUIET_SECONDS  # no pause right after a call started
