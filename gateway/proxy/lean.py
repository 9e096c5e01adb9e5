"""The lean path for the common call: `tools/call` over stdio on both sides, below the SDK's sessions.

A small call through the SDK is parsed, validated and serialized twice on each side of the gateway
(`Server` in front, `ClientSession` behind). Here the host's request is taken off the line as decoded
JSON (`LeanFront`), routed as `Gateway.call` routes it, and written to a stdio upstream as one JSON
line beside its `ClientSession` (`RawRequests`), whose reply is taken off that line before the SDK
parses it (both as the bytes arrive, `stdio_lines.line_tap`). The result is read with the checks of
the SDK's client and written with those of its server (`parse_result`, `wire_result`), once each,
after the same plugin pipeline, so the host receives what the SDK's path would send. The common call
runs in the loop's read callbacks from end to end (`Clock` is its timeout); what must wait goes on in
a task through `Gateway.call`.

Only what is plain takes this path; everything else goes through the SDK unchanged: a request asking
for progress or (2026 era) a log level of its own, params with fields beyond `name`/`arguments`/`_meta`
(a 2026 host's retry with its answers), a host connection that has not spoken yet, upstreams on the
older HTTP+SSE transport. A Streamable HTTP upstream gets the call POSTed beside its session
(`upstream_lean_http.py`, this module's `RawRequests` interface). The HTTP front has a lean path of its
own (`lean_http.py`) that ends in the same `Gateway.call`. A
2026-era host's call opens its exchange (`Gateway._start_lean_modern`) and otherwise runs as any
other, in the read callbacks: an upstream's question becomes its `input_required` answer, as on the
SDK's path, and only then does the call wait for the host's retry. Cancellation is kept both ways:
the host's `notifications/cancelled` stops the call (no answer is sent, as the SDK does) and the
upstream hears a cancel for its request, as it does for a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp_types import methods as surfaces
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

import gateway.compat as compat
from gateway.plugin import ToolCall
from gateway.proxy.host_sessions import forwardable_meta, is_modern
from gateway.proxy.stdio_lines import Send, Write
from gateway.services import spill
from gateway.services.json_wire import line

log = logging.getLogger("gateway.lean")

Progress = Callable[[], None]  # an upstream reported progress (it resets the call's clock)
Outcome = dict[str, Any] | types.ErrorData  # a request's result, or its error
Settle = Callable[[Outcome], None]
CANCEL_WRITE_TIMEOUT = 2.0
ID_PREFIX = "gw-"  # the SDK's ClientSession numbers its requests; these ids are strings and never collide


class Clock:
    """A lean call's timeout as one loop timer (no task, no cancel scope). `deadline` moves it as an
    anyio cancel scope's deadline moves (the same loop clock): progress resets it, an upstream's
    question to the user parks it at infinity, so the upstream's bookkeeping treats both alike.
    `expired` runs once, when the deadline passes."""

    def __init__(self, seconds: float, expired: Callable[[], None]):
        self._loop = asyncio.get_running_loop()
        self._expired: Callable[[], None] | None = expired
        self._deadline = self._loop.time() + seconds
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(self._deadline, self._fire)

    @property
    def deadline(self) -> float:
        return self._deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self._deadline = value
        if self._timer is None and self._expired is not None and value != math.inf:
            self._timer = self._loop.call_at(value, self._fire)  # an earlier deadline fires, sees this one, re-arms

    @property
    def running(self) -> bool:
        return self._expired is not None

    def _fire(self) -> None:
        self._timer = None
        if self._expired is None or self._deadline == math.inf:
            return
        if self._loop.time() < self._deadline:  # moved later meanwhile
            self._timer = self._loop.call_at(self._deadline, self._fire)
            return
        expired, self._expired = self._expired, None
        expired()

    def stop(self) -> None:
        self._expired = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


CLOSED = types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed")


class RawRequests:
    """Requests written to a stdio upstream as JSON lines beside its `ClientSession`; their replies (and
    progress) are taken off the line by `intercept` before the SDK parses them."""

    def __init__(self) -> None:
        self._send: Send | None = None
        self._write: Write | None = None
        self._pending: dict[str, tuple[Settle, Progress | None]] = {}
        self._ids = itertools.count(1)
        self._cancels: set[asyncio.Task[None]] = set()  # cancels waiting for a peer that is behind
        # whether the SDK's session beside us still waits for a response id (set once it runs)
        self.sdk_awaits: Callable[[Any], bool] | None = None

    @property
    def ready(self) -> bool:
        """Whether requests can be written now (a stdio upstream whose pipe has a writer that never waits)."""
        return self._write is not None

    def attach(self, send: Send, write: Write | None) -> None:
        self._send, self._write = send, write

    def detach(self) -> None:
        """The connection ended: every request still waiting fails as the SDK's would."""
        self._send = self._write = None
        pending, self._pending = self._pending, {}
        for settle, _ in pending.values():
            try:
                settle(CLOSED)
            except Exception:  # one caller's failure leaves no other waiting
                log.exception("a lean request could not be failed")

    def worth(self, line: bytes) -> bool:
        """Whether a line from the upstream may be for this path (`stdio_lines.line_tap`)."""
        return bool(self._pending)

    def intercept(self, raw: Any) -> bool:
        if not isinstance(raw, dict):
            return False
        rid = raw.get("id")
        if isinstance(rid, str) and rid.startswith(ID_PREFIX) and "method" not in raw:
            waiting = self._pending.pop(rid, None)
            if waiting is not None:
                waiting[0](_outcome(raw))
            else:  # a late reply to a cancelled request: dropped, and the files it left on disk with it
                spill.discard(raw)
            return True
        if spill.pending() and compat.late_response(self.sdk_awaits, raw):
            spill.discard(raw)  # the SDK would drop it (its call was cancelled) and never release its files
            return True
        if not self._pending:
            return False
        if raw.get("method") == "notifications/progress":
            params = raw.get("params")
            token = params.get("progressToken") if isinstance(params, dict) else None
            waiting = self._pending.get(token) if isinstance(token, str) else None
            if waiting is None or waiting[1] is None:
                return False
            waiting[1]()
            return True
        return False

    def start(
        self, method: str, params: dict[str, Any], settle: Settle, on_progress: Progress | None = None
    ) -> str | None:
        """Write one request now and return its id; `settle` is called once with its result (a dict) or
        its error (`CLOSED` when the connection ends), from the loop's read callback that brought it.
        None when nothing was written: no connection, or the upstream is behind (then the caller waits
        its turn on the SDK's path)."""
        write = self._write
        if write is None:
            return None
        rid = f"{ID_PREFIX}{next(self._ids)}"
        if on_progress is not None:
            params = params | {"_meta": {**(params.get("_meta") or {}), "progressToken": rid}}
        try:
            if not write(line({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})):
                return None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return None
        self._pending[rid] = (settle, on_progress)
        return rid

    def cancel(self, rid: str, reason: str = "caller cancelled") -> None:
        """Stop waiting for `rid` (its `settle` is never called) and tell the upstream, as the SDK does
        for a request given up on. Best effort: a connection that is gone hears nothing."""
        if self._pending.pop(rid, None) is None:
            return  # answered already
        cancel = line(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid, "reason": reason}}
        )
        try:
            if self._write is not None and self._write(cancel):
                return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        if self._send is not None:  # the upstream is behind: the cancel waits its turn
            spawn(self._cancels, self._send_late(self._send, cancel, rid))

    @staticmethod
    async def _send_late(send: Send, data: bytes, rid: str) -> None:
        with anyio.move_on_after(CANCEL_WRITE_TIMEOUT):
            await _deliver(send, data, f"the cancel of {rid}")


