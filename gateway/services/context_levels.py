"""When to warn that the context window runs low, and how to say it (shared by the monitor plugin
and the `hook` command). Rules after the get-shit-done context monitor: WARNING at <= 35 %
remaining, CRITICAL at <= 25 %; the first warning at once, then at most one every 5 tool calls;
WARNING -> CRITICAL skips the wait. Advisory wording: users found imperative texts overriding
what they had asked for.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.services.files import VersionedCache

WARNING_AT = 35.0
CRITICAL_AT = 25.0
DEBOUNCE_CALLS = 5
STALE_SECONDS = 60.0
_SEVERITY = {None: 0, "WARNING": 1, "CRITICAL": 2}
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_BRIDGE_BYTES = 64 * 1024  # a statusline writes a few hundred bytes
# parsed bridge files by version: a look costs a stat, the file is read once per change
_BRIDGES: VersionedCache[Any] = VersionedCache(max_items=64)


def level_for(remaining_pct: float) -> str | None:
    if remaining_pct <= CRITICAL_AT:
        return "CRITICAL"
    if remaining_pct <= WARNING_AT:
        return "WARNING"
    return None


@dataclass
class Debounce:
    last_level: str | None = None
    calls_since: int = 0

    def should_warn(self, level: str | None) -> bool:
        """Count one tool call; True when a note should go out now."""
        self.calls_since += 1
        if level is None:
            self.last_level, self.calls_since = None, 0
            return False
        escalated = _SEVERITY[level] > _SEVERITY[self.last_level]
        if self.last_level is None or escalated or self.calls_since >= DEBOUNCE_CALLS:
            self.last_level, self.calls_since = level, 0
            return True
        return False

    def to_json(self) -> dict[str, Any]:
        return {"last_level": self.last_level, "calls_since": self.calls_since}

    @classmethod
    def from_json(cls, data: Any) -> Debounce:
        if not isinstance(data, dict) or data.get("last_level") not in _SEVERITY:
            return cls()
        calls = data.get("calls_since")
        return cls(data["last_level"], calls if isinstance(calls, int) and calls >= 0 else 0)


def note_text(level: str, remaining_pct: float, window: int | None, source: str) -> str:
    """The note appended to a tool result (<= 60 tokens); it names its level, and stays advisory."""
    size = f" of the {window // 1000}k-token window" if window else ""
    left = f"about {max(0, round(remaining_pct))}%{size} is left ({source})"
    if level == "CRITICAL":
        return (
            f"Context critical: only {left}. Consider saving what you still need with context_append, then "
            "context_compact, and keep tool results small."
        )
    return f"Context warning: {left}. Consider saving key facts with context_append and running context_compact."


def safe_session_id(session_id: Any) -> str | None:
    if not isinstance(session_id, str) or not _SAFE_ID.match(session_id) or ".." in session_id:
        return None
    return session_id


def bridge_path(session_id: str, folder: Path | None = None) -> Path:
    return (folder or Path(tempfile.gettempdir())) / f"claude-ctx-{session_id}.json"


@dataclass(frozen=True)
class HostFigure:
    """What a host reported about its own context: remaining %, and its window when it said so."""

    remaining_pct: float
    window: int | None = None


def _ours(st: os.stat_result) -> bool:
    """A regular file of this user, small enough to be a bridge: anything else in the shared temp folder
    (a FIFO, a device, a symlink, a huge file, another user's file) is never read."""
    owner = st.st_uid == os.geteuid() if hasattr(os, "geteuid") else True
    return stat.S_ISREG(st.st_mode) and owner and st.st_size <= MAX_BRIDGE_BYTES


def _read_bridge_bytes(path: Path) -> bytes | None:
    """The bytes of a bridge file, checked before it is opened (`lstat`) and again once open (`fstat`:
    the name may have been replaced meanwhile); opening never follows a symlink nor waits on a FIFO."""
    try:
        before = path.lstat()
        if not _ours(before):
            return None
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        opened = os.fstat(fd)
        if not _ours(opened) or (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            return None
        data = b""
        while len(data) <= MAX_BRIDGE_BYTES and (piece := os.read(fd, MAX_BRIDGE_BYTES + 1 - len(data))):
            data += piece
        return data if len(data) <= MAX_BRIDGE_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _bridge_data(path: Path) -> Any:
    """The JSON of a bridge file (None when it is not one of ours, or broken), parsed once per version."""

    def parse() -> Any:
        raw = _read_bridge_bytes(path)
        try:
            return None if raw is None else json.loads(raw.decode("utf-8"))
        except ValueError:
            return None

    try:
        st = path.lstat()
        if not _ours(st):
            return None
        return _BRIDGES.get(path, parse, sub=st.st_ino)
    except OSError:
        return None


def read_bridge_figure(path: Path, now: float | None = None, host: int | None = None) -> HostFigure | None:
    """The figure in a statusline bridge file, or None when missing, broken, stale or not a small regular
    file of this user; with `host`, also None unless that process is among the statusline command's
    ancestors (the host that ran it)."""
    data = _bridge_data(path)
    try:
        remaining = float(data["remaining_percentage"])
        stamp = float(data["timestamp"])
    except (ValueError, KeyError, TypeError):
        return None
    if stamp > 1e12:  # milliseconds
        stamp /= 1000
    if (now or time.time()) - stamp > STALE_SECONDS or not 0 <= remaining <= 100:
        return None
    ancestors = data.get("ancestors")
    if host is not None and (not isinstance(ancestors, list) or host not in ancestors):
        return None
    window = data.get("context_window_size")
    return HostFigure(remaining, window if isinstance(window, int) and window > 0 else None)


def read_bridge(path: Path, now: float | None = None) -> float | None:
    """`remaining_percentage` from a statusline bridge file, or None when missing, broken or stale."""
    figure = read_bridge_figure(path, now)
    return figure.remaining_pct if figure else None


def fresh_bridges(
    folder: Path | None = None, now: float | None = None, host: int | None = None
) -> list[tuple[str, HostFigure]]:
    """(session id, figure) of every fresh bridge file in the temp folder (with `host`: written under it)."""
    out = []
    for path in (folder or Path(tempfile.gettempdir())).glob("claude-ctx-*.json"):
        sid = path.name[len("claude-ctx-") : -len(".json")]
        if sid.endswith(".state") or safe_session_id(sid) is None:
            continue
        figure = read_bridge_figure(path, now, host)
        if figure is not None:
            out.append((sid, figure))
    return out


class HostBridge:
    """The host's own figure from a fresh statusline bridge file: the one CTX_HOST_SESSION_ID names, else
    the one a statusline command of this gateway's own host wrote (it records its ancestors; a stranger's
    figure never applies). Looked up at most once a second (listing the temp folder on every call cost
    more than the rest of the monitor). `host` None: no host is known (HTTP, or a gateway started from a
    terminal), so only CTX_HOST_SESSION_ID links a figure."""

    RECHECK_SECONDS = 1.0

    def __init__(self, host: int | None = None) -> None:
        self.host = host
        self._checked = -self.RECHECK_SECONDS
        self._value: HostFigure | None = None

    def current(self) -> HostFigure | None:
        now = time.monotonic()
        if now - self._checked < self.RECHECK_SECONDS:
            return self._value
        wanted = os.environ.get("CTX_HOST_SESSION_ID")
        if wanted:
            value = read_bridge_figure(bridge_path(wanted))
        elif self.host is not None:
            # one host, several sessions in a row (Claude Code's /clear): the newest file wins
            fresh = sorted(fresh_bridges(host=self.host), key=lambda f: _mtime(f[0]), reverse=True)
            value = fresh[0][1] if fresh else None
        else:
            value = None
        self._checked, self._value = now, value
        return value


def _mtime(session_id: str) -> float:
    try:
        return bridge_path(session_id).stat().st_mtime
    except OSError:
        return 0.0
