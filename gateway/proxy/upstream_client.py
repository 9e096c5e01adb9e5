"""The lean path's HTTP/1.1 client for its leg to a Streamable HTTP upstream: kept-alive connections per
origin, each an asyncio protocol with httptools' response parser (the C parser uvicorn runs in front).

What the leg needs and no more: a POST or a GET with its headers, the status and headers once they
arrive, the body read whole or as it streams (an SSE stream, a long body spooled to disk), gzip and
deflate undone, TLS to `https` upstreams, a connection back to its pool once its response was read to
the end. Measured against aiohttp (which the leg used before), POSTing the same sessionless call from 16
workers: 56-59 us of CPU per POST against 161-172 us; each call's request is one write, with no task of
the client's own per request.

Not here (the leg does not use them): proxies and `.netrc` (the SDK's client takes none either),
cookies, redirects (the caller follows same-origin 307/308 itself), `Expect: 100-continue`.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httptools

from gateway.proxy.upstream_http import CONNECTIONS

CONNECT_SECONDS = 30.0  # as the leg's aiohttp client waited for a connection
IDLE_PER_ORIGIN = 64  # connections kept for reuse per origin; more are closed once their response ended
# a connection idle this long is not used again: servers close theirs after ~5 s (uvicorn's and Node's
# default), and a request written as the server closes it would fail
IDLE_SECONDS = 4.0
PATH_SAFE = "/%:@!$&'()*+,;=-._~"  # RFC 3986's path characters, and `%` (already encoded)
QUERY_SAFE = PATH_SAFE + "?"
HIGH_WATER = 256 * 1024  # bytes of body buffered before the socket's reading pauses
MAX_HEAD = 64 * 1024  # bytes of a response's status line and headers (aiohttp: 8190 a line)
DECODED_CHUNK = 256 * 1024  # the most a compressed body hands out at once (a gzip bomb stays small)


class ResponseError(ConnectionError):
    """The connection failed or closed before the response ended, or the response was not HTTP."""


class Headers(dict[str, str]):
    """A response's headers by lowercase name (the first of a repeated one); `get` takes any case."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: writes a request, parses its response as the bytes arrive."""

    def __init__(self, origin: tuple[str, str, int]) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[None] | None = None
        self.headers = Headers()
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.until_eof = False  # a body without a length, ended by the close
        self.keep_alive = False
        self.failure: BaseException | None = None
        self.lost = False
        self.waiter: asyncio.Future[None] | None = None
        self.decoder: Any = None
        self.paused = False
        self.idle_since = 0.0
        self.flushed = False
        self.expecting = False  # a request was written and its final response has not ended
        self.informational = False  # the message being parsed is a 1xx, skipped
        self.head_bytes = 0
        self.status = 0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.expecting:  # bytes after a response that ended (or while idle) spoil only the connection
                self._fail(ResponseError(f"the upstream's response is not valid HTTP: {exc}"))
            self.keep_alive = False
            self.close()
            return
        if self.head is not None and not self.head.done():  # the head (1xx ones too) is still coming
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD:  # httptools keeps a header line whole, however long
                self._fail(ResponseError(f"the upstream's response head is longer than {MAX_HEAD} bytes"))
                self.close()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.until_eof and not self.complete and self.failure is None and exc is None:
            self._ended()
            return
        if not self.complete:
            self._fail(ResponseError(f"the upstream closed the connection ({exc or 'end of stream'})"))

    # httptools' callbacks
    def on_message_begin(self) -> None:
        if not self.expecting:  # a response nobody asked for (a second one, bytes while idle)
            raise ResponseError("a response the client did not ask for")
        self.headers = Headers()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.informational = 100 <= status < 200 and status != 101
        if self.informational:  # 100 Continue, 103 Early Hints: the response proper follows
            return
        self.status = status
        encoding = self.headers.get("content-encoding", "").strip().lower()
        if encoding == "gzip":
            self.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self.decoder = _Deflate()
        self.keep_alive = self.parser.should_keep_alive()  # asked now: the parser forgets it at the message's end
        self.until_eof = (
            "content-length" not in self.headers
            and "chunked" not in self.headers.get("transfer-encoding", "").lower()
            and status not in (204, 304)
            and status >= 200
        )
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if body:
            self.chunks.append(body)
            self.buffered += len(body)
            if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.expecting = False
        self._ended()

    # the exchange's side
    def send(self, data: bytes) -> asyncio.Future[None]:
        assert self.transport is not None
        self.head = asyncio.get_running_loop().create_future()
        self.forget()
        self.complete, self.keep_alive, self.expecting, self.flushed, self.head_bytes = False, False, True, False, 0
        self.transport.write(data)
        return self.head

    async def chunk(self) -> bytes | None:
        """The body's next bytes as they came; None at its end. Raises ResponseError if it broke off."""
        while True:
            data = await self._raw()
            if self.decoder is None:
                return data
            try:
                if data is None:
                    if self.flushed:
                        return None
                    self.flushed = True
                    return self.decoder.flush() or None
                out = self.decoder.decompress(data, DECODED_CHUNK)
                tail = self.decoder.unconsumed_tail
            except zlib.error as exc:
                self._fail(ResponseError(f"the upstream's body cannot be decompressed: {exc}"))
                self.close()
                raise self.failure from None
            if tail:  # put back what is not decoded yet (still counted as buffered)
                self.chunks.appendleft(tail)
                self.buffered += len(tail)
                # a few KB on the wire can hold hundreds of MB: other callers get the loop between pieces
                await asyncio.sleep(0)
            if out:
                return out

    async def _raw(self) -> bytes | None:
        while not self.chunks:
            if self.complete:
                return None
            if self.failure is not None:
                raise self.failure
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        data = self.chunks.popleft()
        self.buffered -= len(data)
        if self.buffered <= HIGH_WATER // 4:
            self._resume()
        return data

    def reusable(self) -> bool:
        return self.complete and not self.lost and self.failure is None and self.keep_alive and not self.until_eof

    def forget(self) -> None:
        """A response's unread bytes dropped (the connection waits idle, or takes the next request)."""
        self.chunks, self.buffered, self.decoder = deque(), 0, None
        self._resume()

    def _resume(self) -> None:
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _ended(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved here: the exchange raises its own
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _Deflate:
    """`Content-Encoding: deflate` as servers send it: zlib-wrapped, or raw (the header's first byte says)."""

    def __init__(self) -> None:
        self._inner: Any = None

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail if self._inner is not None else b""

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        if self._inner is None:
            if not data:
                return b""
            wrapped = (data[0] & 0x0F) == 8 and ((data[0] << 8) | (data[1] if len(data) > 1 else 0)) % 31 == 0
            self._inner = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return self._inner.decompress(data, max_length)

    def flush(self) -> bytes:
        return self._inner.flush() if self._inner is not None else b""


class Response:
    """The part of a response the leg reads: `status`, `headers`, `content_length`, the body whole
    (`read`) or as it streams (`content.iter_any()`)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = connection.status
        self.headers = connection.headers
        length = self.headers.get("content-length")
        self.content_length = int(length) if length is not None and length.strip().isdigit() else None
        self.content = self  # as aiohttp's `response.content.iter_any()` reads

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.iter_any()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        while (chunk := await self._connection.chunk()) is not None:
            yield chunk


class _Exchange:
    """One request and its response, as `async with client.post(...) as response`."""

    def __init__(self, client: UpstreamClient, method: str, url: str, body: bytes, headers: dict[str, str]) -> None:
        self._client, self._method, self._url, self._body, self._headers = client, method, url, body, headers
        self._connection: _Connection | None = None

    async def __aenter__(self) -> Response:
        origin, data = self._client.request_bytes(self._method, self._url, self._body, self._headers)
        slots = self._client.slots
        await slots.acquire()
        try:
            connection = await self._client.connection(origin)
        except BaseException:
            slots.release()
            raise
        try:
            await connection.send(data)
        except BaseException:
            self._client.release(connection)  # not reusable: closed, and out of the open set
            slots.release()
            raise
        self._connection = connection
        return Response(connection)

    async def __aexit__(self, *exc: object) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client.release(connection)
            self._client.slots.release()


class UpstreamClient:
    """Kept-alive HTTP/1.1 connections to the leg's upstreams, opened as requests need them."""

    def __init__(
        self, tls: Callable[[], ssl.SSLContext] = ssl.create_default_context, limit: int | None = None
    ) -> None:
        self._tls = tls  # the context for `https` upstreams, made on the first one
        self._ssl: ssl.SSLContext | None = None
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self.closed = False
        # requests at once, as aiohttp's connector limited them: more wait for one to end (each holds a
        # socket; a flood of long calls would otherwise run the process out of file descriptors)
        self.slots = asyncio.Semaphore(limit or CONNECTIONS)

    def post(self, url: str, data: bytes, headers: dict[str, str], allow_redirects: bool = False) -> _Exchange:
        return _Exchange(self, "POST", url, data, headers)

    def get(self, url: str, headers: dict[str, str], allow_redirects: bool = False) -> _Exchange:
        return _Exchange(self, "GET", url, b"", headers)

    def request_bytes(
        self, method: str, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[tuple[str, str, int], bytes]:
        """The origin to connect to, and the request as one write. A header with a line break in its name
        or value is refused (it would end the header early: another request smuggled in)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if scheme == "https" else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        if parts.port is not None and port != (443 if scheme == "https" else 80):
            shown += f":{port}"
        # as a URL library sends it: what may not stand in a path or query percent-encoded (a `%` kept)
        target = quote(parts.path or "/", safe=PATH_SAFE) + (
            f"?{quote(parts.query, safe=QUERY_SAFE)}" if parts.query else ""
        )
        lines = [f"{method} {target} HTTP/1.1", f"host: {shown}"]
        if parts.username is not None:
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append("authorization: Basic " + base64.b64encode(user).decode())
        for name, value in headers.items():
            if any(c in name or c in str(value) for c in "\r\n\0"):
                raise ValueError(f"a line break in the header {name!r}")
            lines.append(f"{name}: {value}")
        lines.append("accept-encoding: gzip, deflate")
        if method != "GET" or body:
            lines.append(f"content-length: {len(body)}")
        head = "\r\n".join(lines) + "\r\n\r\n"
        try:
            encoded = head.encode("latin-1")
        except UnicodeEncodeError:
            encoded = head.encode("utf-8")
        return (scheme, host, port), encoded + body

    async def connection(self, origin: tuple[str, str, int]) -> _Connection:
        """A kept-alive connection to `origin` that is still open, else a new one."""
        if self.closed:
            raise ResponseError("the upstream client is closed")
        loop = asyncio.get_running_loop()
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            transport = connection.transport
            fresh = loop.time() - connection.idle_since < IDLE_SECONDS
            if fresh and not connection.lost and transport is not None and not transport.is_closing():
                return connection
            self._open.discard(connection)
            connection.close()
        scheme, host, port = origin
        if scheme == "https" and self._ssl is None:
            self._ssl = self._tls()
        secure = self._ssl if scheme == "https" else None
        async with asyncio.timeout(CONNECT_SECONDS):  # not wait_for: on 3.11 it can swallow a cancel
            _, connection = await loop.create_connection(
                lambda: _Connection(origin), host, port, ssl=secure, server_hostname=host if secure else None
            )
        self._open.add(connection)
        return connection

    def release(self, connection: _Connection) -> None:
        """A response left: its connection kept for the next request if it was read to the end and the
        server keeps it open; closed otherwise (a body half read cannot be skipped safely)."""
        idle = self._idle.setdefault(connection.origin, [])
        now = asyncio.get_running_loop().time()
        while idle and now - idle[0].idle_since >= IDLE_SECONDS:  # the oldest first: not kept open for nothing
            stale = idle.pop(0)
            self._open.discard(stale)
            stale.close()
        if not self.closed and connection.reusable() and len(idle) < IDLE_PER_ORIGIN:
            connection.forget()
            connection.idle_since = now
            idle.append(connection)
            return
        self._open.discard(connection)
        connection.close()

    async def close(self) -> None:
        """Every connection closed, those of requests still running too (their reads then fail)."""
        self.closed = True
        for connection in list(self._open):
            if not connection.complete:  # a body ended by the close is cut off here, not complete
                connection._fail(ResponseError("the upstream client was closed"))
            connection.close()
        self._open.clear()
        self._idle.clear()
