"""The host side: serve the gateway over stdio (default) or Streamable HTTP (loopback, bearer token,
Origin/Host checks), and stop every upstream on a signal."""

from __future__ import annotations

import hmac
import logging
import os
import signal
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

import gateway.compat as compat
from gateway.proxy.host_sessions import NAMESPACE_SCOPE_KEY
from gateway.proxy.host_stdio import pipe_stdio_server
from gateway.proxy.lean_http import LeanHttpFront
from gateway.proxy.metrics import MetricsEndpoint
from gateway.proxy.reload import ConfigReloader
from gateway.proxy.server import Gateway
from gateway.settings import LOOPBACK_HOSTS, Settings

log = logging.getLogger("gateway.host_transport")

Loader = Callable[[], Settings]  # re-reads the settings from the sources used at start (live reload)


SIGNALS = (signal.SIGTERM, signal.SIGINT)
# anyio has no signal receiver on Windows; there the host ends the gateway by closing stdin (or
# killing its Job Object), and Ctrl+C arrives as KeyboardInterrupt.
HANDLE_SIGNALS = sys.platform != "win32"


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    # Python's default SIGTERM skips `finally`; this lets upstreams be stopped (process groups killed).
    with anyio.open_signal_receiver(*SIGNALS) as received:
        async for signum in received:
            log.info("received signal %s; stopping upstreams", signum)
            scope.cancel()
            return


async def _exit_on_signal(gateway: Gateway) -> None:
    # The stdio front reads stdin in a worker thread that cancellation cannot interrupt, so a
    # signal stops the upstreams and plugins directly, then ends the process.
    with anyio.open_signal_receiver(*SIGNALS) as received:
        async for signum in received:
            log.info("received signal %s; stopping upstreams", signum)
            with anyio.CancelScope(shield=True):
                await gateway.shutdown()
            logging.shutdown()
            os._exit(0)


def _front_stdio(gateway: Gateway) -> Any:
    """Asyncio pipes on POSIX when stdin/stdout are pipes (no thread per message, and the lean path for
    plain calls); the SDK's otherwise."""
    if sys.platform != "win32":
        import stat

        if all(stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in (0, 1)):
            if gateway.settings.gateway.lean_path:
                return pipe_stdio_server(gateway.lean.intercept, gateway.lean.worth)
            return pipe_stdio_server()
    return stdio_server()


async def serve_stdio(gateway: Gateway, reload: Loader | None = None) -> None:
    async with anyio.create_task_group() as tg:
        if HANDLE_SIGNALS:
            tg.start_soon(_exit_on_signal, gateway)
        async with gateway.running(), _front_stdio(gateway) as (read, write):
            if reload is not None:
                tg.start_soon(ConfigReloader(gateway, reload).watch, name="config:watch")
            try:
                await gateway.server.run(read, write, gateway.server.create_initialization_options())
            finally:
                gateway.lean.stop()
        tg.cancel_scope.cancel()


def security_settings(host: str, port: int, extra_origins: list[str] | None = None) -> TransportSecuritySettings:
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*", *(extra_origins or [])]
    if host not in LOOPBACK_HOSTS and host not in ("0.0.0.0", "::"):
        hosts += [f"{host}:*", host]
        origins += [f"http://{host}:*", f"https://{host}:*"]
    if host in ("0.0.0.0", "::"):
        # Bound to every interface: the Host header cannot be predicted; the bearer token guards access.
        return TransportSecuritySettings(enable_dns_rebinding_protection=False, allowed_origins=origins)
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


