"""Host-side stdio on POSIX pipes without a thread hop per message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from mcp.shared.message import SessionMessage

import gateway.compat as compat
from gateway.proxy.stdio_lines import (
    READ_CHUNK,
    Intercept,
    Send,
    Write,
    line_tap,
    pump_lines,
    pump_writes,
    stream_sinks,
)


@asynccontextmanager
async def pipe_stdio_server(
    lean: Callable[[Send, Write], Intercept] | None = None,
    worth: Callable[[bytes], bool] = lambda line: True,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """The host side of stdio without a thread per message (POSIX pipes, asyncio).

    The SDK's `stdio_server` reads and writes through worker threads, a thread hop per message in
    each direction, which is most of a small call's cost through the gateway (measured with py-spy).
    Like the SDK, it moves the protocol to private descriptors while serving: fd 0 reads /dev/null and
    fd 1 writes to stderr, so a stray print or a child process cannot corrupt the protocol.
    With `lean`, plain `tools/call` requests are taken off the line for the gateway's lean path, which
    answers them through the same writer (`proxy/lean.py`); `worth` tells on the bytes which lines
    may be for it.
    Raises ValueError when stdin/stdout are not pipes (then use the SDK's `stdio_server`).
    """
    import asyncio
    import os
    import stat

    for fd in (0, 1):
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
            raise ValueError("stdin/stdout are not pipes")
    in_fd, out_fd = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK)
    write_transport, write_protocol = await loop.connect_write_pipe(
        compat.write_pipe_protocol(), os.fdopen(out_fd, "wb", buffering=0)
    )
    send, write = stream_sinks(asyncio.StreamWriter(write_transport, write_protocol, None, loop))
    intercept: Intercept | None = None
    if lean is not None:  # the lean path's calls are taken as they arrive, before the pump's task wakes
        intercept = lean(send, write)
        reader.feed_data = line_tap(reader.feed_data, intercept, worth)  # type: ignore[method-assign]
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", buffering=0)
    )

    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump_lines, lambda: reader.read(READ_CHUNK), read_send, "host", send, None, intercept)
            tg.start_soon(pump_writes, write_recv, send)
            try:
                yield read_recv, write_send
            finally:
                await write_send.aclose()
                tg.cancel_scope.cancel()
    finally:
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
