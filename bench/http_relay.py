"""The floor of a Python Streamable HTTP proxy built on the gateway's own server and client libraries
(uvicorn in front, httpx behind): each request's method, headers and body are sent on to the upstream
and its reply streamed back, nothing parsed. `bench/concurrency.py` runs it beside the gateway.

    python bench/http_relay.py PORT UPSTREAM_URL [UPSTREAM_URL ...]

With several upstreams it is the load balancer of `bench/replicas.py`: a request without an
`Mcp-Session-Id` (a host's `initialize`, or a 2026-era host's sessionless request) goes to the next
upstream in turn; one with a session id goes where that session was opened (sticky by session, as a
load balancer in front of gateway replicas must be: sessions and `input_required` rounds live in one
process).
"""

import itertools
import sys
from typing import Any

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
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
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


if __name__ == "__main__":
    uvicorn.run(app_for(sys.argv[2:]), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
