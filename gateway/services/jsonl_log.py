"""Append-only JSONL logs: every acknowledged append is on disk; a torn last line is skipped.

A lock file serializes writers across processes (two gateways on one workspace), so appends
never interleave; readers need no lock.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.services.text import dumps

log = logging.getLogger("gateway.jsonl_log")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (created if missing), held for the block. Blocks until free."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if sys.platform == "win32":  # pragma: no cover
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if sys.platform != "win32":
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class JsonlLog:
    def __init__(self, path: Path):
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.damaged: list[bytes] = []  # complete lines that did not parse, in the order read

    @property
    def where(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.exists()

    def touch(self) -> None:
        """Create the log empty (an opened session with nothing written yet) if it is not there."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def append(self, records: Sequence[dict[str, Any]] | Callable[[], Sequence[dict[str, Any]]]) -> int:
        """Write the records in one write() under the lock, then fsync. Returns the new file size.

        `records` may be a function, called under the lock, so that ids can be assigned from the
        log as another process left it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.lock_path):
            rows = records() if callable(records) else records
            data = "".join(dumps(r) + "\n" for r in rows).encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and not self._ends_with_newline(size):
                    data = b"\n" + data  # a torn line stays alone on its line
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
                return size + len(data)
            finally:
                os.close(fd)

    def _ends_with_newline(self, size: int) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(size - 1)
            return fh.read(1) == b"\n"

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Records from byte offset `start`, and the offset after the last complete line."""
        if not self.path.exists():
            return [], 0
        with open(self.path, "rb") as fh:
            fh.seek(start)
            data = fh.read()
        records: list[dict[str, Any]] = []
        end = start
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last and line:  # no newline yet: a torn (or in-flight) last line
                log.warning("%s: skipping an incomplete last line (%d bytes)", self.path.name, len(line))
                break
            end += len(line) + (0 if last else 1)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("%s: skipping a damaged line at byte %d", self.path.name, end - len(line) - 1)
                self.damaged.append(line)
                continue
            if isinstance(record, dict):
                records.append(record)
        return records, end
