"""The host side: serve the gateway over stdio (default) or Streamable HTTP (loopback, bearer token,
Origin/Host checks), and stop every upstream on a signal."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import anyio
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

import gateway.compat as compat
from gateway.proxy.host_sessions import NAMESPACE_SCOPE_KEY, scope_namespace
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


# the headers a check reads: each must mean the same to every check, and Starlette and the SDK read the first of
# several copies where a plain dict reads the last
SINGLE_HEADERS = (b"authorization", b"mcp-session-id", b"mcp-protocol-version", b"host", b"origin")
SESSION_NOT_FOUND = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Session not found"}}'
SESSIONS_IN_ALL = 10_000  # open session-bound HTTP sessions, every token's together (the SDK's own default cap)


class ByPath:
    """ASGI: a request for one of `routes`' paths, with one of its methods, goes straight to its endpoint;
    everything else to `app` (Starlette: its 404, 405, redirects). Starlette's router and its two error
    middlewares took ~20 us of every small call, and the endpoints use none of what they add."""

    def __init__(self, app: Any, routes: dict[str, tuple[Any, frozenset[str]]]):
        self.app = app
        self.routes = routes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            found = self.routes.get(scope["path"])
            if found is not None and scope["method"] in found[1]:
                await found[0](scope, receive, send)
                return
        await self.app(scope, receive, send)


class OneReading:
    """ASGI: a request carrying one of `SINGLE_HEADERS` more than once is refused before any check reads
    it (the bearer check would read one copy and the SDK's session routing another)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            seen: set[bytes] = set()
            for key, _ in scope.get("headers") or []:
                key = key.lower()
                if key in SINGLE_HEADERS:
                    if key in seen:
                        name = key.decode("latin-1")
                        body = f'{{"error": "the {name} header is given more than once: send it once"}}'
                        await _answer(send, 400, body.encode())
                        return
                    seen.add(key)
        await self.app(scope, receive, send)


class BearerAuth:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>` of a known token. The
    token's name (its namespace; "" for `auth_token`) goes into the request scope for the tools.

    Each MCP session belongs to the token that opened it, for as long as it lives: the token's name is
    given to the SDK's session manager as the request's user, which records it with the session and
    drops it when the session ends (closed, expired, reclaimed). A request naming a session that has
    no owner record, or another token's (a leaked or guessed `mcp-session-id`), is answered as for an
    unknown session, before the lean path or the SDK serves it."""

    def __init__(self, app: Any, tokens: dict[str, str], manager: StreamableHTTPSessionManager | None = None):
        self.app = app
        # by the header's digest: one lookup whatever the number of tokens (each compared in turn took
        # ~0.1 us a token, 97 us a request at 1,000), and no timing tells a guesser anything of a token
        self.expected = {_digest(f"Bearer {token}".encode()): name for token, name in tokens.items()}
        self.manager = manager  # None: no sessions behind this app (/metrics)
        self.users = {name: compat.session_user(name) for name in tokens.values()}

    def _namespace(self, given: bytes) -> str | None:
        return self.expected.get(_digest(given))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])  # one copy of each header read here (`OneReading`)
            namespace = self._namespace(headers.get(b"authorization", b""))
            scope[NAMESPACE_SCOPE_KEY] = namespace or ""
            if namespace is None:
                body = b'{"error": "missing or wrong bearer token (Authorization: Bearer <auth_token>)"}'
                await _answer(send, 401, body, [(b"www-authenticate", b"Bearer")])
                return
            scope["user"] = self.users[namespace]
            session = headers.get(b"mcp-session-id")
            if session is not None and self.manager is not None:
                owner = compat.http_session_owner(self.manager, session.decode("latin-1"))
                if owner != namespace:
                    await _answer(send, 404, SESSION_NOT_FOUND)  # the SDK's own answer: no session told apart
                    return
        await self.app(scope, receive, send)


class SessionShares:
    """ASGI: each token (namespace) holds at most `share` of the session-bound HTTP sessions, and all of
    them at most `total`, so one token opening sessions never keeps another from opening one.

    Over its share a token's own session that has been idle longest is reclaimed, as its idle timeout
    would end it (its host gets 404 and initializes anew): hosts that never end their sessions (a
    restart, a crash) would otherwise lock their own token out for the idle timeout. A busy session (a
    request in flight, its GET stream open: a host still there) is never reclaimed: when every one of
    the token's sessions is busy, the new one is refused with 429 naming the share. At `total`, the
    idle session of the token holding the most goes."""

    def __init__(self, app: Any, manager: StreamableHTTPSessionManager, share: int, total: int = SESSIONS_IN_ALL):
        self.app = app
        self.manager = manager
        self.share, self.total = share, total
        self.held: dict[str, dict[str, None]] = {}  # namespace -> its session ids, oldest first (ended ones pruned)
        self.opening: dict[str, int] = {}  # namespace -> its requests that may open a session, under way

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _opens_session(scope):
            await self.app(scope, receive, send)
            return
        namespace = scope_namespace(scope)
        refusal = await self._make_room(namespace)
        if refusal is not None:
            status, message = refusal
            log.warning("refused a new HTTP session: %s", message)
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}})
            await _answer(send, status, body.encode())
            return
        self.opening[namespace] = self.opening.get(namespace, 0) + 1
        counted = True

        def settle() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.opening[namespace] -= 1

        async def bind(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers") or []:
                    if key.lower() == b"mcp-session-id":
                        self.held.setdefault(namespace, {})[value.decode("latin-1")] = None
                settle()
            await send(message)

        try:
            await self.app(scope, receive, bind)
        finally:
            settle()

    def _live(self, namespace: str) -> dict[str, None]:
        """The namespace's open sessions (the ones that ended are forgotten here)."""
        live = compat.http_sessions(self.manager)
        held = self.held.get(namespace, {})
        for sid in [sid for sid in held if sid not in live]:
            del held[sid]
        return held

    async def _make_room(self, namespace: str) -> tuple[int, str] | None:
        """Room for one more session of `namespace`, reclaiming an idle one if need be; else why not."""
        # a loop: other requests may open sessions while one is being ended
        while len(self._live(namespace)) + self.opening.get(namespace, 0) >= self.share:
            if not await self._reclaim(namespace):
                who = f"token {namespace!r}" if namespace else "this gateway's local user"
                return 429, (
                    f"Too many open sessions: {who} holds its share of {self.share} (max_sessions_per_token), "
                    "every one busy; end one (DELETE) or try again when one is idle"
                )
        while len(compat.http_sessions(self.manager)) + sum(self.opening.values()) >= self.total:
            if not await self._reclaim_any(sorted(self.held, key=lambda ns: len(self._live(ns)), reverse=True)):
                return 503, f"Too many open sessions: all {self.total} are busy; try again later"
        return None

    async def _reclaim_any(self, namespaces: list[str]) -> bool:
        """An idle session of the first of `namespaces` that has one, ended; False when none has."""
        for namespace in namespaces:
            if await self._reclaim(namespace):
                return True
        return False

    async def _reclaim(self, namespace: str) -> bool:
        """End the namespace's session idle longest; False when each of its sessions is busy."""
        live = compat.http_sessions(self.manager)
        idle = [
            (since, sid)
            for sid in self._live(namespace)
            if (since := compat.http_session_idle_since(live[sid])) is not None
        ]
        if not idle:
            return False
        _, sid = min(idle)
        log.info("session %s of %s reclaimed to make room for a new one", sid, namespace or "the local user")
        del self.held[namespace][sid]
        await compat.end_http_session(self.manager, sid)
        return True


def _opens_session(scope: dict[str, Any]) -> bool:
    """A request the SDK's session manager answers by opening a session: no session id, and not of the
    2026 era (sessionless)."""
    version = None
    for key, value in scope.get("headers") or []:
        if key == b"mcp-session-id":
            return False
        if key == b"mcp-protocol-version":
            version = value.decode("latin-1")
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


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
        max_sessions=None,  # `SessionShares` caps them, per token and in all
    )
    endpoint: Any = StreamableHTTPASGIApp(manager)
    gateway.hosts.ended = lambda sid: sid not in compat.http_sessions(manager)  # forgotten for pushes
    if cfg.lean_path:  # plain calls answered beside the SDK, both eras (proxy/lean_http.py)
        lean = gateway.lean
        schema = gateway.server.get_tool_input_schema
        endpoint = LeanHttpFront(
            endpoint, manager, security, gateway.host_of, lean.run, gateway.run_modern_lean, schema, lean.server_info
        )
    endpoint = SessionShares(endpoint, manager, cfg.max_sessions_per_token)
    tokens = {t.token: t.name for t in gateway.settings.auth.all_tokens()}
    if cfg.auth_token:
        tokens[cfg.auth_token] = ""
    gateway.notices.shared = len(set(tokens.values())) > 1  # an upstream's log goes to its caller's namespace only
    metrics: Any = MetricsEndpoint(
        gateway.stats, lambda: {name: up.state for name, up in gateway.upstreams.items()}, security
    )
    if tokens:
        endpoint = BearerAuth(endpoint, tokens, manager)
        metrics = BearerAuth(metrics, tokens)
    app = Starlette(
        routes=[
            Route("/mcp", endpoint=OneReading(endpoint), methods=["GET", "POST", "DELETE"]),
            Route("/metrics", endpoint=OneReading(metrics), methods=["GET"]),
        ]
    )
    # the same endpoints and methods as Starlette's routes (with the HEAD it adds to a GET route)
    direct = {route.path: (route.endpoint, frozenset(route.methods or ())) for route in app.routes}
    return ByPath(app, direct), manager


async def serve_http(gateway: Gateway, reload: Loader | None = None, ready: anyio.Event | None = None) -> None:
    import uvicorn

    cfg = gateway.settings.gateway
    app, manager = build_http_app(gateway)
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level="warning", lifespan="off", http=compat.http_protocol()
    )
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


def _digest(header: bytes) -> bytes:
    return hashlib.sha256(header).digest()
