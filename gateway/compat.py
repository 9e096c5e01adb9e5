"""Every private SDK, stdlib or uvicorn internal the gateway relies on, in one place.

Each was measured to be needed (see the callers' comments). They are written for `mcp` 2.3; a
different SDK version logs one warning at start so a breakage is traced here first.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio

log = logging.getLogger("gateway.compat")

WRITTEN_FOR_SDK = "2.3."


def check_sdk_version() -> str:
    """The installed `mcp` version; a warning when it is not the one these internals were written for."""
    try:
        found = version("mcp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without metadata
        return "unknown"
    if not found.startswith(WRITTEN_FOR_SDK):
        log.warning(
            "mcp %s is installed; gateway/compat.py was written for mcp %sx: if listing or stdio breaks, look there",
            found,
            WRITTEN_FOR_SDK,
        )
    return found


async def send_raw_request(session: Any, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """A request whose result is returned as the raw dict, unvalidated (the SDK validates every result
    against the schema, and one bad tool definition would fail a whole tools/list page)."""
    return await session._dispatcher.send_raw_request(method, params, None)


def write_pipe_protocol() -> Any:
    """The protocol factory asyncio's own StreamWriter uses for write pipes (flow control for drain())."""
    import asyncio

    return asyncio.streams.FlowControlMixin


