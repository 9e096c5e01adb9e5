"""The lean path for the common call: `tools/call` over stdio on both sides, below the SDK's sessions.

A small call through the SDK is parsed, validated and serialized twice on each side of the gateway
(`Server` in front, `ClientSession` behind). Here the host's request is taken off the line as decoded
JSON (`LeanFront`), runs through the same `Gateway.call` and plugin pipeline as every other call, and
goes to a stdio upstream as one JSON line beside its `ClientSession` (`RawRequests`), whose reply is
taken off that line before the SDK parses it (both as the bytes arrive, `stdio_lines.line_tap`). The
result is read with the checks of the SDK's client and written with those of its server
(`parse_result`, `wire_result`), once each, so the host receives what the SDK's path would send.

Only what is plain takes this path; everything else goes through the SDK unchanged: a host of the
2026 era, a request asking for progress, params with fields beyond `name`/`arguments`/`_meta`, a
host connection not yet initialized, the HTTP front, HTTP upstreams. Cancellation is kept both ways:
the host's `notifications/cancelled` stops the call (no answer is sent, as the SDK does) and the
upstream hears a cancel for its request, as it does for a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp_types import methods as surfaces
from pydantic import ValidationError

import gateway.compat as compat
from gateway.plugin import ToolCall
from gateway.proxy.host_sessions import forwardable_meta, is_modern
from gateway.proxy.stdio_lines import Send
from gateway.proxy.stdio_lines import json_line as line

log = logging.getLogger("gateway.lean")

Progress = Callable[[], None]  # an upstream reported progress (it resets the call's clock)
CANCEL_WRITE_TIMEOUT = 2.0
ID_PREFIX = "gw-"  # the SDK's ClientSession numbers its requests; these ids are strings and never collide


class _Waiter:
    """One request's reply to come. asyncio's own future: anyio's Event and scopes look up the running
    backend on every use, a tenth of a small call's cost on this path (which is asyncio's anyway)."""

    __slots__ = ("done", "on_progress")

    def __init__(self, on_progress: Progress | None):
        self.done: asyncio.Future[dict[str, Any] | types.ErrorData] = asyncio.get_running_loop().create_future()
        self.on_progress = on_progress

    def settle(self, outcome: dict[str, Any] | types.ErrorData) -> None:
        if not self.done.done():
            self.done.set_result(outcome)


class Deadline:
    """A lean call's clock: asyncio's own timeout, moved through `deadline` as an anyio cancel scope's
    is (the same loop clock), so the upstream's bookkeeping (progress, a paused clock) treats both alike."""

    def __init__(self, seconds: float):
        self.timeout = asyncio.timeout(seconds)

    @property
    def deadline(self) -> float:
        when = self.timeout.when()
        return math.inf if when is None else when

    @deadline.setter
    def deadline(self, value: float) -> None:
        with contextlib.suppress(RuntimeError):  # the call is not running (yet, or any more): nothing to move
            self.timeout.reschedule(None if value == math.inf else value)


CLOSED = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")


