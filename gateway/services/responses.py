"""The responses store: the workspace folder of offloaded results. Results become files; ids and paths
the model passes resolve safely inside the folder. Offload writes here; documents reads from here;
`clean` empties it."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.services import spill
from gateway.services.files import atomic_write, remember_digest, sweep_entry, temp_writer, writer_gone

log = logging.getLogger("gateway.services.responses")
ID_PATTERN = re.compile(r"^resp_[0-9a-f]{8}$")
_SLICE = 1 << 20
UNTAGGED_TEMP = re.compile(r"^\..+\.tmp(?:\.[A-Za-z0-9]+)*$")
UNTAGGED_STALE_SECONDS = 600.0  # far longer than any query may run
TEXT_SUFFIXES = (".txt", ".md", ".csv", ".log")
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


RESPONSE_SCHEME = "gateway-response://"  # resources/read on the gateway serves saved results in pieces
PIECE_BYTES = 64 * 1024
MAX_PIECE_BYTES = 1024 * 1024


def response_uri(rid: str, offset: int = 0) -> str:
    return f"{RESPONSE_SCHEME}{rid}" + (f"?offset={offset}" if offset else "")


def read_piece(path: Path, offset: int, length: int) -> tuple[bytes, int, int]:
    """Bytes `offset`..`offset + length` of a saved file, moved to UTF-8 character boundaries (for a
    text file), with the start and end actually used."""
    size = path.stat().st_size
    start = min(max(0, offset), size)
    end = min(size, start + max(1, min(length, MAX_PIECE_BYTES)))
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start + 3)
    head = 0
    while head < min(3, len(data)) and 0x80 <= data[head] < 0xC0 and start + head < end:
        head += 1  # an offset inside a character: start at the next one
    cut = end - start
    if end < size:
        while cut > head and 0x80 <= data[cut] < 0xC0:
            cut -= 1  # end before a character that would be split
    return data[head:cut], start + head, start + cut


class StoreError(Exception):
    """A path or id the model gave that does not resolve; the message says what exists."""


def open_command(path: Path | str, platform: str = sys.platform) -> str:
    if platform == "darwin":
        return f"open {path}"
    if platform == "win32":
        return f'start "" "{path}"'
    return f"xdg-open {path}"


def host_platform(path: str) -> str:
    """The platform a host path belongs to, by its shape (a container cannot ask the host)."""
    if re.match(r"^[A-Za-z]:[\\/]", path):
        return "win32"
    return "darwin" if path.startswith("/Users/") else "linux"


def saved_kind(path: Path) -> str:
    """json, text or binary: what the exploring tools can do with a saved file."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "json"
    return "text" if suffix in TEXT_SUFFIXES else "binary"


def id_of(path: Path) -> str:
    """The fileRef id of a saved file (`fs__read-a1b2c3d4.json` -> `resp_a1b2c3d4`)."""
    return f"resp_{path.stem.rsplit('-', 1)[-1]}"


@dataclass
class Saved:
    id: str
    path: Path
    size: int
    kind: str  # json | text | binary
    mime: str = ""


def host_join(root: str, inner: Path) -> str:
    """`inner` below a host's folder, with that host's separator."""
    sep = "\\" if host_platform(root) == "win32" else "/"
    return root.rstrip("/\\") + "".join(sep + part for part in inner.parts)


def seen_on_host(host: str, workspace: Path, folder: Path) -> str:
    """A workspace folder as the host sees it (`workspace_on_host`: a container's bind mount), or ""."""
    return host_join(host, folder.relative_to(workspace)) if host else ""


