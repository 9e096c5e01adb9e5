"""The lean HTTP leg's client against a hand-written HTTP server on loopback: each test's server answers
exactly the bytes it is given (kept-alive, chunked, compressed, cut off, not HTTP at all)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from gateway.proxy.upstream_client import ResponseError, UpstreamClient

pytestmark = pytest.mark.anyio

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # one request's head+body -> keep the connection


class Server:
    """Counts the connections it accepted and the requests it read; `answer` writes each response."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/mcp"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test ended (a cancelled handler would be logged at the loop's close)
        writer.close()


def _json_reply(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def _echo_json(request: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(_json_reply(request.split(b"\r\n\r\n", 1)[1]))
    return True


async def _post(client: UpstreamClient, url: str, body: bytes) -> tuple[int, Any, bytes]:
    async with client.post(url, data=body, headers={"content-type": "application/json"}) as response:
        return response.status, response.headers, await response.read()


async def test_calls_share_one_kept_alive_connection_and_each_gets_its_own_body() -> None:
    async with Server(_echo_json) as server:
        client = UpstreamClient()
        for i in range(5):
            status, headers, body = await _post(client, server.url, json.dumps({"n": i, "text": "안녕"}).encode())
            assert status == 200 and headers.get("Content-Type") == "application/json"
            assert json.loads(body) == {"n": i, "text": "안녕"}
        await client.close()
    assert server.connections == 1 and len(server.requests) == 5
    head = server.requests[0].split(b"\r\n\r\n")[0].decode().lower()
    assert head.startswith("post /mcp http/1.1") and "host: 127.0.0.1:" in head and "content-length: " in head


async def test_a_chunked_gzipped_body_and_a_raw_deflated_one_are_read_as_sent() -> None:
    text = json.dumps({"rows": [f"행 {i}" for i in range(20_000)]}).encode()

    async def compressed(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"gzip" in request:  # asked first: chunked, gzip
            packed = gzip.compress(text)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n")
            for at in range(0, len(packed), 1000):
                part = packed[at : at + 1000]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            return True
        raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = raw.compress(text) + raw.flush()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: deflate\r\ncontent-length: %d\r\n\r\n%s" % (len(packed), packed)
        )
        return True

    async with Server(compressed) as server:
        client = UpstreamClient()
        assert (await _post(client, server.url, b"gzip"))[2] == text
        assert (await _post(client, server.url, b"deflate"))[2] == text
        await client.close()
    assert server.connections == 1
    assert b"accept-encoding: gzip, deflate" in server.requests[0]


async def test_a_long_body_streams_in_pieces_with_every_byte() -> None:
    """8 MB, read slowly: the socket's reading pauses while the body waits and resumes as it is read."""
    text = bytes(range(256)) * (8 * 4096)

    async def long(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(text))
        for at in range(0, len(text), 65536):
            writer.write(text[at : at + 65536])
            await writer.drain()
        return True

    async with Server(long) as server:
        client = UpstreamClient()
        got = bytearray()
        async with client.post(server.url, data=b"{}", headers={}) as response:
            assert response.content_length == len(text)
            async for chunk in response.content.iter_any():
                got += chunk
                if len(got) < 1 << 20:
                    await asyncio.sleep(0)  # a slow reader for the first megabyte
        assert bytes(got) == text
        await client.close()


async def test_a_body_ended_by_the_close_is_whole_and_its_connection_not_kept() -> None:
    async def until_close(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"done": true}')
        return False  # the server closes: that ends the body

    async with Server(until_close) as server:
        client = UpstreamClient()
        assert json.loads((await _post(client, server.url, b"{}"))[2]) == {"done": True}
        assert json.loads((await _post(client, server.url, b"{}"))[2]) == {"done": True}
        await client.close()
    assert server.connections == 2


async def test_a_body_cut_off_raises_and_the_next_call_gets_a_new_connection() -> None:
    calls = 0

    async def cut(request: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{"partial":')
            return False
        return await _echo_json(request, writer)

    async with Server(cut) as server:
        client = UpstreamClient()
        with pytest.raises(ResponseError):
            await _post(client, server.url, b"{}")
        assert (await _post(client, server.url, b'{"ok": 1}'))[2] == b'{"ok": 1}'
        await client.close()
    assert server.connections == 2


async def test_a_response_left_half_read_closes_its_connection() -> None:
    """Bytes still coming cannot be skipped safely: the next call opens a new connection (one whose
    response had arrived whole before it was left is kept)."""
    text = b"x" * (4 << 20)

    async def long(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(text))
        writer.write(text)
        await writer.drain()
        return True

    async with Server(long) as server:
        client = UpstreamClient()
        async with client.post(server.url, data=b"{}", headers={}) as response:
            assert response.status == 200  # its body left unread
        assert (await _post(client, server.url, b"{}"))[2] == text
        await client.close()
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    async def once(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await _echo_json(request, writer)
        return False  # closed right after its answer, though the answer did not say so

    async with Server(once) as server:
        client = UpstreamClient()
        for _ in range(3):
            await _post(client, server.url, b"{}")
            with anyio.fail_after(5):  # the close reaches the client
                while any(not c.lost for c in client._open):
                    await asyncio.sleep(0.01)
        await client.close()
    assert server.connections == 3


async def test_what_is_not_http_is_an_error_and_not_a_hang() -> None:
    async def junk(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\nnot http at all")
        return True

    async with Server(junk) as server:
        client = UpstreamClient()
        with anyio.fail_after(5), pytest.raises(ResponseError):
            await _post(client, server.url, b"{}")
        await client.close()


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with Server(_echo_json) as server:
        client = UpstreamClient()
        with pytest.raises(ValueError):
            async with client.post(server.url, data=b"{}", headers={"mcp-session-id": "x\r\nx-smuggled: 1"}):
                pass
        await client.close()
    assert server.requests == []


async def test_closing_the_client_ends_a_response_still_streaming() -> None:
    async def endless(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b"7\r\n: ping\n\r\n")
        await asyncio.sleep(30)
        return False

    async with Server(endless) as server:
        client = UpstreamClient()
        async with client.get(server.url, headers={}) as response:
            chunks = response.content.iter_any()
            assert await anext(chunks) == b": ping\n"
            await client.close()
            with anyio.fail_after(5), pytest.raises(ResponseError):
                await anext(chunks)


async def test_a_connection_idle_too_long_is_closed_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server closes its idle connections after a few seconds; one idle longer than IDLE_SECONDS is
    not written to (the request would cross the server's close)."""
    from gateway.proxy import upstream_client

    monkeypatch.setattr(upstream_client, "IDLE_SECONDS", 0.0)
    async with Server(_echo_json) as server:
        client = UpstreamClient()
        for _ in range(3):
            await _post(client, server.url, b"{}")
        assert len(client._open) == 1  # the stale ones were closed, not kept
        await client.close()
    assert server.connections == 3


async def test_an_early_hint_before_the_answer_is_skipped() -> None:
    async def hinted(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the server works on the answer: the hints arrive alone
        return await _echo_json(request, writer)

    async with Server(hinted) as server:
        client = UpstreamClient()
        for i in range(3):
            assert await _post(client, server.url, b'{"n": %d}' % i) == (
                200,
                {"content-type": "application/json", "content-length": "8"},
                b'{"n": %d}' % i,
            )
        await client.close()


async def test_a_response_nobody_asked_for_never_reaches_the_next_call() -> None:
    """A server that writes two responses (or more body than it said) spoils only its connection."""

    async def doubled(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await _echo_json(request, writer)
        writer.write(_json_reply(b'{"stray": true}', b"x-stray: 1\r\n"))
        return True

    async with Server(doubled) as server:
        client = UpstreamClient()
        for i in range(3):
            status, headers, body = await _post(client, server.url, b'{"n": %d}' % i)
            assert (status, body, headers.get("x-stray")) == (200, b'{"n": %d}' % i, None)
        await client.close()


async def test_a_gzip_bomb_streams_in_bounded_pieces() -> None:
    """1 MB on the wire that inflates to 256 MB: handed out a bounded piece at a time, never whole, and
    other callers get the loop between the pieces."""
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    packed = b"".join(packer.compress(zeros) for _ in range(256)) + packer.flush()

    async def bomb(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(packed), packed)
        )
        return True

    async with Server(bomb) as server:
        client = UpstreamClient()
        total = largest = turns = 0

        async def other_caller() -> None:  # how often the loop gets to run someone else meanwhile
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        beside = asyncio.ensure_future(other_caller())
        async with client.post(server.url, data=b"{}", headers={}) as response:
            async for chunk in response.content.iter_any():
                total, largest = total + len(chunk), max(largest, len(chunk))
        beside.cancel()
        assert total == 256 << 20 and largest <= 1 << 20
        assert turns >= 256  # between the pieces, not once per read of the wire (a few KB hold all of it)
        await client.close()


async def test_a_large_answer_left_unread_does_not_stall_the_next_call_on_its_connection() -> None:
    """A whole body that was never read (an error page, say) is dropped when its connection is kept,
    and the connection's reading, paused while the body waited, goes on."""
    big = b"e" * (300 << 10)  # over the client's buffer: its last read pauses the socket's reading

    async def error_then_echo(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"first" in request:
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big))
            await writer.drain()
            return True
        return await _echo_json(request, writer)

    async with Server(error_then_echo) as server:
        client = UpstreamClient()
        async with client.post(server.url, data=b"first", headers={}) as response:
            assert response.status == 500
            with anyio.fail_after(5):  # the whole body arrives
                while not response._connection.complete:
                    await asyncio.sleep(0.01)
        with anyio.fail_after(10):
            assert (await _post(client, server.url, b'{"next": 1}'))[2] == b'{"next": 1}'
        await client.close()


async def test_a_response_head_without_end_is_refused_at_its_cap() -> None:
    async def endless_head(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nx-long: ")
        for _ in range(64):  # 4 MB of one header, never ended
            writer.write(b"a" * 65536)
            await writer.drain()
        return True

    async with Server(endless_head) as server:
        client = UpstreamClient()
        with anyio.fail_after(10), pytest.raises(ResponseError, match="head"):
            await _post(client, server.url, b"{}")
        await client.close()


async def test_requests_beyond_the_limit_wait_for_a_connection() -> None:
    """Each request holds a socket: past the client's limit at once the next waits for one to end."""
    release = asyncio.Event()
    at_once = most = 0

    async def slow(request: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        await release.wait()
        at_once -= 1
        return await _echo_json(request, writer)

    async with Server(slow) as server:
        client = UpstreamClient(limit=2)
        calls = [asyncio.ensure_future(_post(client, server.url, b'{"n": %d}' % i)) for i in range(5)]
        with anyio.fail_after(5):
            while at_once < 2:
                await asyncio.sleep(0.01)
        release.set()
        with anyio.fail_after(10):
            answers = await asyncio.gather(*calls)
        assert [a[2] for a in answers] == [b'{"n": %d}' % i for i in range(5)] and most == 2
        await client.close()
