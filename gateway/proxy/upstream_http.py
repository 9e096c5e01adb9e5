"""Upstream HTTP (Streamable HTTP, or the older HTTP+SSE): huge response bodies spooled to disk as they
stream, like stdio lines.

The SDK reads a JSON response body whole (`aread`) and an SSE event's data as one string. Under
either of the SDK's HTTP clients, a transport wrapper rewrites each response body as it streams: a
JSON body or an SSE `data:` line longer than the spiller's threshold is written to a spool file, read
back with its long strings left on disk (`gateway.services.spill`) and passed on as the small JSON
with markers.
Everything shorter flows through unchanged, line by line, so progress events are not delayed.
The same wrapper reports every response's bytes as they arrive: the health check's sign of life.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
import httpx2

import gateway.compat as compat
from gateway.services import spill
from gateway.services.spill import LineBuffer, Spiller

log = logging.getLogger(__name__)
SESSION_HEADERS = ("mcp-session-id", "mcp-protocol-version")  # what makes a POST part of the SDK's session
CONNECTIONS = 100  # requests at once to one HTTP upstream on each leg (the lean one's client, httpx's pool)
DRAIN_SECONDS = 0.05  # how long a closed POST response is read to its end (a server that keeps it open)


class SpoolingTransport(httpx2.AsyncBaseTransport):
    """An httpx transport whose JSON and SSE response bodies spool their long messages to disk (with a
    `spiller`), and that calls `on_bytes` whenever response bytes arrive."""

    def __init__(
        self,
        spiller: Spiller | None,
        inner: httpx2.AsyncBaseTransport | None = None,
        on_bytes: Callable[[], None] | None = None,
    ):
        self.spiller = spiller
        self.on_bytes = on_bytes
        self.inner = inner or httpx2.AsyncHTTPTransport(limits=httpx2.Limits(max_connections=CONNECTIONS))
        # whether the SDK's session still waits for a response id (set once it runs): a late reply to a
        # cancelled call is dropped by the SDK, so the files its long strings left are released here
        self.awaits: Callable[[Any], bool] | None = None
        self.session_headers: dict[str, str] | None = None  # SESSION_HEADERS of the SDK's latest POST
        # the server answered a request's POST with plain JSON (the SDK's `json_response` mode, where its
        # 2026-era requests go unwatched: a closed connection does not cancel them)
        self.answers_json = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST" and (
            headers := {k: request.headers[k] for k in SESSION_HEADERS if k in request.headers}
        ):
            self.session_headers = headers  # the SDK session's: the lean leg sends its calls with them
        response = await self.inner.handle_async_request(request)
        if request.method == "POST" and response.status_code == 200:
            self.answers_json |= response.headers.get("content-type", "").lower().startswith("application/json")
        if self.on_bytes is not None:
            self.on_bytes()  # the status line and headers
            response.stream = _Heard(response.stream, self.on_bytes)  # type: ignore[arg-type]
        if self.spiller is None:
            return response
        kind = response.headers.get("content-type", "").lower()
        encoded = response.headers.get("content-encoding", "identity").lower() not in ("", "identity")
        sse = kind.startswith("text/event-stream")
        if encoded or not (sse or kind.startswith("application/json")):
            return response
        response.headers.pop("content-length", None)
        response.stream = _Rewritten(response.stream, self, sse, drain=request.method == "POST")  # type: ignore[arg-type]
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Heard(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, heard: Callable[[], None]):
        self.inner = inner
        self.heard = heard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.heard()
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Rewritten(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, owner: SpoolingTransport, sse: bool, drain: bool = False):
        self.inner = inner
        self.owner = owner
        self.spiller = owner.spiller
        self.sse = sse
        self.drain = drain

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.sse:
            async for out in self._sse():
                yield out
        else:
            async for out in self._json():
                yield out

    async def aclose(self) -> None:
        """The SDK's client stops reading a POST's event stream at the response it waited for; the server
        ends the stream right after it. Reading that end (briefly) lets the connection go back to the pool
        instead of being closed: without it every call opened a new TCP connection to the upstream."""
        if self.drain:
            with anyio.move_on_after(DRAIN_SECONDS):
                async for _ in self.inner:
                    pass
        await self.inner.aclose()

    async def _json(self) -> AsyncIterator[bytes]:
        """A JSON body: passed on whole when short, else spooled and replaced by its marked-up JSON."""
        body = LineBuffer(self.spiller)
        try:
            async for chunk in self.inner:
                body.add(chunk)
            done = body.take()
            yield done if isinstance(done, bytes) else await _read(self.owner, done)
        finally:
            body.discard()

    async def _sse(self) -> AsyncIterator[bytes]:
        """SSE lines: short ones passed on as they complete; a long `data:` line spooled and replaced."""
        line = LineBuffer(self.spiller)
        try:
            async for chunk in self.inner:
                begin = 0
                newline = chunk.find(b"\n")
                while newline >= 0:
                    line.add(chunk[begin : newline + 1])
                    done = line.take()
                    yield done if isinstance(done, bytes) else await _read_event_line(self.owner, done)
                    begin = newline + 1
                    newline = chunk.find(b"\n", begin)
                if begin < len(chunk):
                    line.add(chunk[begin:])
            done = line.take()  # a stream that ended mid-line: pass on what came
            if isinstance(done, bytes):
                if done:
                    yield done
            else:
                path = Path(done.name)
                done.close()
                yield path.read_bytes()
                path.unlink(missing_ok=True)
        finally:
            line.discard()


async def _read_event_line(owner: SpoolingTransport, spool: BinaryIO) -> bytes:
    """A long SSE line from its spool: a `data:` line as `data: ` + its JSON with markers; any other
    line (or a `data:` line that is not JSON) as it came."""
    spool.flush()
    with open(spool.name, "rb") as fh:
        head = fh.read(6)
    if not head.startswith(b"data:"):
        return await _read(owner, spool, skip=None)
    skip = 6 if head.startswith(b"data: ") else 5
    return b"data: " + (await _read(owner, spool, skip)).rstrip(b"\r\n") + b"\n"


async def _read(owner: SpoolingTransport, spool: BinaryIO, skip: int | None = 0) -> bytes:
    """The spooled message (after `skip` bytes) as compact JSON with markers; its original bytes when it
    is not JSON, or unread when `skip` is None."""
    path = Path(spool.name)
    spool.close()
    try:
        if skip is None:
            return path.read_bytes()
        value = await anyio.to_thread.run_sync(owner.spiller.read, path, skip)
        if compat.late_response(owner.awaits, value):
            spill.discard(value)  # the SDK drops it (its call was cancelled): nobody would release its files
        return json.dumps(value, separators=(",", ":")).encode()  # ASCII: a lone surrogate stays an escape
    except ValueError as exc:
        log.warning("an upstream sent a long HTTP message that is not JSON (%s)", exc)
        return path.read_bytes()[skip or 0 :]
    finally:
        path.unlink(missing_ok=True)
