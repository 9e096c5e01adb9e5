"""The response workspace: oversized results become files; ids and paths resolve safely."""

from __future__ import annotations

import base64
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ID_PATTERN = re.compile(r"^resp_[0-9a-f]{8}$")
_SLICE = 1 << 20
MIME_EXT = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/svg+xml": "svg",
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/mpeg": "mp3",
    "audio/ogg": "ogg",
    "application/pdf": "pdf",
    "application/json": "json",
    "text/plain": "txt",
    "text/markdown": "md",
    "text/csv": "csv",
}


def file_version(path: Path) -> tuple[str, int, int]:
    """A cache key that changes when the file does (path, size, mtime)."""
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


class StoreError(Exception):
    """A path or id the model gave that does not resolve; the message says what exists."""


def open_command(path: Path) -> str:
    if sys.platform == "darwin":
        return f"open {path}"
    if sys.platform == "win32":
        return f'start "" "{path}"'
    return f"xdg-open {path}"


def utf8_size(text: str) -> int:
    """Byte length of `text` as UTF-8, without one big copy."""
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + _SLICE].encode("utf-8", "surrogatepass")) for i in range(0, len(text), _SLICE))


@dataclass
class Saved:
    id: str
    path: Path
    size: int
    kind: str  # json | text | binary
    mime: str = ""


class ResponseStore:
    def __init__(self, folder: Path):
        self.folder = folder

    def ensure(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def new_id(self) -> str:
        return f"resp_{secrets.token_hex(4)}"

    def _target(self, stem: str, rid: str, ext: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:80] or "result"
        return self.folder / f"{safe}-{rid.removeprefix('resp_')}.{ext}"

    def save_text(self, stem: str, text: str, kind: str) -> Saved:
        """Write text atomically (temp file + rename) in 1 MB slices: no second copy of a huge payload."""
        rid = self.new_id()
        path = self._target(stem, rid, "json" if kind == "json" else "txt")
        self._atomic(
            path,
            lambda fh: [
                fh.write(text[i : i + _SLICE].encode("utf-8", "surrogatepass")) for i in range(0, len(text), _SLICE)
            ],
        )
        return Saved(rid, path, path.stat().st_size, kind, "application/json" if kind == "json" else "text/plain")

    def save_chunks(self, stem: str, chunks: Any, kind: str) -> Saved:
        """Write text produced piece by piece (atomically); for results built while streaming."""
        rid = self.new_id()
        path = self._target(stem, rid, "json" if kind == "json" else "txt")
        self._atomic(path, lambda fh: [fh.write(c.encode("utf-8", "surrogatepass")) for c in chunks])
        return Saved(rid, path, path.stat().st_size, kind, "application/json" if kind == "json" else "text/plain")

    def save_bytes(self, stem: str, data: str | bytes, mime: str, *, is_base64: bool = True) -> Saved:
        rid = self.new_id()
        payload = base64.b64decode(data) if is_base64 else (data if isinstance(data, bytes) else data.encode())
        path = self._target(stem, rid, MIME_EXT.get(mime, "bin"))
        self._atomic(path, lambda fh: fh.write(payload))
        return Saved(rid, path, len(payload), "binary", mime)

    def _atomic(self, path: Path, write: Any) -> None:
        self.ensure()
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # -- resolving what the model passes --------------------------------------------------

    def ids(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        files = sorted(
            (p for p in self.folder.iterdir() if p.is_file() and not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        return [f"resp_{p.stem.rsplit('-', 1)[-1]}" for p in files if "-" in p.stem]

    def resolve(self, ref: Any) -> Path:
        """A fileRef id or a path that resolves (after symlinks) inside the responses folder."""
        if not isinstance(ref, str) or not ref.strip():
            raise StoreError(self._missing("`path` must be a fileRef id (resp_...) or a file path"))
        ref = ref.strip()
        if "\x00" in ref:
            raise StoreError("`path` contains a NUL byte")
        if ID_PATTERN.match(ref):
            matches = list(self.folder.glob(f"*-{ref.removeprefix('resp_')}.*")) if self.folder.is_dir() else []
            matches = [m for m in matches if not m.name.startswith(".")]
            if not matches:
                raise StoreError(self._missing(f"no offloaded response has the id {ref} (it may have expired)"))
            return matches[0]
        candidate = Path(ref).expanduser()
        if not candidate.is_absolute():
            candidate = self.folder / candidate
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            raise StoreError(self._missing(f"{ref} does not exist")) from None
        root = self.folder.resolve()
        if not real.is_relative_to(root) or real == root:
            raise StoreError(
                self._missing(
                    f"{ref} is outside the response workspace {root}; only offloaded responses can be explored"
                )
            )
        if not real.is_file():
            raise StoreError(self._missing(f"{ref} is not a file"))
        return real

    def _missing(self, what: str) -> str:
        ids = self.ids()[:8]
        known = ", ".join(ids) if ids else "none yet"
        return f"{what}. Known response ids (newest first): {known}."

    def remove_older_than(self, hours: float) -> int:
        if not self.folder.is_dir():
            return 0
        cutoff = time.time() - hours * 3600
        removed = 0
        for item in self.folder.iterdir():
            try:
                if item.is_file() and item.stat().st_mtime < cutoff:
                    item.unlink()
                    removed += 1
            except OSError:
                continue
        return removed
