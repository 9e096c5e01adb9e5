"""Newline-delimited JSON-RPC over byte pipes, in linear time: the line pumps both stdio sides share.

The SDK's `stdio_client` re-splits its whole buffer for every 64 KB chunk, so a 67 MB JSON-RPC
line costs minutes. These pumps search each chunk for a newline once and join a line's chunks
once, and feed the same `(read, write)` memory-stream pair the SDK uses, so `ClientSession` and
`Server` are unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic_core import PydanticSerializationError

from gateway.services.json_wire import line as json_line
from gateway.services.json_wire import loads
from gateway.services.spill import LineBuffer, Spiller

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20


Send = Callable[[bytes], Awaitable[Any]]  # a byte sink: writes one whole line
Write = Callable[[bytes], bool]  # the same sink without waiting: False (nothing written) when the peer is behind
WRITE_BEHIND = 1 << 20  # bytes waiting in a pipe's buffer past which `Write` declines (a `Send` waits instead)
Intercept = Callable[[Any], bool]  # takes a decoded JSON-RPC message off the line before the SDK parses it


async def pump_lines(
    receive: Callable[[], Awaitable[bytes]],
    read_send: anyio.abc.ObjectSendStream[SessionMessage | Exception],
    peer: str = "upstream",
    reply: Send | None = None,
    spiller: Spiller | None = None,
    intercept: Intercept | None = None,
) -> None:
    """Newline-delimited JSON-RPC from a byte source into a message stream, in linear time.

    Each chunk is searched for a newline once; a line's pieces are joined once. Peak memory for a huge
    line is about twice its size (text + parsed value) — unless a `spiller` is given: a line longer
    than its threshold is written to a spool file as it arrives and read back with its long strings
    left on disk (see `gateway.services.spill`). `peer` names the other side in the log. With `reply`,
    a request that is not valid JSON-RPC is answered at once with the JSON-RPC error (the SDK would
    only log it, and the sender would wait forever). With `intercept`, each decoded message is offered
    to it first, and one it takes (returns True for) never reaches the SDK (the lean path, `proxy/lean.py`).
    """
    line = LineBuffer(spiller)
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
                    line.add(chunk[begin:newline])
                    done = line.take()
                    if not isinstance(done, bytes):  # spooled
                        message, raw = await _read_spool(spiller, done, peer, intercept)  # type: ignore[arg-type]
                    else:
                        text = done.decode("utf-8", "replace")
                        message, raw = _parse(text, peer, intercept) if text.strip() else (None, None)
                        del text
                    del done
                    if message is not None:
                        answer = error_reply(raw, message) if reply is not None else None
                        if answer is not None:
                            await reply(answer)
                        else:
                            await read_send.send(message)
                    del message, raw
                    begin = newline + 1
                    newline = chunk.find(b"\n", begin)
                if begin < len(chunk):
                    line.add(chunk[begin:] if begin else chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        line.discard()  # the stream ended mid-line: nobody will read this


async def _read_spool(
    spiller: Spiller, spool: BinaryIO, peer: str, intercept: Intercept | None = None
) -> tuple[SessionMessage | Exception | None, Any]:
    """The message of a spooled line (read in a worker thread); the spool file is removed."""
    path = Path(spool.name)
    spool.close()
    try:
        raw = await anyio.to_thread.run_sync(spiller.read, path)
    except (ValueError, OSError) as exc:
        log.warning("the %s sent a long line that is not JSON (%s)", peer, exc)
        return exc, _NOT_JSON
    finally:
        path.unlink(missing_ok=True)
    if intercept is not None and intercept(raw):
        return None, None
    return _validate(raw, peer, lambda: "<a long line>")


TAP_LIMIT = 1 << 16  # bytes: larger reads go to the pump as they are (long lines, spooling)


def line_tap(
    feed: Callable[[bytes], None], intercept: Intercept, worth: Callable[[bytes], bool]
) -> Callable[[bytes], None]:
    """A stream reader's `feed_data` that first offers whole small lines to `intercept`, inside the
    loop's read callback: a message it takes is handled a turn of the loop sooner than through the
    pump's task (the lean path's calls and replies). Only a read that starts and ends at a line
    boundary is looked at, only up to the first line not taken, and only lines `worth` a look (a
    check on the bytes, so the SDK's own traffic is not decoded twice); every other byte goes to the
    pump, in order."""
    at_boundary = True

    def tap(data: bytes) -> None:
        nonlocal at_boundary
        begin = 0
        if at_boundary and data.endswith(b"\n") and len(data) <= TAP_LIMIT:
            try:
                while begin < len(data):
                    end = data.index(b"\n", begin) + 1
                    line = data[begin:end]
                    # read as the pump reads it (invalid UTF-8 -> U+FFFD), so both paths see one text
                    if not worth(line) or not intercept(loads(line)):
                        break
                    begin = end
            except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply: the pump answers it
                pass
            except Exception:  # never lose bytes: the pump gets the line instead
                log.exception("the line tap failed; the line goes to the pump")
        if data:
            at_boundary = data.endswith(b"\n")
        if begin < len(data):
            feed(data[begin:] if begin else data)

    return tap


def stream_sinks(writer: asyncio.StreamWriter) -> tuple[Send, Write]:
    """Both sinks of one asyncio pipe writer: `send` waits while the peer is behind (flow control),
    `write` is for callers that cannot wait (the lean path answers inside the loop's read callback)
    and declines instead. Both raise ClosedResourceError once the pipe is closing."""

    turn = asyncio.Lock()  # one sender at a time, and only once the pipe has room: while the peer is
    # behind, lines wait in their senders, never piled up in the pipe's buffer

    async def send(data: bytes) -> None:
        async with turn:
            while writer.transport.get_write_buffer_size() > WRITE_BEHIND and not writer.is_closing():
                await writer.drain()
            if writer.is_closing():
                raise anyio.ClosedResourceError
            writer.write(data)
            await writer.drain()

    def write(data: bytes) -> bool:
        if writer.is_closing():
            raise anyio.ClosedResourceError
        if writer.transport.get_write_buffer_size() > WRITE_BEHIND:
            return False
        writer.write(data)
        return True

    return send, write


async def pump_writes(write_recv: anyio.abc.ObjectReceiveStream[SessionMessage], send: Send) -> None:
    """Messages from a stream to a byte sink, one JSON line each."""
    async with write_recv:
        async for message in write_recv:
            try:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"
            except PydanticSerializationError:  # pydantic will not write a lone surrogate; dropped, the
                # message would leave its request unanswered
                data = json_line(message.message.model_dump(by_alias=True, exclude_unset=True, mode="json"))
            await send(data)


_NOT_JSON = object()


def _parse(line: str, peer: str, intercept: Intercept | None = None) -> tuple[SessionMessage | Exception | None, Any]:
    """The message (or the error) and the decoded JSON value (`_NOT_JSON` when it is not JSON); no
    message when `intercept` took it."""
    # decoding (the standard library's, for a large line: `json_wire.loads`) + validate_python peaks at
    # about half the memory of pydantic's validate_json on large lines (measured: +109 MB vs +218 MB for
    # a 57 MB line), and the strings are shared.
    try:
        raw = loads(line)
    except RecursionError:
        raw = too_deep(line, peer)
    except ValueError as exc:
        log.warning("the %s sent a line that is not JSON: %r", peer, line[:120])
        return ValueError(f"not JSON: {line.strip()[:120]!r} ({exc})"), _NOT_JSON
    if intercept is not None and intercept(raw):
        return None, None
    return _validate(raw, peer, lambda: repr(line[:120]))


DEEP = "\x00too-deep"  # the key marking a stand-in for a message nested too deeply to read
_ID = re.compile(r'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


def too_deep(line: str, peer: str) -> dict[str, Any]:
    """A stand-in for a message nested deeper than Python's parser goes (1,000+ levels): its id, when
    one can be told from the top level of the line, so its sender is answered instead of the process
    ending. From an upstream it is an error reply to that id (the call in flight gets it); from the
    host, a request that `error_reply` answers with -32600."""
    log.warning("the %s sent a message nested too deeply to read (%d characters)", peer, len(line))
    found: Any = None
    head, tail = line[:512], line[-512:]
    for match in _ID.finditer(head):  # at the top level: one brace open before it
        if head[: match.start()].count("{") - head[: match.start()].count("}") == 1:
            found = json.loads(match.group(1))
            break
    if found is None:
        for match in _ID.finditer(tail):  # or after the deep part: one brace still to close
            rest = tail[match.end() :]
            if rest.count("}") - rest.count("{") == 1:
                found = json.loads(match.group(1))
    message = "the message is nested too deeply to read (over 1,000 levels)"
    if peer == "host":
        return {"jsonrpc": "2.0", "id": found, DEEP: message}
    return {
        "jsonrpc": "2.0",
        "id": found,
        "error": {"code": types.INTERNAL_ERROR, "message": f"the upstream's reply: {message}"},
    }


def _validate(raw: Any, peer: str, shown: Callable[[], str]) -> tuple[SessionMessage | Exception, Any]:
    try:
        if isinstance(raw, dict) and DEEP in raw:
            raise ValueError(raw[DEEP])
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(raw, by_name=False)), raw
    except RecursionError:
        return ValueError("nested too deeply to validate"), {**raw, DEEP: "the message is nested too deeply to read"}
    except ValueError as exc:
        log.warning("the %s sent a message that is not valid JSON-RPC: %s", peer, shown())
        return exc, raw


def error_reply(raw: Any, message: SessionMessage | Exception) -> bytes | None:
    """The JSON-RPC error for an invalid request that a client would otherwise wait on forever."""
    if not isinstance(message, Exception):
        return None
    if raw is _NOT_JSON:
        code, text, msg_id = types.PARSE_ERROR, "Parse error: the line is not JSON", None
    elif isinstance(raw, dict) and DEEP in raw:
        code, text, msg_id = types.INVALID_REQUEST, f"Invalid Request: {raw[DEEP]}", raw.get("id")
    elif isinstance(raw, list):
        code, text, msg_id = types.INVALID_REQUEST, "Invalid Request: batches are not supported", None
    elif isinstance(raw, dict) and isinstance(raw.get("id"), (str, int)) and not isinstance(raw.get("id"), bool):
        msg_id = raw["id"]
        if "result" in raw or "error" in raw:
            return None  # a malformed response: there is nobody to answer
        if isinstance(raw.get("method"), str):
            code, text = types.INVALID_PARAMS, f"Invalid params for {raw['method']}: {str(message).splitlines()[0]}"
        else:
            code, text = types.INVALID_REQUEST, "Invalid Request: a request needs a string `method`"
    else:
        return None  # a notification: no answer is expected
    body = {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": text}}
    return json_line(body)
