"""Files the gateway writes and reads back: one atomic writer, one cache keyed by file version."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("gateway.services.files")
FileVersion = tuple[str, int, int]
# Replicas on other machines may share the workspace folder: a temp file names its writer by pid and host,
# and one of another host (whose pids mean nothing here) is taken for left over only once it is this old
FOREIGN_STALE_SECONDS = 3600.0
_HOST = "".join(c for c in socket.gethostname() if c.isalnum())[:24] or "host"


def writer_tag() -> str:
    """This process, as temp and spill file names carry it (`<pid>~<host>`: no '.' or '-' in it)."""
    return f"{os.getpid()}~{_HOST}"


def temp_beside(path: Path, what: str = "") -> Path:
    """A temp file beside `path` of this process and thread (`.<name>[.<what>].<writer>.<thread>.tmp`): a
    start-up sweep knows by its name whether its writer is gone (`writer_gone`)."""
    middle = f".{what}" if what else ""
    return path.with_name(f".{path.name}{middle}.{writer_tag()}.{threading.get_ident()}.tmp")


# Every name `temp_beside` makes, and the names its users derive from one: numbered pieces (`.tmp.1`),
# DuckDB's log (`.tmp.wal`) and spill folder (`.tmp.tmp/`). `writer` is the tag `writer_gone` reads (a
# bare pid: older gateways).
TEMP_NAME = re.compile(r"^\..+\.(?P<writer>[0-9]+(?:~[A-Za-z0-9]+)?)\.[0-9]+\.tmp(?:\.[A-Za-z0-9]+)*$")


def temp_writer(name: str) -> str | None:
    """The writer tag of a temp name (`TEMP_NAME`), or None when `name` is not one."""
    found = TEMP_NAME.match(name)
    return found["writer"] if found else None


def remove_entry(path: Path) -> None:
    """Remove a file, a symlink (the link, never what it points to) or a folder with all it holds (symlinks
    inside are removed, not followed). Raises OSError naming the first entry that would not go (what
    could go is gone), FileNotFoundError when `path` itself was gone already (another sweep took it)."""
    if not stat.S_ISDIR(path.lstat().st_mode):
        path.unlink()
        return
    failed: list[BaseException] = []

    def note(_fn: Any, where: str, exc: Any) -> None:
        exc = exc if isinstance(exc, BaseException) else exc[1]  # onexc: the exception; onerror: exc_info
        if not isinstance(exc, FileNotFoundError) or where == os.fspath(path):
            failed.append(exc)

    # the fd-based walk: a symlink inside is unlinked, never entered; every entry that can go goes
    shutil.rmtree(path, **{"onexc" if sys.version_info >= (3, 12) else "onerror": note})
    if failed:
        raise failed[0]


def sweep_entry(path: Path) -> bool:
    """`remove_entry` for a sweep: whether it went. One that will not go is logged in one line and left,
    so that nothing a crash left behind can stop a start."""
    try:
        remove_entry(path)
    except FileNotFoundError:
        return False  # gone meanwhile (another gateway's sweep)
    except OSError as exc:
        inside = f" at {exc.filename}" if exc.filename and str(exc.filename) != str(path) else ""
        log.warning("cannot remove %s (%s%s); remove it by hand", path, exc.strerror or exc, inside)
        return False
    return True


def writer_gone(tag: str, path: Path) -> bool:
    """Whether the writer of a file named with `tag` is gone: on this host, its process has ended; on
    another (a replica sharing the folder), the file has not changed for FOREIGN_STALE_SECONDS. A bare
    pid is a file of this host (older gateways)."""
    pid, _, host = tag.partition("~")
    if not pid.isdigit():
        return True
    if host and host != _HOST:
        try:
            return time.time() - path.lstat().st_mtime > FOREIGN_STALE_SECONDS
        except OSError:
            return False  # gone already
    return int(pid) != os.getpid() and not process_alive(int(pid))


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs (files named after their writer's pid are its own)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (a number past any pid: none either)
        return False
    except (PermissionError, OSError):
        return True
    return True


def file_version(path: Path) -> FileVersion:
    """A cache key that changes when the file does (path, size, mtime)."""
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


def same_bytes(a: Path, b: Path, piece: int = 1024 * 1024, probe: int = 64 * 1024) -> bool:
    """Whether two files hold the same bytes: their sizes, then `probe` bytes at the start, the middle and
    the end (files that differ mostly differ there: a timestamp, a count), then side by side, a `piece`
    at a time."""
    size = a.stat().st_size
    if b.stat().st_size != size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for at in (0, size // 2, max(0, size - probe)):
            fa.seek(at)
            fb.seek(at)
            if fa.read(probe) != fb.read(probe):
                return False
        fa.seek(0)
        fb.seek(0)
        while True:
            x, y = fa.read(piece), fb.read(piece)
            if x != y:
                return False
            if not x:
                return True


def atomic_write(path: Path, data: bytes | str | Callable[[IO[bytes]], Any], *, sync: bool = True) -> int:
    """Write `path` through a temp file beside it and a rename: readers see the old file or the whole
    new one, never a torn one. `data` may be a function that writes to the open binary file (for
    payloads produced piece by piece). A failed write removes its temp file. Returns the size written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        with open(tmp, "wb") as fh:
            if callable(data):
                data(fh)
            else:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
            size = fh.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return size


