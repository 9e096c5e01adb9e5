"""Giving memory back to the system after a large result.

A large result passes through the gateway as one string (its JSON-RPC line, then its text) and is freed
once written to a file; glibc's allocator keeps the freed pages in its heap, so the process would stay
tens of MB above idle until the next large result reuses them. `give_back` returns them at once (on
Linux with glibc; elsewhere it only collects garbage).
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def give_back() -> None:
    """Collect garbage and release the heap's free pages. Blocking (tens of ms for a large heap): call it
    from a worker thread."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
