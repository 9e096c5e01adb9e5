"""After a large result the gateway gives the freed heap back to the system instead of keeping it."""

from __future__ import annotations

import pytest

from gateway.services import heap


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(heap._malloc_trim() is None, reason="not glibc: the heap is left to the allocator")
def test_freed_pages_go_back_to_the_system() -> None:
    pieces = [bytearray(4000) for _ in range(25_000)]  # ~100 MB in blocks the allocator keeps when freed
    for i in range(25_000):
        pieces[i][::512] = b"x" * len(pieces[i][::512])  # touched: resident
    kept = pieces[::100]  # a few survivors pin the heap's top: freeing the rest alone returns nothing
    del pieces
    before = _rss_mb()
    heap.give_back()
    assert _rss_mb() < before - 50, "the freed ~100 MB stayed in the heap"
    assert len(kept) == 250
