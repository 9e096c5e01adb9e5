"""Upstream stdio: start a server process and talk to it through the linear-time line pumps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import IO

import anyio
from anyio.abc import Process
from mcp.shared.message import SessionMessage

import gateway.compat as compat
from gateway.proxy.lean import RawRequests
from gateway.proxy.stdio_lines import READ_CHUNK, line_tap, pump_lines, pump_writes
from gateway.proxy.upstream_spawn import inherited_environment, spawn, stop
from gateway.services.spill import Spiller


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
    process: Process | None = None,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """Start `command` and yield `(read, write)` streams for `ClientSession`.

    `on_exit` is called when the child's stdout ends (the child died or closed it), so the
    owner can reconnect instead of waiting for a call to fail. `on_bytes` is called whenever bytes come
    from the child (any read, whole lines or not: a sign of life). With `spiller`, long lines are spooled
    to disk as they arrive (bounded memory for huge results). With `raw`, requests can also be written
    beside the SDK's session (the lean path) and their replies are taken off the line for it. `process`:
    one already started with these arguments (`upstream_spawn.prestart`), taken instead of starting one.
    """
    if process is None:
        process = await spawn(command, args, inherited_environment() | (env or {}), cwd or None, errlog)
    compat.direct_pipe_reads(process)
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
                await stop(process)
            tg.cancel_scope.cancel()