def direct_sinks(stream: Any) -> tuple[Callable[[bytes], Awaitable[None]], Callable[[bytes], bool] | None]:
    """A child's stdin as a plain write-and-drain, and as a write that never waits
    (`stdio_lines.stream_sinks`). anyio's asyncio wrapper yields to the loop after every write (a
    checkpoint: one more turn of the loop per line, a tenth of a small call's cost on the lean path);
    its asyncio StreamWriter is used when it has one, else the stream's own `send` (and no write)."""
    import asyncio

    from gateway.proxy.stdio_lines import stream_sinks

    writer = getattr(stream, "_stream", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return stream.send, None
    return stream_sinks(writer)


def direct_pipe_reads(process: Any) -> None:
    """A child's pipe reads handed to their protocol inside the loop's read callback. asyncio's subprocess
    transport defers each read by a turn of the loop (`call_soon`), which keeps the pipes' data in order
    with `connection_made` while the pipes connect; once `open_process` returned, that is over (its
    queued calls ran before it returned), and the extra turn is one more `epoll_wait` and loop pass per
    upstream reply on the lean path. asyncio's Windows subprocess transport is one of these too (its
    next read is queued the same way, so order holds); transports without these internals (uvloop,
    another backend, the SDK's Windows fallback process) are left as they are."""
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    protocol = getattr(transport, "_protocol", None)
    if protocol is None or not hasattr(transport, "_pipe_data_received") or transport._pending_calls is not None:
        return
    transport._pipe_data_received = protocol.pipe_data_received


def stream_reader(stream: Any) -> Any:
    """The asyncio StreamReader under anyio's wrapper of a child's stdout, or None (another backend)."""
    import asyncio

    reader = getattr(stream, "_stream", None)
    return reader if isinstance(reader, asyncio.StreamReader) else None


def windows_executable(command: str) -> str:  # pragma: no cover - Windows only
    from mcp.os.win32.utilities import get_windows_executable_command

    return get_windows_executable_command(command)


async def windows_process(command: str, args: list[str], env: dict[str, str], errlog: Any, cwd: str | None) -> Any:
    """A child in its own Job Object, so the whole tree ends with it (pragma: Windows only)."""
    from mcp.os.win32.utilities import create_windows_process

    return await create_windows_process(command, args, env, errlog, cwd)


async def terminate_process_tree(process: Any, grace: float) -> None:
    """SIGTERM the child's process group (POSIX) or its Job Object (Windows), SIGKILL after `grace`."""
    if sys.platform == "win32":  # pragma: no cover
        from mcp.os.win32.utilities import terminate_windows_process_tree

        await terminate_windows_process_tree(process)
    else:
        from mcp.os.posix.utilities import terminate_posix_process_tree

        await terminate_posix_process_tree(process, grace)


def leave_signals_to_us(server: Any) -> None:
    """uvicorn installs its own SIGINT/SIGTERM handlers while serving; the gateway's handler must stop the
    upstreams first, so uvicorn's capture is turned off."""
    server.capture_signals = contextlib.nullcontext


MAX_REQUEST_HEAD = 64 * 1024  # a request line and headers longer than this are refused (431)
HEAD_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@functools.cache
def http_protocol() -> Any:
    """uvicorn's protocol for the HTTP front: its httptools one (a compiled parser) with a cap on a
    request's head. uvicorn's h11 protocol refuses a head over 16 KB; its httptools one keeps one in
    memory however long it grows, before any check of ours has read it (a client without a token could
    send hundreds of MB). Counted while the head is incomplete after each read; h11 without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools missing from this environment: the pure-Python parser
        return "h11"

    class CappedHead(HttpToolsProtocol):
        _head_bytes = 0
        _in_head = False

        def on_message_begin(self) -> None:
            self._head_bytes, self._in_head = 0, True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._in_head and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > MAX_REQUEST_HEAD:
                    self.transport.write(HEAD_TOO_LARGE)
                    self.transport.close()

    return CappedHead


def wire_problem(method: str, result: dict[str, Any]) -> str | None:
    """None when the front can send this result to hosts of both protocol eras; else the first problem.
    The SDK checks every outgoing result against the negotiated version's schema and fails the whole
    response on one bad item, so the gateway checks items (one tool definition) before listing them."""
    from mcp_types import methods
    from mcp_types.version import LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS
    from pydantic import ValidationError

    for era in (LATEST_HANDSHAKE_VERSION, *MODERN_PROTOCOL_VERSIONS):
        data = (
            result
            if era == LATEST_HANDSHAKE_VERSION
            else {**result, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
        )
        try:
            methods.serialize_server_result(method, era, data)
        except ValidationError as exc:
            err = exc.errors()[0]
            return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
        except (KeyError, ValueError):  # a method or version this SDK does not describe: nothing to check
            continue
    return None


@functools.cache  # a pure function of the SDK's static tables; 14 us a call uncached
def later_revision_fields(method: str, version: str) -> frozenset[str]:
    """Result keys a protocol revision newer than `version` adds, which `ClientSession` drops before it
    validates a result (the lean path reads `tools/call` results the same way)."""
    from mcp.client.session import _later_revision_fields

    return _later_revision_fields(method, version)


class _NotificationWithoutTraceback(logging.Filter):
    """The SDK's client logs a notification it cannot validate with its traceback: an upstream's
    malformed notification is the upstream's fault, said in one line (the notification is dropped)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Failed to validate notification") and record.exc_info:
            record.exc_info, record.exc_text = None, None
            record.msg = str(record.msg) + " (an upstream sent it malformed; dropped)"
        return True


def ignore_sdk_deprecations() -> None:
    """The SDK's deprecation warnings (about what hosts and servers send) are not the user's to act on."""
    import warnings

    from mcp import MCPDeprecationWarning  # the whole SDK loads with it

    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)


def quiet_sdk_notification_errors() -> None:
    logging.getLogger("client").addFilter(_NotificationWithoutTraceback())  # the SDK client session's logger


def awaits_response(session: Any, request_id: Any) -> bool:
    """Whether the SDK's client session still waits for the response with this id (its dispatcher's
    pending requests: private). True when that cannot be told (or the id is no request id), so nothing
    is ever dropped wrongly."""
    if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
        return True
    try:
        from mcp.shared.jsonrpc_dispatcher import coerce_request_id

        return coerce_request_id(request_id) in session._dispatcher._pending
    except Exception:
        return True


