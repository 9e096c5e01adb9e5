"""After a large result the gateway gives the freed heap back to the system instead of keeping it; a
serving gateway's collector runs less often and no longer walks what it started with."""

from __future__ import annotations

import subprocess
import sys

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


@pytest.mark.skipif(heap._malloc_trim() is None, reason="not glibc: the heap is left to the allocator")
def test_give_back_soon_returns_the_pages_without_making_the_caller_wait() -> None:
    import time

    pieces = [bytearray(4000) for _ in range(25_000)]
    for i in range(25_000):
        pieces[i][::512] = b"x" * len(pieces[i][::512])
    kept = pieces[::100]
    del pieces
    before = _rss_mb()
    started = time.perf_counter()
    heap.give_back_soon()
    assert time.perf_counter() - started < heap.SETTLE_SECONDS  # asked, not done: the caller goes on
    deadline = time.monotonic() + 30  # polled: the pass runs in its own thread
    while _rss_mb() >= before - 50:
        assert time.monotonic() < deadline, "the freed ~100 MB stayed in the heap"
        time.sleep(0.05)
    assert len(kept) == 250


def test_a_serving_process_collects_less_and_freezes_what_it_started_with() -> None:
    """In a process of its own (what is frozen stays for the process's life): the thresholds are the
    serving ones; garbage already there is collected, not frozen; what was alive is frozen; an object
    frozen and dropped later is freed once a reload thaws it; garbage made later is collected."""
    script = (
        "import gc, weakref\n"
        "from gateway.services import heap\n"
        "class Node: pass\n"
        "heap.collect_less()\n"
        "dead, kept = Node(), Node(); dead.me = dead; kept.me = kept\n"
        "gone, held = weakref.ref(dead), weakref.ref(kept)\n"
        "del dead\n"
        "heap.serving()\n"
        "print(gc.get_threshold() == heap.YOUNG_THRESHOLDS, gone() is None, gc.get_freeze_count() > 1000)\n"
        "del kept\n"
        "gc.collect()\n"
        "print(held() is not None, heap.thaw(), heap.thaw())\n"
        "gc.collect()\n"
        "print(held() is None)\n"
        "a, b = Node(), Node(); a.other, b.other = b, a\n"
        "del a, b\n"
        "print(gc.collect() >= 2)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True", "True", "True", "True", "False", "True", "True"], out.stderr


def test_a_process_that_stopped_serving_leaves_nothing_for_the_last_passes() -> None:
    """The interpreter's last collections walked every object the gateway held (0.2-0.3 s of its exit,
    waited for by a host that starts a gateway per task): once serving stopped, what is alive is frozen,
    so those passes find nothing to walk; the young garbage is collected first (its finalizers run)."""
    script = (
        "import gc, sys\n"
        "from gateway.services import heap\n"
        "class Closing:\n"
        "    def __del__(self): print('finalized')\n"
        "held = [{'n': i, 'tags': [i]} for i in range(200_000)]\n"
        "dead = Closing(); dead.me = dead; del dead\n"
        "before = gc.get_freeze_count()\n"
        "heap.exiting()\n"
        "print(gc.get_freeze_count() - before >= 400_000, sum(gc.get_count()) < 100)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["finalized", "True", "True"], out.stderr


def test_what_the_imports_made_is_out_of_sight_before_the_first_results_passes() -> None:
    """In a process of its own: once a gateway's imports are done (`started`), the collector's passes
    walk only what came after them (a large result's `give_back` walked ~95,000 objects, 50-70 ms each,
    until `serving` froze them two seconds in); a reload can thaw them."""
    script = (
        "import gc\n"
        "import gateway.cli.serve, gateway.proxy.server, plugins.offload.plugin\n"
        "from gateway.services import heap\n"
        "walked = len(gc.get_objects())\n"
        "heap.started()\n"
        "print(walked > 50_000, len(gc.get_objects()) < walked // 20, heap.thaw(), len(gc.get_objects()) >= walked)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True", "True", "True"], out.stderr
