"""Upstream stdio: start a server process and talk to it through the linear-time line pumps."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import IO

import anyio
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

import gateway.compat as compat
from gateway.proxy.lean import RawRequests
from gateway.proxy.stdio_lines import READ_CHUNK, line_tap, pump_lines, pump_writes
from gateway.services.spill import Spiller

TERMINATION_GRACE = 2.0  # after stdin closes, before SIGTERM to the process group
KILL_GRACE = 2.0  # after SIGTERM, before SIGKILL


async def _spawn(command: str, args: list[str], env: dict[str, str], cwd: str | None, errlog: IO[bytes]) -> Process:
    if sys.platform == "win32":  # pragma: no cover - Job Objects keep the tree together on Windows
        return await compat.windows_process(compat.windows_executable(command), args, env, errlog, cwd)
    # stdin is a fresh pipe: the child never inherits the gateway's own stdin (the host's protocol pipe).
    return await anyio.open_process(
        [command, *args], env=env, cwd=cwd, stdin=subprocess.PIPE, stderr=errlog, start_new_session=True
    )


async def _stop(process: Process) -> None:
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


def _heard_first(feed: Callable[[bytes], None], heard: Callable[[], None]) -> Callable[[bytes], None]:
    """A stream reader's `feed_data` that reports each read as it arrives (before the line tap takes it)."""

    def fed(data: bytes) -> None:
        heard()
        feed(data)

    return fed


@asynccontextmanager
async def linear_stdio_client(
    command: str,
    args: list[str],
    env: dict[str, str] | None,
    cwd: str | None,
    errlog: IO[bytes],
    on_exit: Callable[[], None] | None = None,
    on_bytes: Callable[[], None] | None = None,
    spiller: Spiller | None = None,
    raw: RawRequests | None = None,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """Start `command` and yield `(read, write)` streams for `ClientSession`.

    `on_exit` is called when the child's stdout ends (the child died or closed it), so the
    owner can reconnect instead of waiting for a call to fail. `on_bytes` is called whenever bytes come
    from the child (any read, whole lines or not: a sign of life). With `spiller`, long lines are spooled
    to disk as they arrive (bounded memory for huge results). With `raw`, requests can also be written
    beside the SDK's session (the lean path) and their replies are taken off the line for it.
    """
    process = await _spawn(command, args, get_default_environment() | (env or {}), cwd or None, errlog)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
    send, write = compat.direct_sinks(process.stdin)

    stdout = compat.stream_reader(process.stdout)

    async def receive() -> bytes:
        chunk = await process.stdout.receive(READ_CHUNK)  # type: ignore[union-attr]
        if on_bytes is not None and stdout is None:  # else heard as the bytes arrive (below)
            on_bytes()
        return chunk

    async def reader() -> None:
        assert process.stdout is not None
        try:
            await pump_lines(
                receive,
                read_send,
                spiller=spiller,
                intercept=raw.intercept if raw is not None else None,
            )
        finally:
            if raw is not None:
                raw.detach()
            if on_exit is not None:
                on_exit()

    async def writer() -> None:
        assert process.stdin is not None
        try:
            await pump_writes(write_recv, send)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()

    if raw is not None:
        raw.attach(send, write)
        if stdout is not None:  # its replies taken as they arrive
            stdout.feed_data = line_tap(stdout.feed_data, raw.intercept, raw.worth)
    if on_bytes is not None and stdout is not None:
        stdout.feed_data = _heard_first(stdout.feed_data, on_bytes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            if raw is not None:
                raw.detach()
            with anyio.CancelScope(shield=True):
                await write_send.aclose()
                await _stop(process)
            tg.cancel_scope.cancel()