def late_response(awaits: Callable[[Any], bool] | None, message: Any) -> bool:
    """Whether `message` is a response the SDK's client session no longer waits for (its call was
    cancelled): the SDK drops it, so whatever it left on disk is the gateway's to release. `awaits` is
    `awaits_response` bound to the session, None before the session runs."""
    if awaits is None or not isinstance(message, dict) or "method" in message:
        return False
    return not awaits(message.get("id"))


def sse_client_events_unlimited() -> None:
    """The SDK's legacy SSE client reads its event stream through `sse_within_origin` at the default cap of
    1 MiB an event, with no parameter to lift it (Streamable HTTP has `max_sse_event_size`): a result over
    1 MiB would end the connection. Lifted as for Streamable HTTP; events over the spill threshold are
    spooled to disk before they get there."""
    import mcp.client.sse as sse
    from mcp.shared import _httpx_utils

    sse.sse_within_origin = functools.partial(_httpx_utils.sse_within_origin, max_event_size=None)  # type: ignore[attr-defined]


def http_session_transport(manager: Any, session_id: str) -> Any | None:
    """The SDK's transport of a live session-bound (handshake-era) HTTP session: the session manager's
    table of sessions and the transport's idle accounting are private. None when the session is
    unknown or ending, or the SDK's layout is not the one this was written for (then the SDK answers)."""
    transport = getattr(manager, "_server_instances", {}).get(session_id)
    if transport is None or transport.is_terminated:
        return None
    idle = getattr(transport, "idle_scope", None)
    if idle is None or idle.cancel_called or not hasattr(transport, "_requests_in_flight"):
        return None
    return transport


def http_session_listening(transport: Any) -> bool:
    """Whether the host holds the session's GET stream open: where the SDK sends a request of the
    server's that no POST of the host's is waiting for (a private table of the transport's streams)."""
    from mcp.server.streamable_http import GET_STREAM_KEY

    return GET_STREAM_KEY in getattr(transport, "_request_streams", {})


@contextlib.contextmanager
def http_request_in_flight(transport: Any) -> Any:
    """A request served beside the SDK's transport holds its session as the transport's own
    `handle_request` does: the idle countdown stops while any is served and restarts after the last."""
    transport._requests_in_flight += 1
    transport.idle_scope.deadline = math.inf
    try:
        yield
    finally:
        transport._requests_in_flight -= 1
        if not transport._requests_in_flight:
            transport.idle_scope.deadline = anyio.current_time() + transport._idle_timeout


def session_user(namespace: str) -> Any:
    """The request user the SDK's session manager records as a new session's owner (and drops with the
    session): a token's namespace as an authenticated principal."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token="", client_id=namespace, scopes=[]))


def http_session_owner(manager: Any, session_id: str) -> str | None:
    """The namespace (`session_user`) that opened a live session-bound HTTP session; None when the
    session is unknown or has no owner record (the session manager's table of owners is private)."""
    if session_id not in getattr(manager, "_server_instances", {}):
        return None
    owner = getattr(manager, "_session_owners", {}).get(session_id)
    return owner.get("client_id") if isinstance(owner, dict) else None


def http_sessions(manager: Any) -> dict[str, Any]:
    """The session manager's live session-bound sessions: id -> transport (private)."""
    return getattr(manager, "_server_instances", {})


def http_session_idle_since(transport: Any) -> float | None:
    """When an idle session's countdown ends (its deadline: the smallest has been idle longest); None
    while it is busy (a request in flight or its GET stream open) or ending."""
    idle = getattr(transport, "idle_scope", None)
    if transport.is_terminated or idle is None or idle.cancel_called or transport._requests_in_flight:
        return None
    return idle.deadline


async def end_http_session(manager: Any, session_id: str) -> None:
    """End a session as its idle timeout would: its message loop stops, and it is forgotten at once
    (its id answers 404, and its host initializes a new one)."""
    transport = getattr(manager, "_server_instances", {}).get(session_id)
    if transport is None:
        return
    if transport.idle_scope is not None:
        transport.idle_scope.cancel()
    await manager._discard_session(session_id, transport)