class RawRequests:
    """Requests written to a stdio upstream as JSON lines beside its `ClientSession`; their replies (and
    progress) are taken off the line by `intercept` before the SDK parses them."""

    def __init__(self) -> None:
        self._send: Send | None = None
        self._pending: dict[str, _Waiter] = {}
        self._ids = itertools.count(1)

    @property
    def ready(self) -> bool:
        return self._send is not None

    def attach(self, send: Send) -> None:
        self._send = send

    def detach(self) -> None:
        """The connection ended: every request still waiting fails as the SDK's would."""
        self._send = None
        for waiter in self._pending.values():
            waiter.settle(CLOSED)

    def worth(self, line: bytes) -> bool:
        """Whether a line from the upstream may be for this path (`stdio_lines.line_tap`)."""
        return bool(self._pending)

    def intercept(self, raw: Any) -> bool:
        if not self._pending or not isinstance(raw, dict):
            return False
        rid = raw.get("id")
        if isinstance(rid, str) and rid.startswith(ID_PREFIX) and "method" not in raw:
            waiter = self._pending.get(rid)
            if waiter is not None:  # else a late reply to a cancelled request: dropped
                error = raw.get("error")
                if isinstance(error, dict):
                    try:
                        waiter.settle(types.ErrorData.model_validate(error))
                    except ValueError:
                        waiter.settle(types.ErrorData(code=types.INTERNAL_ERROR, message=str(error)[:300]))
                else:
                    result = raw.get("result")
                    waiter.settle(result if isinstance(result, dict) else {})
            return True
        if raw.get("method") == "notifications/progress":
            params = raw.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            waiter = self._pending.get(token) if isinstance(token, str) else None
            if waiter is None or waiter.on_progress is None:
                return False
            waiter.on_progress()
            return True
        return False

    async def request(self, method: str, params: dict[str, Any], on_progress: Progress | None = None) -> dict[str, Any]:
        """Send one request and wait for its result; raises MCPError like `ClientSession.send_request`
        (CONNECTION_CLOSED when the connection is gone). Cancelled, it tells the upstream."""
        send = self._send
        if send is None:
            raise MCPError(code=CLOSED.code, message=CLOSED.message)
        rid = f"{ID_PREFIX}{next(self._ids)}"
        if on_progress is not None:
            params = params | {"_meta": {**(params.get("_meta") or {}), "progressToken": rid}}
        waiter = self._pending[rid] = _Waiter(on_progress)
        try:
            await send(line({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            outcome = await waiter.done
        except asyncio.CancelledError:
            if self._send is not None:
                with anyio.move_on_after(CANCEL_WRITE_TIMEOUT, shield=True):
                    cancel = {"requestId": rid, "reason": "caller cancelled"}
                    await self._send(line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}))
            raise
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise MCPError(code=CLOSED.code, message=CLOSED.message) from None
        finally:
            self._pending.pop(rid, None)
        if isinstance(outcome, types.ErrorData):
            raise MCPError(code=outcome.code, message=outcome.message, data=outcome.data)
        return outcome or {}


PLAIN_RESULT = frozenset(("content", "isError"))
PLAIN_BLOCK = frozenset(("type", "text"))


def _plain_text_result(raw: dict[str, Any]) -> bool:
    """Text blocks and maybe `isError`, nothing else: what most tools answer. Every protocol version's
    surface accepts it unchanged, so the model alone reads it as the SDK would."""
    if not PLAIN_RESULT.issuperset(raw) or not isinstance(raw.get("isError", False), bool):
        return False
    content = raw.get("content")
    return isinstance(content, list) and all(
        type(b) is dict and b.keys() == PLAIN_BLOCK and b["type"] == "text" and type(b["text"]) is str for b in content
    )


def parse_result(version: str, raw: dict[str, Any]) -> types.CallToolResult:
    """An upstream's `tools/call` result as `ClientSession.send_request` reads it: checked against the
    negotiated version's surface, a later revision's fields dropped, then the model. Raises
    ValidationError like the SDK."""
    if _plain_text_result(raw):
        return types.CallToolResult.model_validate(raw, by_name=False)
    with contextlib.suppress(KeyError):
        surfaces.validate_server_result("tools/call", version, raw)
    if not (foreign := compat.later_revision_fields("tools/call", version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return types.CallToolResult.model_validate(raw, by_name=False)


def wire_result(version: str, result: types.CallToolResult) -> dict[str, Any]:
    """A `tools/call` result as the SDK's server puts it on the wire for a handshake-era host. Plain
    text blocks are written directly: the same dict as the SDK's dump and check, at a tenth of the cost
    (tests/unit/test_lean.py compares them for every version)."""
    plain = result.meta is None and result.structured_content is None and result.result_type == "complete"
    if plain and not result.__pydantic_extra__:
        blocks = result.content
        if all(type(b) is types.TextContent and b.annotations is None and b.meta is None for b in blocks):
            return {"content": [{"text": b.text, "type": "text"} for b in blocks], "isError": result.is_error}
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        return surfaces.serialize_server_result("tools/call", version, dumped)
    except ValidationError:
        log.exception("the tools/call result is not valid for protocol %s", version)
        raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None


PLAIN_PARAMS = frozenset(("name", "arguments", "_meta"))
Run = Callable[[ToolCall], Awaitable[types.CallToolResult]]


def _plain_call(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The params of a `tools/call` the lean path can take exactly as the SDK would, else None."""
    rid, params = raw.get("id"), raw.get("params")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or not isinstance(params, dict):
        return None
    if not PLAIN_PARAMS.issuperset(params) or not isinstance(params.get("name"), str):
        return None
    arguments, meta = params.get("arguments"), params.get("_meta")
    if arguments is not None and not isinstance(arguments, dict):
        return None
    if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
        return None  # a host that asked for progress: the SDK's path relays it
    return params


class LeanFront:
    """`tools/call` from a stdio host, taken off the line before the SDK's server parses it.

    `host` gives the host's SDK session once it is initialized and has spoken to the gateway (its
    `tools/list` comes before any call); until then, and for a 2026-era host, nothing is taken. `run`
    is the gateway's whole call: routing, the upstream, the plugin pipeline, the usage figures.
    """

    def __init__(self, host: Callable[[], Any], run: Run):
        self.host = host
        self.run = run
        # plain asyncio tasks, cancelled as such: an anyio task group's start_soon costs ~40 us a task
        # here and a cancel scope ~10 us, a large share of a small call's overhead (the stdio pipes
        # under this path are asyncio's anyway)
        self._flights: dict[str | int, asyncio.Task[None]] = {}

    def stop(self) -> None:
        """Cancel the calls still running (the host connection ended)."""
        for task in list(self._flights.values()):
            task.cancel()

    def worth(self, line: bytes) -> bool:
        """Whether a line from the host may be for this path (`stdio_lines.line_tap`): a call, or a
        cancel while calls run. Anything else (or an escaped method name) reaches `intercept` through
        the line pump."""
        return b'"tools/call"' in line or (bool(self._flights) and b'"notifications/cancelled"' in line)

    def intercept(self, send: Send) -> Callable[[Any], bool]:
        """The host reader's hook: True when the message was taken (answered later through `send`)."""

        def take(raw: Any) -> bool:
            if not isinstance(raw, dict):
                return False
            method = raw.get("method")
            if method == "tools/call":
                params = _plain_call(raw)
                if params is None:  # not plain (or no request at all: no id): the SDK answers it
                    return False
                session, rid = self.host(), raw["id"]
                if session is None or is_modern(session) or rid in self._flights:
                    return False
                self._flights[rid] = asyncio.get_running_loop().create_task(self._serve(rid, params, session, send))
                return True
            if method == "notifications/cancelled" and self._flights:
                params = raw.get("params")
                task = self._flights.get(params.get("requestId")) if isinstance(params, dict) else None
                if task is None:
                    return False
                task.cancel()  # the SDK's rule: a cancelled request is never answered
                return True
            return False

        return take

    async def _serve(self, rid: str | int, params: dict[str, Any], session: Any, send: Send) -> None:
        call = ToolCall(
            name=params["name"],
            arguments=params.get("arguments") or {},
            session_id="stdio",
            host_session=session,
            # not a request the SDK knows: an upstream's question goes out on the connection (stdio
            # has one channel), not on a request's back-channel
            request_id=None,
            meta=forwardable_meta(params.get("_meta")),
            lean=True,
        )
        # runs once this task waits for the upstream (its request written): free time for the caller
        asyncio.get_running_loop().call_soon(call.argument_tokens)
        try:
            try:
                result = wire_result(session.protocol_version, await self.run(call))
                message = {"jsonrpc": "2.0", "id": rid, "result": result}
            except MCPError as exc:
                error = exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)
                message = {"jsonrpc": "2.0", "id": rid, "error": error}
            except Exception as exc:  # as the SDK answers a handler that raised
                log.exception("tools/call %s failed", params["name"])
                message = {"jsonrpc": "2.0", "id": rid, "error": {"code": 0, "message": str(exc)}}
        except asyncio.CancelledError:
            return  # the host cancelled it (or left): never answered
        finally:
            self._flights.pop(rid, None)
        try:
            await send(line(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            log.debug("dropped the answer to %r: the host is gone", rid)