class ResponseStore:
    def __init__(self, folder: Path, seen_as: str = ""):
        self.folder = folder
        self.seen_as = seen_as  # the folder as the host sees it (a container's bind mount), for openCmd

    def open_command(self, path: Path) -> str:
        """How the user opens a saved file: on the host's side of a container's bind mount when known."""
        if not self.seen_as or not path.is_relative_to(self.folder):
            return open_command(path)
        return open_command(host_join(self.seen_as, path.relative_to(self.folder)), host_platform(self.seen_as))

    def ensure(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def new_id(self) -> str:
        return f"resp_{secrets.token_hex(4)}"

    def _target(self, stem: str, rid: str, ext: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:80] or "result"
        return self.folder / f"{safe}-{rid.removeprefix('resp_')}.{ext}"

    def save_text(self, stem: str, text: str, kind: str) -> Saved:
        """Write text atomically (temp file + rename) in 1 MB slices: no second copy of a huge payload."""
        return self.save_chunks(stem, (text[i : i + _SLICE] for i in range(0, len(text), _SLICE)), kind)

    def save_chunks(self, stem: str, chunks: Any, kind: str) -> Saved:
        """Write text produced piece by piece (atomically); for results built while streaming."""
        rid = self.new_id()
        path = self._target(stem, rid, "json" if kind == "json" else "txt")
        digest = hashlib.sha256()

        def write(fh: Any) -> None:
            for chunk in chunks:
                data = chunk.encode("utf-8", "surrogatepass")
                fh.write(data)
                digest.update(data)

        atomic_write(path, write)
        remember_digest(path, digest.hexdigest())  # a result read again is told from it without reading either
        return Saved(rid, path, path.stat().st_size, kind, "application/json" if kind == "json" else "text/plain")

    def adopt(self, stem: str, part: spill.Spilled, kind: str) -> Saved:
        """A text or JSON the upstream reader already wrote to disk, moved here (not read again)."""
        rid = self.new_id()
        path = self._target(stem, rid, "json" if kind == "json" else "txt")
        size = spill.adopt(part, path)
        remember_digest(path, part.digest)  # the reader hashed its bytes as it wrote them
        return Saved(rid, path, size, kind, "application/json" if kind == "json" else "text/plain")

    def save_base64(self, stem: str, data: str | bytes, mime: str) -> Saved:
        """An image, audio clip or blob as the decoded file, named by its MIME type."""
        rid = self.new_id()
        payload = base64.b64decode(data)
        path = self._target(stem, rid, MIME_EXT.get(mime, "bin"))
        atomic_write(path, payload)
        remember_digest(path, hashlib.sha256(payload).hexdigest())
        return Saved(rid, path, len(payload), "binary", mime)

    # -- resolving what the model passes --------------------------------------------------

    def ids(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        files = sorted(
            (p for p in self.folder.iterdir() if p.is_file() and not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        return [id_of(p) for p in files if "-" in p.stem]

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
            return self._confined(matches[0], ref)  # an id names a file too: the same checks as a path
        candidate = Path(ref).expanduser()
        if not candidate.is_absolute():
            candidate = self.folder / candidate
        return self._confined(candidate, ref)

    def _confined(self, candidate: Path, ref: str) -> Path:
        """The real file behind `candidate`, if it lies inside the responses folder and is not a temp file."""
        try:
            real = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            raise StoreError(self._missing(f"{ref} does not exist")) from None
        if real.name.startswith("."):  # a write in progress (or left by a crash): never served
            raise StoreError(self._missing(f"{ref} is not a saved response"))
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

    def clear(self) -> int:
        """Remove every saved response (the `clean` command); returns how many entries went."""
        return sum(sweep_entry(item) for item in self._entries())

    def remove_stale_temp_files(self) -> int:
        """What a crash left: temp files and folders whose writer is gone (a gateway killed mid-offload, a
        conversion's scratch pieces and DuckDB files, a query's spill folder). An entry that will not go
        is logged in one line and left; the sweep goes on."""
        return sum(sweep_entry(item) for item in self._entries() if _stale_temp(item))

    def remove_older_than(self, hours: float) -> int:
        """Entries (files and folders) unchanged for `hours`; symlinks are removed, never followed. A hidden
        entry named after a result (`.<result>.duckdb`: its tables) goes by its result's age while the
        result is there: with it, never before it (a tables file shared with an earlier result keeps
        that result's time)."""
        cutoff = time.time() - hours * 3600
        entries = self._entries()
        results = {item.name: item for item in entries if not item.name.startswith(".")}
        # every age read before anything goes: a result removed first would make its tables look new
        old = [item for item in entries if _changed_at(_owner(item, results) or item) < cutoff]
        return sum(sweep_entry(item) for item in old)

    def _entries(self) -> list[Path]:
        try:
            return list(self.folder.iterdir()) if self.folder.is_dir() else []
        except OSError as exc:
            log.warning("cannot list %s (%s); nothing removed from it", self.folder, exc.strerror or exc)
            return []


def _owner(item: Path, results: dict[str, Path]) -> Path | None:
    """The result a hidden entry beside it belongs to (`.<result name>.<what>`), if it is there."""
    if not item.name.startswith("."):
        return None
    parts = item.name[1:].split(".")
    for end in range(len(parts) - 1, 0, -1):
        if (owner := results.get(".".join(parts[:end]))) is not None:
            return owner
    return None


def _changed_at(item: Path) -> float:
    try:
        return item.lstat().st_mtime
    except OSError:
        return time.time()  # gone: nothing to remove


def _stale_temp(item: Path) -> bool:
    """Whether a hidden entry is a temp entry left by a writer that is gone. One without a writer in its
    name (DuckDB's spill folder of a query, `.<result>.duckdb.tmp/`) may belong to another gateway sharing
    the folder: it is left over once unchanged for UNTAGGED_STALE_SECONDS."""
    if (tag := temp_writer(item.name)) is not None:
        return writer_gone(tag, item)
    if UNTAGGED_TEMP.match(item.name):
        return time.time() - _changed_at(item) > UNTAGGED_STALE_SECONDS
    return False
