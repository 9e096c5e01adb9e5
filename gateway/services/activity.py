"""When a host last started a tool call: background work that holds the GIL for a long moment (loading a
real tokenizer: ~0.2 s at a time in native code) waits for a pause between calls, as a model's turn gives
one, instead of stalling the calls in flight. A pause is only what the gateway sees: no call started
for `QUIET_SECONDS`; a call still running then (a slow upstream) may wait behind such work once."""

from __future__ import annotations

import threading
import time

QUIET_SECONDS = 0.5  # no call started for this long: a pause (a model writes for longer between calls)
_last_call = 0.0  # time.monotonic() of the last call started; read by other threads (a float: atomic)


def call_started() -> float:
    """A host's tool call starts now (every `ToolCall` says so as it is made); returns the time."""
    global _last_call
    _last_call = now = time.monotonic()
    return now


def wait_for_pause(at_most: float, stop: threading.Event | None = None) -> bool:
    """Block the calling thread (never the event loop's) until no call has started for `QUIET_SECONDS`,
    or `at_most` seconds have passed (calls back to back for that long: the work runs anyway); False
    when `stop` was set meanwhile."""
    stop = stop or threading.Event()
    deadline = time.monotonic() + at_most
    while (left := deadline - time.monotonic()) > 0:
        quiet = time.monotonic() - _last_call
        if quiet >= QUIET_SECONDS:
            return not stop.is_set()
        if stop.wait(min(left, QUIET_SECONDS - quiet)):
            return False
    return not stop.is_set()
