"""A SIGHUP that arrives while the gateway starts: remembered, not the end of the process. Standard
library only, so `serve` can install it before anything slow is imported; the reloader applies it once
it listens (`reload.py`)."""

from __future__ import annotations

import signal
import sys
import threading

EARLY = threading.Event()


def hold() -> None:
    """From now until the reloader listens, a SIGHUP sets EARLY instead of ending the process."""
    if sys.platform != "win32":
        signal.signal(signal.SIGHUP, lambda *_: EARLY.set())


def let_go() -> None:
    """A command other than `serve`: SIGHUP ends it, as it ends any command (undoes `hold`)."""
    if sys.platform != "win32":
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
