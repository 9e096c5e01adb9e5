"""The collector's settings for a serving gateway, and giving memory back to the system after a large result.

A serving gateway holds ~110,000 objects from its imports (the SDK, pydantic's models) that live as long
as it does; the collector's full passes walked all of them again and again, and its young passes ran
every 700 allocations (`collect_less`, `serving`).

A large result passes through the gateway as one string (its JSON-RPC line, then its text) and is freed
once written to a file; glibc's allocator keeps the freed pages in its heap, so the process would stay
tens of MB above idle until the next large result reuses them. `give_back` returns them at once (on
Linux with glibc; elsewhere it only collects garbage).
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# young passes every 10,000 allocations net (CPython's default: 700): a small call allocates hundreds, so
# fewer passes find fewer of the calls in flight to promote; what is garbage is still found, a little later
YOUNG_THRESHOLDS = (10_000, 20, 20)
SETTLE_SECONDS = 0.3  # give_back_soon waits this long: the caller's reply is written and its text freed
FREEZE_AFTER = 2.0  # seconds after the upstreams started (or a reload) before `serving` runs its full pass
_frozen = False  # `serving` froze what was alive (and no reload thawed it since)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def collect_less() -> None:
    """The collector's thresholds for a process that serves (set before its imports: they run less often)."""
    gc.set_threshold(*YOUNG_THRESHOLDS)


def started() -> None:
    """What the imports made (the SDK, pydantic's models, the plugins) lives as long as the process: out of
    the collector's sight at once, without a pass, as the gateway starts serving. A full pass here finds
    ~20 unreachable objects of ~95,000 and takes 30-40 ms; until `serving` froze them, each large
    result's `give_back` walked them all (50-70 ms holding the GIL, on the next call). Thawed by a reload
    that drops upstreams (`thaw`), as `serving` is."""
    global _frozen
    gc.freeze()
    _frozen = True


def serving() -> None:
    """Everything alive once the gateway serves (its imports, settings, upstream sessions) is moved out of
    the collector's sight (`gc.freeze`), after one full pass (garbage is not frozen): it lives as long as
    the process, and later passes no longer walk it. What is frozen is never collected: so not in a
    process that builds gateways over and over (the tests), and thawed by a reload that drops upstreams
    (`thaw`). Blocks for one full pass (tens of ms): called a little after the start, not during it."""
    global _frozen
    gc.collect()
    gc.freeze()
    _frozen = True
    log.info("collector: %d objects alive at start frozen", gc.get_freeze_count())


def exiting() -> None:
    """The gateway has stopped serving and the process ends: what is alive is moved out of the collector's
    sight, so the interpreter's last passes do not walk it (they took 0.2-0.3 s of the exit of a gateway
    that served for less than `FREEZE_AFTER`, which a host starting one per task waits for). The young
    garbage is collected first (its finalizers run); files and connections were closed when serving
    stopped, and what else is alive goes with the process's memory."""
    gc.collect(1)
    gc.freeze()


def thaw() -> bool:
    """Give back to the collector what `serving` froze (a reload's replaced upstreams are garbage among
    it); True when anything was frozen, so that the caller freezes again once the new state is up."""
    global _frozen
    if not _frozen:
        return False
    gc.unfreeze()
    _frozen = False
    return True


def give_back() -> None:
    """Collect garbage and release the heap's free pages. Blocking (tens of ms for a large heap): call it
    from a worker thread."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_wanted = threading.Event()
_giver_lock = threading.Lock()
_giver: threading.Thread | None = None


def give_back_soon() -> None:
    """`give_back` in the background, shortly: after a large result the answer need not wait for it (a
    full collection takes tens of ms), its text is freed once the reply is written, and results close
    together share one pass. One thread in all, whoever asks."""
    global _giver
    with _giver_lock:
        _wanted.set()
        if _giver is None:
            _giver = threading.Thread(target=_give_back_when_wanted, name="heap-give-back", daemon=True)
            _giver.start()


def _give_back_when_wanted() -> None:
    while True:
        _wanted.wait()
        time.sleep(SETTLE_SECONDS)
        _wanted.clear()  # a wish made from here on gets a pass of its own
        give_back()
