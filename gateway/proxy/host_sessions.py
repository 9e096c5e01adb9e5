"""What a request tells about the host connection it came from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.services.namespaced import PerNamespace

NAMESPACE_SCOPE_KEY = "mcp_context_gateway.namespace"  # set by the HTTP front's bearer check
HOSTS_PER_NAMESPACE = 64  # host connections remembered per namespace, to push notifications to


def session_id_of(ctx: ServerRequestContext[Any]) -> str:
    """The host connection a request came from (`http_session_id`), or the one stdio host."""
    request = ctx.request
    if request is not None:
        return http_session_id(request.headers.get("mcp-session-id"), namespace_of(ctx))
    return "stdio"


def http_session_id(session: str | None, namespace: str) -> str:
    """An HTTP host connection: its session id; for sessionless HTTP (2026-era hosts) one per token, so no
    tenant's figures are another's."""
    if session:
        return session
    return f"http/{namespace}" if namespace else "http"


def namespace_of(ctx: ServerRequestContext[Any]) -> str:
    """Whose data a request may see: the name of the HTTP bearer token it carried ("" = the local user)."""
    request = ctx.request
    return scope_namespace(request.scope) if request is not None else ""


def scope_namespace(scope: dict[str, Any]) -> str:
    """The namespace the HTTP front's bearer check put into an ASGI request's scope."""
    return str(scope.get(NAMESPACE_SCOPE_KEY) or "")


def client_name(ctx: ServerRequestContext[Any]) -> str | None:
    """The name the host gave in `clientInfo`: at `initialize`, or in each request's `_meta` (2026-07-28)."""
    params = getattr(ctx.session, "client_params", None)
    info = getattr(params, "client_info", None)
    if info is not None and getattr(info, "name", None):
        return info.name
    raw = (ctx.params or {}).get("_meta") if isinstance(ctx.params, dict) else None
    envelope = raw.get(types.CLIENT_INFO_META_KEY) if isinstance(raw, dict) else None
    name = envelope.get("name") if isinstance(envelope, dict) else None
    return name if isinstance(name, str) else None


def is_modern(session: Any) -> bool:
    """A host session of the 2026-07-28 era (request-scoped: no connection channel to push on)."""
    return getattr(session, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS


def asks_nothing(session: Any) -> bool:
    """A 2026-era host that declared no sampling, elicitation or roots (its calls of read-only tools may
    go to an upstream sessionless: `upstream_lean_http`)."""
    caps = getattr(session, "client_capabilities", None)
    return is_modern(session) and caps is not None and caps.sampling is caps.elicitation is caps.roots is None


def forwardable_meta(meta: Any) -> dict[str, Any]:
    """The host's `_meta` minus what belongs to the host's own connection: its progress token
    (the SDK sets its own) and the 2026 envelope keys (the upstream session speaks its own era)."""
    return {
        k: v
        for k, v in dict(meta or {}).items()
        if k not in ("progress_token", "progressToken") and not k.startswith("io.modelcontextprotocol/")
    }


def session_bound(session_id: str) -> bool:
    """An id of a session-bound HTTP session (not stdio, not a token's sessionless HTTP, `http_session_id`)."""
    return session_id != "stdio" and session_id != "http" and not session_id.startswith("http/")


class HostConnections(PerNamespace[Any]):
    """The host connections the gateway pushes to (list changes, resource updates, log messages): a share
    per namespace (`PerNamespace`), so one token's sessions never push another's out; HTTP sessions that
    ended are forgotten too (`ended`, set by the HTTP front)."""

    def __init__(self, per_namespace: int = HOSTS_PER_NAMESPACE):
        super().__init__(per_namespace)
        self.ended: Callable[[str], bool] = lambda sid: False

    def put(self, namespace: str, key: str, value: Any) -> None:
        self._prune([namespace])
        super().put(namespace, key, value)

    def items(self, namespace: str | None = None) -> list[tuple[str, Any]]:
        """(sid, session) of the open connections: of one namespace, or of all."""
        self._prune(list(self.by_namespace) if namespace is None else [namespace])
        return super().items(namespace)

    def _prune(self, namespaces: list[str]) -> None:
        for namespace in namespaces:
            held = self.by_namespace.get(namespace, {})
            for sid in [sid for sid in held if session_bound(sid) and self.ended(sid)]:
                self.pop(sid)