def _outcome(raw: dict[str, Any]) -> Outcome:
    """A JSON-RPC reply's result, or its error as the SDK reads it."""
    error = raw.get("error")
    if isinstance(error, dict):
        try:
            return types.ErrorData.model_validate(error)
        except ValueError:
            return types.ErrorData(code=types.INTERNAL_ERROR, message=str(error)[:300])
    result = raw.get("result")
    return result if isinstance(result, dict) else {}


PLAIN_RESULT = frozenset(("content", "isError", "structuredContent"))
PLAIN_BLOCK = frozenset(("type", "text"))


def _plain_text_result(raw: dict[str, Any]) -> bool:
    """Text blocks, maybe `isError` and a `structuredContent` object, nothing else: what most tools answer
    (servers with an output schema send both). Every protocol version's surface accepts it unchanged, so
    the model alone reads it as the SDK would."""
    if not PLAIN_RESULT.issuperset(raw) or not isinstance(raw.get("isError", False), bool):
        return False
    if "structuredContent" in raw and type(raw["structuredContent"]) is not dict:
        return False
    content = raw.get("content")
    return isinstance(content, list) and all(
        type(b) is dict and b.keys() == PLAIN_BLOCK and b["type"] == "text" and type(b["text"]) is str for b in content
    )


def parse_result(version: str, raw: dict[str, Any]) -> types.CallToolResult:
    """An upstream's `tools/call` result as `ClientSession.send_request` reads it: checked against the
    negotiated version's surface, a later revision's fields dropped, then the model. Raises
    ValidationError like the SDK."""
    if _plain_text_result(raw):  # already checked field by field: built without a second validation
        return types.CallToolResult.model_construct(
            content=[types.TextContent.model_construct(type="text", text=b["text"]) for b in raw["content"]],
            is_error=raw.get("isError", False),
            structured_content=raw.get("structuredContent"),
        )
    with contextlib.suppress(KeyError):
        surfaces.validate_server_result("tools/call", version, raw)
    if not (foreign := compat.later_revision_fields("tools/call", version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return types.CallToolResult.model_validate(raw, by_name=False)


def wire_result(version: str, result: types.CallToolResult | types.InputRequiredResult) -> dict[str, Any]:
    """A `tools/call` result as the SDK's server puts it on the wire for the host's protocol version. Plain
    text blocks are written directly (a 2026-era host's with its `resultType`): the same dict as the SDK's
    dump and check, at a tenth of the cost (tests/unit/test_lean.py compares the bytes for every version)."""
    if isinstance(result, types.InputRequiredResult):
        return _serialized(version, result)
    plain = result.meta is None and result.result_type == "complete"
    if plain and not result.__pydantic_extra__:
        blocks = result.content
        if all(type(b) is types.TextContent and b.annotations is None and b.meta is None for b in blocks):
            out = {"content": [{"text": b.text, "type": "text"} for b in blocks], "isError": result.is_error}
            if version in MODERN_PROTOCOL_VERSIONS:
                out["resultType"] = "complete"
            if result.structured_content is not None:
                out["structuredContent"] = result.structured_content
            return out
    return _serialized(version, result)


def _serialized(version: str, result: types.CallToolResult | types.InputRequiredResult) -> dict[str, Any]:
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    try:
        return surfaces.serialize_server_result("tools/call", version, dumped)
    except ValidationError:
        log.exception("the tools/call result is not valid for protocol %s", version)
        raise MCPError(code=types.INTERNAL_ERROR, message="Handler returned an invalid result") from None


PLAIN_PARAMS = frozenset(("name", "arguments", "_meta"))
Run = Callable[[ToolCall], Awaitable[types.CallToolResult]]
Modern = Callable[[ToolCall], Awaitable[types.CallToolResult | types.InputRequiredResult]]
Stamp = Callable[[], dict[str, Any]] | None  # the gateway's `serverInfo`, as 2026-era results carry it
Done = Callable[[types.CallToolResult], None]
Start = Callable[[ToolCall, Done], Callable[[], None] | None]
Asked = Callable[[types.InputRequiredResult], bool]  # an upstream's first question, as the host's answer
StartModern = Callable[[ToolCall, Done, Asked], Callable[[], None] | None]
Record = Callable[[ToolCall, types.CallToolResult, types.CallToolResult], None]  # the usage figures of a call
Finish = Callable[[ToolCall, types.CallToolResult], types.CallToolResult | Coroutine[Any, Any, types.CallToolResult]]


def plain_call(raw: dict[str, Any]) -> dict[str, Any] | None:
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
    if meta is not None and types.LOG_LEVEL_META_KEY in meta:
        return None  # a 2026 host's log level for this request: the SDK's path scopes the logs to it
    return params


class LeanFront:
    """`tools/call` from a stdio host, taken off the line before the SDK's server parses it.

    `host` gives the host's SDK session once it is initialized and has spoken to the gateway (its
    `tools/list` comes before any call; a 2026-era host's session once it has sent a request); until
    then nothing is taken.

    The common call never waits in a task: inside the read callback that brought the host's line,
    `start` routes it and writes it to its upstream; inside the one that brings the upstream's reply,
    `finish` runs the plugins that decide at once, the answer is written to the host and then
    `record` takes the usage figures (work done while the other side reads, not a turn later). Each
    turn of the event loop and each task costs a small call as much as its parsing does, twice over
    on a busy 2-core machine (`bench/proxy_overhead.py`: 1.32-1.34x direct before, 1.18-1.26x after).
    Whatever must wait (an own tool, an upstream still starting, a plugin writing a file, a host that
    is behind) goes on in a task, where `run` is the gateway's whole call.
    """

    def __init__(
        self,
        host: Callable[[], Any],
        run: Run,
        start: Start,
        finish: Finish,
        record: Record,
        run_modern: Modern,
        start_modern: StartModern,
    ):
        self.host = host
        self.run = run
        self.run_modern = run_modern
        self.start_modern = start_modern
        self.server_info: Stamp = None  # set once the SDK's server exists
        self.start = start
        self.finish = finish
        self.record = record
        # how to stop each call in flight: a task's cancel (plain asyncio tasks: an anyio task group's
        # start_soon costs ~40 us a task here), or the upstream request's own
        self._flights: dict[str | int, Callable[[], Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Cancel the calls still running (the host connection ended)."""
        for cancel in list(self._flights.values()):
            cancel()
        self._flights.clear()

    def worth(self, line: bytes) -> bool:
        """Whether a line from the host may be for this path (`stdio_lines.line_tap`): a call, or a
        cancel while calls run. Anything else (or an escaped method name) reaches `intercept` through
        the line pump."""
        return b'"tools/call"' in line or (bool(self._flights) and b'"notifications/cancelled"' in line)

    def intercept(self, send: Send, write: Write) -> Callable[[Any], bool]:
        """The host reader's hook: True when the message was taken (answered later through `write`, or
        `send` when the host is behind)."""

        def take(raw: Any) -> bool:
            if not isinstance(raw, dict):
                return False
            method = raw.get("method")
            if method == "tools/call":
                params = plain_call(raw)
                if params is None:  # not plain (or no request at all: no id): the SDK answers it
                    return False
                session, rid = self.host(), raw["id"]
                if session is None or rid in self._flights:
                    return False
                self._begin(rid, self._call(params, session), session, send, write)
                return True
            if method == "notifications/cancelled" and self._flights:
                params = raw.get("params")
                rid = params.get("requestId") if isinstance(params, dict) else None
                # a peer's id is a key only when it is one a JSON-RPC id may be (a list is unhashable)
                cancel = (
                    self._flights.pop(rid, None) if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None
                )
                if cancel is None:
                    return False
                cancel()  # the SDK's rule: a cancelled request is never answered
                return True
            return False

        return take

    @staticmethod
    def _call(params: dict[str, Any], session: Any) -> ToolCall:
        return ToolCall(
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

    def _begin(self, rid: str | int, call: ToolCall, session: Any, send: Send, write: Write) -> None:
        """Route the call and write it to its upstream now; the task's path when that cannot be done
        without waiting. A 2026-era host's call opens its exchange too (an upstream's question becomes
        its `input_required` answer), with no task unless the upstream asks."""
        modern = is_modern(session)

        def done(result: types.CallToolResult) -> None:
            self._answer(rid, call, session, send, write, result)

        def asked(question: types.InputRequiredResult) -> bool:
            stop = self._flights.pop(rid, None)
            if stop is None:
                return False  # cancelled meanwhile: nobody to ask
            try:
                data = line(_message(rid, session, question, self.server_info))
            except Exception as exc:  # a question that cannot be written (nested too deeply): the call ends here
                stop()
                self._write(send, write, line(_failed(rid, call.name, exc)), rid)
                return False
            self._write(send, write, data, rid)
            return True

        try:
            cancel = self.start_modern(call, done, asked) if modern else self.start(call, done)
        except RecursionError:  # arguments too deep to encode: the task's path answers it in one line
            cancel = None
        except Exception:  # the task's path answers it (and logs what failed there)
            log.exception("starting tools/call %s on the lean path failed", call.name)
            cancel = None
        if cancel is None:
            work = (
                self._reply(rid, call.name, session, send, self.run_modern(call))
                if modern
                else self._serve(rid, call, session, send)
            )
            self._flights[rid] = spawn(self._tasks, work).cancel
            asyncio.get_running_loop().call_soon(call.argument_tokens)  # once the task waits for the upstream
            return
        self._flights[rid] = cancel
        call.argument_tokens()  # the request is written: the upstream works meanwhile

    def _write(self, send: Send, write: Write, data: bytes, rid: str | int) -> None:
        """An answer from a read callback: written now, or by a task when the host is behind."""
        try:
            if not write(data):
                spawn(self._tasks, _deliver(send, data, f"the answer to {rid!r}"))  # the host is behind
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            log.debug("dropped the answer to %r: the host is gone", rid)

    def _answer(self, rid: str | int, call: ToolCall, session: Any, send: Send, write: Write, result: Any) -> None:
        """The upstream's result, in the read callback that brought it: through the plugins and back
        to the host at once, or in a task when a plugin must wait."""
        if self._flights.pop(rid, None) is None:
            return  # cancelled meanwhile: never answered
        reply: Any = None
        try:
            reply = self.finish(call, result)
            if not isinstance(reply, types.CallToolResult):  # the rest of the plugins, awaited
                self._flights[rid] = spawn(self._tasks, self._reply(rid, call.name, session, send, reply)).cancel
                return
            data = line(_message(rid, session, reply, self.server_info))
        except Exception as exc:  # a bug: answered as the SDK answers a handler that raised
            reply = None
            data = line(_failed(rid, call.name, exc))
        self._write(send, write, data, rid)
        if isinstance(reply, types.CallToolResult):  # answered: the host reads it meanwhile
            self.record(call, result, reply)

    async def _serve(self, rid: str | int, call: ToolCall, session: Any, send: Send) -> None:
        await self._reply(rid, call.name, session, send, self.run(call))

    async def _reply(
        self,
        rid: str | int,
        name: str,
        session: Any,
        send: Send,
        work: Awaitable[types.CallToolResult | types.InputRequiredResult],
    ) -> None:
        try:
            message = await answered(rid, name, session, work, self.server_info)
        except asyncio.CancelledError:
            return  # the host cancelled it (or left): never answered
        finally:
            self._flights.pop(rid, None)
        await _deliver(send, line(message), f"the answer to {rid!r}")


async def answered(
    rid: str | int,
    name: str,
    session: Any,
    work: Awaitable[types.CallToolResult | types.InputRequiredResult],
    stamp: Stamp = None,
) -> dict[str, Any]:
    """The host's answer to the call `work` runs: its result as the SDK's server writes it, or the error
    the SDK would send (a cancel goes on to the caller)."""
    try:
        return _message(rid, session, await work, stamp)
    except MCPError as exc:
        return _error(rid, exc)
    except Exception as exc:
        return _failed(rid, name, exc)


def _message(
    rid: str | int, session: Any, result: types.CallToolResult | types.InputRequiredResult, stamp: Stamp = None
) -> dict[str, Any]:
    """The host's answer: the result as the SDK's server writes it, or the error it would send. A 2026-era
    result carries the server's `serverInfo` in `_meta` (`stamp`), unless it has one."""
    version = session.protocol_version
    try:
        wire = wire_result(version, result)
    except MCPError as exc:
        return _error(rid, exc)
    if stamp is not None and version in MODERN_PROTOCOL_VERSIONS:
        meta = wire.get("_meta")
        if meta is None or (isinstance(meta, dict) and meta.get(types.SERVER_INFO_META_KEY) is None):
            wire["_meta"] = {**(meta or {}), types.SERVER_INFO_META_KEY: stamp()}
    return {"jsonrpc": "2.0", "id": rid, "result": wire}


def _error(rid: str | int, exc: MCPError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": exc.error.model_dump(by_alias=True, mode="json", exclude_none=True)}


def _failed(rid: str | int, name: str, exc: Exception) -> dict[str, Any]:
    """As the SDK answers a handler that raised."""
    log.error("tools/call %s failed", name, exc_info=exc)
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": 0, "message": str(exc)}}


async def _deliver(send: Send, data: bytes, what: str) -> None:
    """One line through a sink that may wait; a peer that is gone hears nothing."""
    try:
        await send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        log.debug("dropped %s: the peer is gone", what)


def spawn(tasks: set[asyncio.Task[None]], work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """`work` as a plain asyncio task, kept in `tasks` until it ends (the loop keeps only a weak
    reference to a task)."""
    task = asyncio.get_running_loop().create_task(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task
