"""Starting and stopping an upstream's process, and starting every stdio upstream at once before the rest of
the gateway loads (`prestart`). Light on purpose: the standard library and anyio only, so `serve` can start
the upstreams before it imports the SDK (its import is most of the gateway's own start-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import anyio
from anyio.abc import Process

import gateway.compat as compat

if TYPE_CHECKING:
    from gateway.settings import ServerConfig

TERMINATION_GRACE = 2.0  # after stdin closes, before SIGTERM to the process group
KILL_GRACE = 2.0  # after SIGTERM, before SIGKILL
LOG_ROTATE_BYTES = 10 * 1024 * 1024
# what a server inherits of the gateway's environment: the SDK's stdio client's list
# (`mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS`, kept equal by a test; importing it loads the whole SDK)
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


def inherited_environment() -> dict[str, str]:
    """The variables a server inherits (a shell function's value, `()...`, is never passed on)."""
    return {k: v for k in INHERITED_ENV if (v := os.environ.get(k)) is not None and not v.startswith("()")}


def open_log(path: Path) -> IO[bytes]:
    """The server's stderr log, appended to (one older log kept past 10 MB)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
        path.replace(path.with_suffix(".log.1"))
    return open(path, "ab")


async def spawn(command: str, args: list[str], env: dict[str, str], cwd: str | None, errlog: IO[bytes]) -> Process:
    if sys.platform == "win32":  # pragma: no cover - Job Objects keep the tree together on Windows
        return await compat.windows_process(compat.windows_executable(command), args, env, errlog, cwd)
    # stdin is a fresh pipe: the child never inherits the gateway's own stdin (the host's protocol pipe).
    return await anyio.open_process(
        [command, *args], env=env, cwd=cwd, stdin=subprocess.PIPE, stderr=errlog, start_new_session=True
    )


async def stop(process: Process) -> None:
    """Close stdin, wait, SIGTERM the process group, wait, SIGKILL. Shielded and bounded."""
    with anyio.CancelScope(shield=True):
        if process.stdin is not None:
            with suppress(Exception):
                await process.stdin.aclose()
        with anyio.move_on_after(TERMINATION_GRACE):
            while process.returncode is None:
                await anyio.sleep(0.01)
        if process.returncode is None:
            await compat.terminate_process_tree(process, KILL_GRACE)
        with anyio.move_on_after(KILL_GRACE):
            while process.returncode is None:
                await anyio.sleep(0.01)
        with suppress(Exception):
            await process.aclose()


@dataclass
class Started:
    """A stdio upstream's process started ahead of its `Upstream` (which takes it for its first attempt)."""

    config: ServerConfig  # as expanded when started: taken only by an upstream still configured the same
    process: Process
    errlog: IO[bytes]
    mark: int  # the log's size before this process wrote to it

    async def aclose(self) -> None:
        await stop(self.process)
        self.errlog.close()


async def prestart(servers: dict[str, ServerConfig], log_dir: Path) -> dict[str, Started]:
    """Start every stdio server's process at once. One that cannot start here (a `${VAR}` not set, a
    command not found) is left out: its `Upstream` starts it as usual and reports why."""
    started: dict[str, Started] = {}

    async def one(name: str, config: ServerConfig) -> None:
        try:
            cfg = config.expanded()
            if not cfg.command:
                return
            errlog = open_log(log_dir / f"{name}.log")
        except Exception:
            return
        mark = errlog.tell()
        try:
            env = inherited_environment() | cfg.env
            process = await spawn(cfg.command, cfg.args, env, cfg.cwd or None, errlog)
        except Exception:
            errlog.close()
            return
        started[name] = Started(cfg, process, errlog, mark)

    async with anyio.create_task_group() as tg:
        for name, config in servers.items():
            tg.start_soon(one, name, config)
    return started
