"""The floor of a Python Streamable HTTP proxy built on the gateway's own server and client libraries
(uvicorn in front, httpx behind): each request's method, headers and body are sent on to the upstream
and its reply streamed back, nothing parsed. `bench/concurrency.py` runs it beside the gateway.

    python bench/http_relay.py PORT UPSTREAM_URL [UPSTREAM_URL ...]
    python bench/http_relay.py --client aiohttp PORT UPSTREAM_URL   (the same relay with aiohttp behind)
    python bench/http_relay.py --client lean PORT UPSTREAM_URL      (with the lean path's own client behind)
    python bench/http_relay.py --tcp PORT UPSTREAM_URL              (bytes copied, not even HTTP parsed)

With several upstreams it is the load balancer of `bench/replicas.py`: a request without an
`Mcp-Session-Id` (a host's `initialize`, or a 2026-era host's sessionless request) goes to the next
upstream in turn; one with a session id goes where that session was opened (sticky by session, as a
load balancer in front of gateway replicas must be: sessions and `input_required` rounds live in one
process).

`--client lean` relays with the HTTP client of the gateway's lean path (`gateway/proxy/upstream_client.py`,
its leg to Streamable HTTP upstreams): the floor a lean call could reach; `--client aiohttp` with the
client that leg used before it. `--tcp` is the floor of any proxy process on this machine: one more hop,
asyncio copying bytes both ways.
"""

import asyncio
import itertools
import sys
from typing import Any
from urllib.parse import urlsplit

import httpx2
import uvicorn

HOP = {b"host", b"content-length", b"connection", b"transfer-encoding"}


def app_for(upstreams: list[str]) -> Any:
    client = httpx2.AsyncClient(timeout=httpx2.Timeout(60), limits=httpx2.Limits(max_keepalive_connections=64))
    sessions: dict[bytes, str] = {}  # Mcp-Session-Id -> the upstream that opened it
    turn = itertools.cycle(upstreams)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP]
        session = dict(headers).get(b"mcp-session-id")
        upstream = sessions.get(session, "") if session else next(turn)
        if not upstream:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"unknown session"})
            return
        request = client.build_request(scope["method"], upstream, headers=headers, content=body)
        response = await client.send(request, stream=True)
        try:
            out = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in HOP]
            if opened := dict(out).get(b"mcp-session-id"):
                sessions[opened] = upstream
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


def aiohttp_app_for(upstream: str) -> Any:
    import aiohttp

    state: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if "client" not in state:  # made inside the server's loop
            state["client"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        body = await _body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in HOP}
        async with state["client"].request(
            scope["method"], upstream, headers=headers, data=body, auto_decompress=False
        ) as response:
            out = [(k.lower(), v) for k, v in response.raw_headers if k.lower() not in HOP]
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


def lean_app_for(upstream: str) -> Any:
    from gateway.proxy.upstream_client import UpstreamClient

    client = UpstreamClient()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in HOP and k != b"accept-encoding"}
        exchange = client.post(upstream, body, headers) if scope["method"] == "POST" else client.get(upstream, headers)
        async with exchange as response:
            out = [(k.encode(), v.encode()) for k, v in response.headers.items() if k.encode() not in HOP]
            out = [(k, v) for k, v in out if k != b"content-encoding"]  # the client undid it
            await send({"type": "http.response.start", "status": response.status, "headers": out})
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def tcp_relay(port: int, upstream: str) -> None:
    target = urlsplit(upstream)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--tcp":
        asyncio.run(tcp_relay(int(args[1]), args[2]))
    else:
        if args[:2] == ["--client", "aiohttp"]:
            app = aiohttp_app_for(args[3])
        elif args[:2] == ["--client", "lean"]:
            app = lean_app_for(args[3])
        else:
            app = app_for(args[1:])
        port = int(args[2] if args[0] == "--client" else args[0])
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
