"""gateway.services.files: atomic writes leave no torn file; the cache follows the file's version."""

import os
import threading
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
