"""Who started a process: its ancestors, and the host among them (the first that is not a wrapper).

A host's statusline figure must reach only the gateways that host started. The statusline command
records its ancestors; a gateway takes a figure only when its own host is among them. Linux reads
/proc, macOS asks `ps`; elsewhere nothing is known, and only CTX_HOST_SESSION_ID links the two sides.
Names are read as bytes and decoded leniently: Linux cuts a name at 15 bytes, which can split a UTF-8
character, and nothing read here may ever keep a gateway from starting (an unknown host is the answer).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DEPTH = 16
# Launchers between a host and the command it runs (`sh -c`, `npx`, `uvx`, ...): skipped to find the host.
WRAPPERS = {
    "sh", "bash", "dash", "zsh", "fish", "ksh", "env", "nohup", "timeout", "sudo", "doas", "cmd.exe",
    "npx", "npm", "node-gyp", "uv", "uvx", "pipx", "py", "pwsh", "powershell.exe", "xargs", "time",
}  # fmt: skip
# What starts everything in a session: never a host (its figure would reach every process under it).
NOT_HOSTS = {
    "init", "systemd", "launchd", "login", "sshd", "tmux", "tmux: server", "screen", "SCREEN", "su",
    "gnome-terminal-", "gnome-terminal", "konsole", "xterm", "alacritty", "kitty", "wezterm-gui",
    "Terminal", "iTerm2", "containerd-shim", "conmon", "tini", "dumb-init",
}  # fmt: skip


def _parent_linux(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split at the last ')'
        name = stat[stat.find(b"(") + 1 : stat.rfind(b")")].decode("utf-8", "replace")
        fields = stat[stat.rfind(b")") + 2 :].split()
        return int(fields[1]), name
    except (OSError, ValueError, IndexError):  # gone meanwhile, or a line of another shape
        return None


def _parent_ps(pid: int) -> tuple[int, str] | None:
    try:
        out = (
            subprocess.run(["ps", "-o", "ppid=,comm=", "-p", str(pid)], capture_output=True, timeout=2, check=False)
            .stdout.decode("utf-8", "replace")
            .strip()
        )
        ppid, _, comm = out.partition(" ")
        return int(ppid), os.path.basename(comm.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def ancestors(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, name) of each ancestor of `pid` (default: this process), nearest first; [] when unknown."""
    try:
        return _ancestors(pid)
    except Exception as exc:  # never a reason to fail a start or a hook
        log.warning("the process's ancestors cannot be read (%s); its host is taken as unknown", exc)
        return []


def _ancestors(pid: int | None) -> list[tuple[int, str]]:
    if sys.platform.startswith("linux"):
        parent_of = _parent_linux
    elif sys.platform == "darwin":
        parent_of = _parent_ps
    else:
        return []
    out: list[tuple[int, str]] = []
    found = parent_of(os.getpid() if pid is None else pid)
    for _ in range(MAX_DEPTH):
        if found is None or found[0] <= 0:
            break
        ppid = found[0]
        found = parent_of(ppid)  # the parent's own line: its name now, its parent on the next step
        out.append((ppid, found[1] if found else ""))
        if ppid == 1:
            break
    return out


def host_pid(chain: list[tuple[int, str]] | None = None) -> int | None:
    """The process that started this one through at most a few wrappers; None when that is a session's
    root (a terminal, tmux, sshd, init: anything started there would share it) or unknown."""
    for pid, name in chain if chain is not None else ancestors():
        if name in WRAPPERS:
            continue
        return None if pid == 1 or name in NOT_HOSTS else pid
    return None
