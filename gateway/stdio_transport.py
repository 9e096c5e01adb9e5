"""A stdio client transport for upstreams that reads in linear time.

The SDK's `stdio_client` re-splits its whole buffer for every 64 KB chunk, so a 67 MB
JSON-RPC line costs minutes (mcp-sdk-2.3.md, pitfall 13). This one searches each chunk for a
newline once and joins a line's chunks once. It yields the same
`(read, write)` memory-stream pair, so `ClientSession` is unchanged.
"""

from __future__ import annotations

import codecs
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import IO, Any

import anyio
import mcp_types as types
from anyio.abc import Process
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

log = logging.getLogger(__name__)

TERMINATION_GRACE = 2.0  # after stdin closes, before SIGTERM to the process group
KILL_GRACE = 2.0  # after SIGTERM, before SIGKILL
READ_CHUNK = 1 << 20


async def pump_lines(
    receive: Callable[[], Awaitable[bytes]], read_send: anyio.abc.ObjectSendStream[SessionMessage | Exception]
) -> None:
    """Newline-delimited JSON-RPC from a byte source into a message stream, in linear time.

    Each chunk is searched for a newline once and decoded as it arrives; a line's pieces are joined
    once. Peak memory for a huge line is about twice its size (text + parsed value).
    """
    pending: list[str] = []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        async with read_send:
            while True:
                try:
                    chunk = await receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                    break
                if not chunk:  # EOF from an asyncio StreamReader
                    break
                begin = 0
                newline = chunk.find(b"\n")
                while newline >= 0:
                    pending.append(decoder.decode(chunk[begin:newline], final=True))
                    line = "".join(pending)
                    pending.clear()
                    if line.strip():
                        await read_send.send(_parse(line))
                    del line
                    begin = newline + 1
                    newline = chunk.find(b"\n", begin)
                if begin < len(chunk):
                    pending.append(decoder.decode(chunk[begin:] if begin else chunk))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass


async def pump_writes(
    write_recv: anyio.abc.ObjectReceiveStream[SessionMessage], send: Callable[[bytes], Awaitable[Any]]
) -> None:
    """Messages from a stream to a byte sink, one JSON line each."""
    async with write_recv:
        async for message in write_recv:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
            await send(data.encode("utf-8") + b"\n")


def _parse(line: str) -> SessionMessage | Exception:
    # json.loads + validate_python peaks at about half the memory of pydantic's validate_json on
    # large lines (measured: +109 MB vs +218 MB for a 57 MB line), and the strings are shared.
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(json.loads(line), by_name=False))
    except ValueError as exc:
        log.warning("upstream wrote a line that is not JSON-RPC: %r", line[:120])
        return exc


async def _spawn(command: str, args: list[str], env: dict[str, str], cwd: str | None, errlog: IO[bytes]) -> Process:
    if sys.platform == "win32":  # pragma: no cover - Job Objects keep the tree together on Windows
        from mcp.os.win32.utilities import create_windows_process, get_windows_executable_command

        command = get_windows_executable_command(command)
        return await create_windows_process(command, args, env, errlog, cwd)  # type: ignore[return-value]
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
            if sys.platform == "win32":  # pragma: no cover
                from mcp.os.win32.utilities import terminate_windows_process_tree

                await terminate_windows_process_tree(process)  # type: ignore[arg-type]
            else:
                from mcp.os.posix.utilities import terminate_posix_process_tree

                await terminate_posix_process_tree(process, KILL_GRACE)
        with anyio.move_on_after(KILL_GRACE):
            while process.returncode is None:
                await anyio.sleep(0.01)
        with suppress(Exception):
            await process.aclose()


@asynccontextmanager
async def linear_stdio_client(
    command: str,
    args: list[str],
    env: dict[str, str] | None,
    cwd: str | None,
    errlog: IO[bytes],
    on_exit: Callable[[], None] | None = None,
) -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """Start `command` and yield `(read, write)` streams for `ClientSession`.

    `on_exit` is called when the child's stdout ends (the child died or closed it), so the
    owner can reconnect instead of waiting for a call to fail.
    """
    process = await _spawn(command, args, get_default_environment() | (env or {}), cwd or None, errlog)
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)

    async def reader() -> None:
        assert process.stdout is not None
        try:
            await pump_lines(lambda: process.stdout.receive(READ_CHUNK), read_send)  # type: ignore[union-attr]
        finally:
            if on_exit is not None:
                on_exit()

    async def writer() -> None:
        assert process.stdin is not None
        try:
            await pump_writes(write_recv, process.stdin.send)  # type: ignore[union-attr]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_send.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_recv, write_send
        finally:
            with anyio.CancelScope(shield=True):
                await write_send.aclose()
                await _stop(process)
            tg.cancel_scope.cancel()


@asynccontextmanager
async def pipe_stdio_server() -> AsyncIterator[tuple[anyio.abc.ObjectReceiveStream, anyio.abc.ObjectSendStream]]:
    """The host side of stdio without a thread per message (POSIX pipes, asyncio).

    The SDK's `stdio_server` reads and writes through worker threads, a thread hop per message in
    each direction, which is most of a small call's cost through the gateway (measured with py-spy).
    Like the SDK, it moves the protocol to private descriptors while serving: fd 0 reads /dev/null and
    fd 1 writes to stderr, so a stray print or a child process cannot corrupt the protocol.
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
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", buffering=0)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(out_fd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)

    async def send(data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump_lines, lambda: reader.read(READ_CHUNK), read_send)
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
