"""What passes between upstreams and hosts besides tool calls: log levels and log messages, resource
subscriptions and their updates (handshake-era hosts, and 2026 `subscriptions/listen` streams), and
roots. Upstreams are shared by every host, so each of these is routed here: to the server that owns a
resource, to the hosts subscribed to it, to the host that made the call in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import ResourceUpdated

from gateway.proxy.host_sessions import HostConnections, is_modern, namespace_of, session_id_of
from gateway.proxy.routing import URI_SEP, Route, RoutingTable
from gateway.proxy.upstream import Upstream

log = logging.getLogger("gateway.notices")
ANY = object()  # a log message's owner on a gateway of one user: every host may read it


class Notices:
    """Subscriptions, log messages and roots, for the gateway's front server."""

    def __init__(
        self,
        routing: RoutingTable,
        hosts: HostConnections,
        remember: Callable[[ServerRequestContext[Any]], str],
        after_start: Callable[[Callable[[], Route | None]], Awaitable[Route | None]],
        wait_ready: Callable[[], Awaitable[None]],
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
    ):
        self.routing = routing
        self.upstreams = routing.upstreams
        self.hosts = hosts  # the gateway's host connections (it remembers them)
        self._remember = remember
        self._after_start = after_start
        self.wait_ready = wait_ready
        self._spawn = spawn  # start a task in the running gateway's task group
        self.bus = InMemorySubscriptionBus()  # 2026-era hosts' `subscriptions/listen` streams
        self.listen_handler = ListenHandler(self.bus)
        self.subscribers: dict[str, set[str]] = {}  # resource URI -> host sessions / listen streams watching it
        self.shared = False  # several namespaces (named tokens) on this gateway: set by the HTTP front

    def forget_servers(self, names: list[str]) -> None:
        """Subscriptions to servers that are gone (removed or restarted by a reload)."""
        for uri in [u for u in self.subscribers if u.partition(URI_SEP)[0] in names]:
            del self.subscribers[uri]

    def roots_host(self, namespace: str | None = None) -> ServerSession | None:
        """The host connection to ask when an upstream wants roots outside any call: the one host that
        declared roots (of `namespace`, whose request to that upstream is in flight). With several, whose
        roots it wants cannot be told (one caller's folders must not be shown to another's server call),
        so none is asked and the upstream hears it declined."""
        found = [
            session
            for session in self.hosts.values(namespace)
            if not is_modern(session)  # no channel for a request of ours outside its call
            and getattr(getattr(session, "client_capabilities", None), "roots", None) is not None
        ]
        return found[0] if len(found) == 1 else None

    def roots_changed(self) -> None:
        for upstream in self.upstreams.values():
            self._spawn(upstream.roots_changed)

    async def on_roots_list_changed(self, ctx: ServerRequestContext[Any], params: Any) -> None:
        """The host's roots changed: every upstream is told, and asks for them again."""
        self._remember(ctx)
        self.roots_changed()

    async def set_logging_level(self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> Any:
        """logging/setLevel to every server that declares logging (their messages come back tagged)."""
        self._remember(ctx)
        await self.wait_ready()
        request = types.SetLevelRequest(params=types.SetLevelRequestParams(level=params.level))
        for upstream in list(self.upstreams.values()):  # a reload may change the dict meanwhile
            if upstream.declares("logging"):
                try:
                    await upstream.request(
                        request, types.EmptyResult, "logging/setLevel", namespace_of(ctx), gated=False
                    )
                except MCPError as exc:
                    log.warning("logging/setLevel to %s failed: %s", upstream.name, exc.error.message)
        return types.EmptyResult()

    async def relay(self, upstream: Upstream, message: Any) -> None:
        """An upstream's log message to every host (its logger named after the server); a resource update
        to the hosts subscribed to it (handshake era) and to `subscriptions/listen` streams (2026)."""
        if isinstance(message, types.LoggingMessageNotification):
            params = message.params
            logger = f"{upstream.name}/{params.logger}" if params.logger else upstream.name
            # handshake-era hosts on their connection; a 2026 host only on the stream of a call in flight
            # to this server, at the level that call's `_meta` asked for (its session filters by it)
            owner = self._log_owner(upstream, logger, params)
            if owner is None:
                return
            for host in [h for h in self._log_readers(owner) if not is_modern(h)]:
                with suppress(Exception):  # a host that went away
                    await host.send_log_message(params.level, params.data, logger=logger)
            for host, request_id, namespace in upstream.hosts_in_flight():
                if is_modern(host) and (owner is ANY or namespace == owner):
                    with suppress(Exception):
                        await host.send_log_message(
                            params.level, params.data, logger=logger, related_request_id=request_id
                        )
            return
        raw = str(message.params.uri)
        # under the gateway's URI, and under the server's own for hosts that subscribed by that one
        uris = [f"{upstream.name}{URI_SEP}{raw}"]
        if raw in self.subscribers and self.routing.resource_route(raw) == Route(upstream.name, raw):
            uris.append(raw)
        for uri in uris:
            for sid in list(self.subscribers.get(uri, ())):
                if (host := self.hosts.get(sid)) is not None:
                    with suppress(Exception):
                        await host.send_resource_updated(uri)
            with suppress(Exception):
                await self.bus.publish(ResourceUpdated(uri))

    def _log_owner(
        self, upstream: Upstream, logger: str, params: types.LoggingMessageNotificationParams
    ) -> str | object | None:
        """Whose an upstream's log message is: `ANY` host's on a gateway of one user; on a shared one the
        namespace whose calls are in flight on the upstream. A log message carries no request id, so with
        none or several namespaces' calls in flight whose it is cannot be told, and one tenant's log lines
        must never reach another (a handshake-era host's connection or a 2026-era host's call stream):
        None, and it is logged here at debug instead."""
        if not self.shared:
            return ANY
        owners = upstream.namespaces_in_flight()
        if len(owners) == 1:
            return next(iter(owners))
        log.debug(
            "%s [%s] (sent to no host: calls of %d tokens in flight): %s",
            logger,
            params.level,
            len(owners),
            params.data,
        )
        return None

    def _log_readers(self, owner: str | object) -> list[Any]:
        """The host connections of `owner`'s namespace (every one for `ANY`)."""
        return self.hosts.values(owner if isinstance(owner, str) else None)

    async def subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> Any:
        """resources/subscribe, forwarded to the server that owns the resource (once per resource)."""
        sid = self._remember(ctx)
        route = await self._after_start(lambda: self.routing.resource_route(params.uri))
        if route is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown resource {params.uri!r}; list resources to see them.")
        if not self.routing.upstream_for(route).declares("subscribe"):
            raise MCPError(types.METHOD_NOT_FOUND, f"server '{route.server}' does not offer resource subscriptions")
        await self.add_subscriber(params.uri, sid)
        return types.EmptyResult()

    async def unsubscribe(self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> Any:
        await self.remove_subscriber(params.uri, self._remember(ctx))
        return types.EmptyResult()

    async def add_subscriber(self, uri: str, subscriber: str) -> None:
        """`subscriber` (a host connection, or a 2026 listen stream) wants updates of `uri`: the owning
        server is subscribed when the first one does."""
        route = self.routing.resource_route(uri)
        if route is None or not self.routing.upstream_for(route).declares("subscribe"):
            return
        subscribers = self.subscribers.setdefault(uri, set())
        first = not subscribers
        subscribers.add(subscriber)  # before forwarding: an update may arrive before the answer
        if first:
            try:
                await self.routing.upstream_for(route).request(
                    types.SubscribeRequest(params=types.SubscribeRequestParams(uri=route.name)),
                    types.EmptyResult,
                    f"resources/subscribe {route.name}",
                )
            except MCPError:
                subscribers.discard(subscriber)
                raise

    async def remove_subscriber(self, uri: str, subscriber: str) -> None:
        """The owning server is unsubscribed when the last subscriber lets go."""
        subscribers = self.subscribers.get(uri, set())
        subscribers.discard(subscriber)
        route = self.routing.resource_route(uri)
        if not subscribers and route is not None:
            self.subscribers.pop(uri, None)
            upstream = self.routing.upstream_for(route)
            if upstream.declares("subscribe"):
                await upstream.request(
                    types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=route.name)),
                    types.EmptyResult,
                    f"resources/unsubscribe {route.name}",
                )

    async def listen(self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams) -> Any:
        """subscriptions/listen (2026): the stream is served by the SDK's handler from the bus; the
        resources it asks to watch are subscribed at the servers that own them for as long as it lasts."""
        uris = list(params.notifications.resource_subscriptions or ())
        stream = f"listen:{session_id_of(ctx)}:{ctx.request_id}"

        async def subscribe_all() -> None:
            await self.wait_ready()
            for uri in uris:
                try:
                    await self.add_subscriber(uri, stream)
                except MCPError as exc:  # honored, and never fires (as for an unknown URI)
                    log.info("listen stream: %s cannot be watched: %s", uri, exc.error.message)

        if uris:
            # runs once the handler below has joined the bus (it does so before its first await), so
            # an update the server sends at once is not lost
            self._spawn(subscribe_all)
        try:
            return await self.listen_handler(ctx, params)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                for uri in uris:
                    with suppress(MCPError):
                        await self.remove_subscriber(uri, stream)