class VersionedCache(Generic[T]):
    """A small LRU of values computed from files, keyed by file version (plus an optional sub-key), bounded
    by entry count and by the total size of the files behind them. Concurrent callers asking for the same
    key wait for one computation instead of repeating it. Thread-safe."""

    def __init__(self, max_items: int = 16, max_file_bytes: int | None = None):
        self.max_items = max_items
        self.max_file_bytes = max_file_bytes
        self._items: OrderedDict[tuple[FileVersion, Hashable], T] = OrderedDict()
        self._pending: dict[tuple[FileVersion, Hashable], threading.Event] = {}
        self._lock = threading.Lock()

    def peek(self, path: Path, sub: Hashable = None) -> T | None:
        key = (file_version(path), sub)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, path: Path, value: T, sub: Hashable = None) -> None:
        self._store((file_version(path), sub), value)

    def get(self, path: Path, compute: Callable[[], T], sub: Hashable = None) -> T:
        key = (file_version(path), sub)
        while True:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key]
                pending = self._pending.get(key)
                if pending is None:
                    self._pending[key] = threading.Event()
                    break
            pending.wait()
        try:
            value = compute()
            self._store(key, value)
            return value
        finally:
            with self._lock:
                self._pending.pop(key).set()

    def _store(self, key: tuple[FileVersion, Hashable], value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > 1 and (
                len(self._items) > self.max_items
                or (self.max_file_bytes is not None and sum(k[0][1] for k in self._items) > self.max_file_bytes)
            ):
                self._items.popitem(last=False)

    def forget(self, path: Path, sub: Hashable = None) -> None:
        """Drop the value of the file's current version (what it was computed from went bad)."""
        key = (file_version(path), sub)
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


# SHA-256 digests of files, as their writers computed them while writing (a saved result: its bytes
# hashed on their way to the disk): comparing two files' contents then reads neither
_DIGESTS: VersionedCache[str] = VersionedCache(max_items=4096)


def written_as(path: Path) -> list[int]:
    """What changes whenever a file's bytes may have: its inode and status-change time, besides the size and
    modification time a `FileVersion` holds (a file rewritten in place within one clock tick, or given
    its old time back, keeps those two; no call can set the status-change time)."""
    st = path.stat()
    return [st.st_ino, st.st_ctime_ns]


def remember_digest(path: Path, digest: str) -> None:
    """The SHA-256 (hex) of the file as just written, for `known_digest`."""
    _DIGESTS.put(path, digest, sub=tuple(written_as(path)))


def known_digest(path: Path) -> str | None:
    """The SHA-256 (hex) of this version of the file, if its writer told it (`remember_digest`) and the
    file was not written or touched since."""
    try:
        return _DIGESTS.peek(path, sub=tuple(written_as(path)))
    except OSError:  # gone
        return None


def move_aside(path: Path) -> Path:
    """A damaged SQLite file (and its WAL and shared-memory files) renamed out of the way, kept for a look."""
    target = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            part.replace(target.with_name(target.name + suffix))
    return target
