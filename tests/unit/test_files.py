"""gateway.services.files: atomic writes leave no torn file; the cache follows the file's version."""

import os
import threading
import time
from pathlib import Path

import pytest

from gateway.services.files import VersionedCache, atomic_write


def test_atomic_write_replaces_whole_and_cleans_up_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.json"
    assert atomic_write(target, "첫 번째") == len("첫 번째".encode())
    atomic_write(target, lambda fh: fh.write(b"second"))

    def broken(fh) -> None:
        fh.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(target, broken)
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]  # no temp file left behind


def test_cache_recomputes_when_the_file_changes_and_evicts(tmp_path: Path) -> None:
    cache: VersionedCache[str] = VersionedCache(max_items=2)
    path = tmp_path / "f.txt"
    path.write_text("one")
    calls = []

    def compute() -> str:
        calls.append(1)
        return path.read_text()

    assert cache.get(path, compute) == "one" and cache.get(path, compute) == "one" and len(calls) == 1
    path.write_text("two!")  # another size: another version
    os.utime(path, ns=(1, 1))
    assert cache.get(path, compute) == "two!" and len(calls) == 2
    for i in range(3):
        other = tmp_path / f"o{i}"
        other.write_text("x")
        cache.put(other, "x")
    assert cache.peek(path) is None  # evicted beyond max_items


def test_concurrent_callers_share_one_computation(tmp_path: Path) -> None:
    cache: VersionedCache[int] = VersionedCache()
    path = tmp_path / "f"
    path.write_text("x")
    started, release, calls = threading.Event(), threading.Event(), []

    def slow() -> int:
        calls.append(1)
        started.set()
        release.wait(5)
        return 42

    results = []
    first = threading.Thread(target=lambda: results.append(cache.get(path, slow)))
    first.start()
    started.wait(5)
    second = threading.Thread(target=lambda: results.append(cache.get(path, slow)))
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert results == [42, 42] and len(calls) == 1


def test_temp_files_of_a_replica_on_another_host_are_left_until_stale(tmp_path: Path) -> None:
    """Replicas on several machines share the workspace folder: a pid of another host means nothing here,
    so its temp file is taken for left over only once it has not changed for an hour."""
    from gateway.services.files import FOREIGN_STALE_SECONDS, writer_gone, writer_tag

    mine, dead_here = tmp_path / "mine", tmp_path / "dead"
    elsewhere, old_elsewhere = tmp_path / "elsewhere", tmp_path / "old"
    for path in (mine, dead_here, elsewhere, old_elsewhere):
        path.write_bytes(b"x")
    hour_ago = time.time() - FOREIGN_STALE_SECONDS - 5
    os.utime(old_elsewhere, (hour_ago, hour_ago))
    assert not writer_gone(writer_tag(), mine)
    assert writer_gone(f"999999999~{writer_tag().split('~')[1]}", dead_here)
    assert writer_gone("999999999", dead_here)  # an older gateway's name: a pid of this host
    assert not writer_gone(f"{os.getpid()}~otherhost", elsewhere)  # live, for all we can tell
    assert writer_gone("12~otherhost", old_elsewhere)