class BearerAuth:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>` of a known token. The
    token's name (its namespace; "" for `auth_token`) goes into the request scope for the tools."""

    def __init__(self, app: Any, tokens: dict[str, str]):
        self.app = app
        self.expected = [(f"Bearer {token}".encode(), name) for token, name in tokens.items()]
        # each MCP session belongs to the token that opened it: another token's request on it (a leaked
        # or guessed `mcp-session-id`) is answered as for an unknown session
        self.owners: OrderedDict[bytes, str] = OrderedDict()

    def _namespace(self, given: bytes) -> str | None:
        found = None
        for expected, name in self.expected:  # every token compared, in constant time each
            if hmac.compare_digest(given, expected):
                found = name
        return found

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"")
            namespace = self._namespace(given)
            scope[NAMESPACE_SCOPE_KEY] = namespace or ""
            if namespace is None:
                body = b'{"error": "missing or wrong bearer token (Authorization: Bearer <auth_token>)"}'
                await _answer(send, 401, body, [(b"www-authenticate", b"Bearer")])
                return
            session = headers.get(b"mcp-session-id")
            if session is not None and self.owners.get(session, namespace) != namespace:
                await _answer(send, 404, b'{"error": "session not found"}')
                return
            if session is None:  # a new session: it is this token's
                send = self._binding(send, namespace)
        await self.app(scope, receive, send)

    def _binding(self, send: Any, namespace: str) -> Any:
        async def bind(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers") or []:
                    if key.lower() == b"mcp-session-id":
                        self.owners[value] = namespace
                        while len(self.owners) > MAX_SESSIONS:
                            self.owners.popitem(last=False)
            await send(message)

        return bind


MAX_SESSIONS = 100_000  # owners remembered (the session manager ends idle sessions after 30 minutes)


async def _answer(send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    start = {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    start["headers"] += headers or []
    await send(start)
    await send({"type": "http.response.body", "body": body})


def build_http_app(gateway: Gateway) -> tuple[Any, StreamableHTTPSessionManager]:
    from starlette.applications import Starlette
    from starlette.routing import Route

    cfg = gateway.settings.gateway
    security = security_settings(cfg.host, cfg.port, cfg.allowed_origins)
    manager = StreamableHTTPSessionManager(
        app=gateway.server,
        security_settings=security,
        session_idle_timeout=1800,
        max_request_body_size=16 * 1024 * 1024,
    )
    endpoint: Any = StreamableHTTPASGIApp(manager)
    if cfg.lean_path:  # plain calls answered beside the SDK, both eras (proxy/lean_http.py)
        lean = gateway.lean
        schema = gateway.server.get_tool_input_schema
        endpoint = LeanHttpFront(
            endpoint, manager, security, gateway.host_of, lean.run, lean.run_modern, schema, lean.server_info
        )
    tokens = {t.token: t.name for t in gateway.settings.auth.all_tokens()}
    if cfg.auth_token:
        tokens[cfg.auth_token] = ""
    metrics: Any = MetricsEndpoint(
        gateway.stats, lambda: {name: up.state for name, up in gateway.upstreams.items()}, security
    )
    if tokens:
        endpoint = BearerAuth(endpoint, tokens)
        metrics = BearerAuth(metrics, tokens)
    app = Starlette(
        routes=[
            Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"]),
            Route("/metrics", endpoint=metrics, methods=["GET"]),
        ]
    )
    return app, manager


async def serve_http(gateway: Gateway, reload: Loader | None = None, ready: anyio.Event | None = None) -> None:
    import uvicorn

    cfg = gateway.settings.gateway
    app, manager = build_http_app(gateway)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    compat.leave_signals_to_us(server)  # our handler stops the upstreams, then uvicorn
    async with anyio.create_task_group() as tg:
        if HANDLE_SIGNALS:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
        async with gateway.running(), manager.run():
            if reload is not None:
                tg.start_soon(ConfigReloader(gateway, reload).watch, name="config:watch")
            # said, not warned: the default log level shows only problems, and this line is where to connect
            print(f"mcp-context-gateway: serving Streamable HTTP at http://{cfg.host}:{cfg.port}/mcp", file=sys.stderr)
            if ready is not None:
                ready.set()
            await server.serve()
        tg.cancel_scope.cancel()
