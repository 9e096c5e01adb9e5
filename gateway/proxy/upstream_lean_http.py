"""The lean path's leg to a Streamable HTTP upstream: a plain `tools/call` POSTed beside the SDK's session.

Through the SDK, every call to an HTTP upstream runs its client's per-POST task, memory streams, SSE
handling and `ClientSession`, on httpx: measured, that leg was most of the gateway's CPU for a small
call. Here the call's JSON-RPC request is POSTed with the leg's own client (`upstream_client.py`) on the
session the SDK opened (its `Mcp-Session-Id` and `MCP-Protocol-Version`, the configured headers), and the
answer is read from the JSON body or the SSE events, as the SDK reads them:

- the reply with this call's id settles it at once (the stream is read on briefly, so the connection
  is reused); a JSON-RPC error, an HTTP error (404: the session ended, as the SDK says it), a body or
  event that is not JSON settle it as the SDK would; a same-origin 307/308 is followed and a stream that
  ends before the reply is resumed from its last event id, as the SDK's client does;
- the call's progress resets its clock; every other message on its stream (the server's questions,
  its logs, its notifications) goes to the SDK's session as if its own transport had read it;
- long bodies and long SSE lines are spooled to disk as they stream, like the SDK leg's
  (`upstream_http.SpoolingTransport`), and every response's bytes count as a sign of life.

A call of a 2026-era host that declared no sampling, elicitation or roots, to a tool its server declares
read-only or idempotent, goes to an upstream that speaks that era too (its `server/discover`, asked once
per connection, lists it) as that era's sessionless request: its envelope, its routing headers, no
session (`Upstream.start_lean` picks the calls: `upstream.sessionless_tools`). The upstream then answers
it as it would answer that host directly (plain JSON, no event stream kept per call: 10-40 % less of its
CPU for a small call in the SDK's server, measured); the host asked for no logs. The call is made again
on the session, its clock started again, when the answer tells less than the session's would: the tool
asked its client something all the same (`input_required`, or the SDK's no-back-channel error), so its
question becomes the host's `input_required` round as before, and the tool stays on the session; its
handler failed (that era hides the cause); the request was refused as that era's (a header mismatch, an
unsupported version, a 400/404/405 not in its name), and the upstream's later calls go to the session
too. Those tools run twice up to that point, which is why only tools declared read-only or idempotent
go. A server that answers its session with plain JSON (the SDK's `json_response` mode) keeps every call
on the session: its 2026-era requests are not watched, so a cancel (a closed connection) would not stop
them.

The interface is `lean.RawRequests`' (the stdio leg): `Upstream.start_lean` uses either.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from types import SimpleNamespace
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.shared.inbound import encode_header_value
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.proxy.lean import CLOSED, ID_PREFIX, Progress, Settle, _outcome
from gateway.proxy.upstream_http import DRAIN_SECONDS, SpoolingTransport, _read, _read_event_line
from gateway.services import spill
from gateway.services.json_wire import dumps, loads, loads_as_sdk
from gateway.services.spill import LineBuffer

log = logging.getLogger(__name__)

SHORT_BODY = 64 * 1024  # without a spiller, a body up to this long (by its Content-Length) is read whole
CANCEL_SECONDS = 5.0  # a cancel's POST waits at most this long
MAX_REDIRECTS = 20  # same-origin 307/308 redirects followed, as httpx's client follows them for the SDK
RESUME_ATTEMPTS = 2  # GETs with Last-Event-ID after a stream ends before its reply (the SDK's count)
RESUME_DELAY = 1.0  # seconds before one, unless the server said (`retry:`)
POST_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
DISCOVER_ID = f"{ID_PREFIX}discover"
# a sessionless request the upstream refused as such (its routing headers, its era): asked on the session
REFUSED_SESSIONLESS = frozenset((types.HEADER_MISMATCH, types.UNSUPPORTED_PROTOCOL_VERSION))
# an HTTP error to a sessionless request that does not answer it by its id (a server that wants a session)
NOT_THIS_ERA = types.ErrorData(code=types.INVALID_REQUEST, message="refused as a sessionless request")
HTTP_FAILED = types.ErrorData(code=types.INTERNAL_ERROR, message="Server returned an error response")  # as the SDK


class HttpRawRequests:
    """Requests POSTed to one Streamable HTTP upstream beside its `ClientSession` (`lean.RawRequests`' interface)."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        spooling: SpoolingTransport,
        heard: Any,
        client_info: dict[str, Any] | None = None,
        asking: set[Any] | None = None,
    ) -> None:
        self.url = url
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.spooling = spooling  # its spiller, and the SDK session's headers it saw
        # reads a spooled message back as `SpoolingTransport` does, but never drops it as a reply the SDK's
        # session gave up on: this leg's replies are not the session's (a late one is dropped in `_post`)
        self._reader = SimpleNamespace(spiller=spooling.spiller, awaits=None)
        self.heard = heard
        self._session: dict[str, str] | None = None  # the SDK session's headers, once it is ready
        self._inject: anyio.abc.ObjectSendStream[SessionMessage | Exception] | None = None
        self._client: Any = None  # the UpstreamClient, made on the first call
        self._pending: dict[str, tuple[asyncio.Task[None], Settle]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._warned = False  # a failing call was logged at warning (once per connection)
        self.client_info = client_info  # the gateway's, as its session's `initialize` gave it
        self.modern: str | None = None  # the 2026-era version the upstream said it speaks (`_discover`)
        # sessionless call -> its request as the session's, the progress callback, the tool
        self._retry: dict[str, tuple[dict[str, Any], Progress | None, Any]] = {}
        # tools that asked their client something when called so: called on the session (the upstream's, so
        # that it outlives this connection)
        self._asking: set[Any] = asking if asking is not None else set()
        self._discovering: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return self._session is not None and self._inject is not None

    def attach(self, inject: anyio.abc.ObjectSendStream[SessionMessage | Exception]) -> None:
        """The SDK's transport is up; messages that are not this leg's go to its session through `inject`."""
        self._inject = inject

    def session_ready(self) -> None:
        """The SDK's session finished its handshake: its headers (seen on its last POST) are this leg's."""
        seen = self.spooling.session_headers
        self._session = dict(seen) if seen is not None else None
        self.modern = None
        if self._session is not None:
            self._discovering = self._spawn(self._discover())

    def detach(self) -> None:
        """The connection ended: every request still waiting fails as the SDK's would."""
        self._session = self._inject = self.modern = None
        self._retry.clear()
        if self._discovering is not None:
            self._discovering.cancel()
        pending, self._pending = self._pending, {}
        for task, settle in pending.values():
            task.cancel()
            try:
                settle(CLOSED)
            except Exception:  # one caller's failure leaves no other waiting
                log.exception("a lean request could not be failed")
        if self._client is not None:
            client, self._client = self._client, None
            self._spawn(client.close())

    def start(
        self,
        method: str,
        params: dict[str, Any],
        settle: Settle,
        on_progress: Progress | None = None,
        sessionless: bool = False,
    ) -> str | None:
        """POST one request (in a task) and return its id; `settle` is called once with its result or
        error. None when the leg is not ready (the caller takes the SDK's path). `sessionless`: the
        caller asks nothing of the host (a 2026-era one that declared no sampling, elicitation or
        roots), so an upstream of that era may take it as that era's request."""
        if not self.ready:
            return None
        rid = f"{ID_PREFIX}{next(self._ids)}"
        if on_progress is not None:
            params = params | {"_meta": {**(params.get("_meta") or {}), "progressToken": rid}}
        request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        headers = None
        tool = params.get("name")
        if sessionless and (version := self.modern) is not None and tool not in self._asking:
            self._retry[rid] = (request, on_progress, tool)  # encoded if it is made on the session
            meta = {**(params.get("_meta") or {}), **self._envelope(version)}
            body = dumps(request | {"params": params | {"_meta": meta}})
            headers = self._modern_headers(version, method, tool)
        else:
            body = dumps(request)
        task = asyncio.get_running_loop().create_task(self._post(rid, body, on_progress, headers))
        self._pending[rid] = (task, settle)
        return rid

    def cancel(self, rid: str, reason: str = "caller cancelled") -> None:
        """Stop waiting for `rid` (its `settle` is never called) and tell the upstream, as the SDK does."""
        waiting = self._pending.pop(rid, None)
        if waiting is None:
            return  # answered already
        waiting[0].cancel()
        if self._retry.pop(rid, None) is not None:
            return  # sessionless: the closed connection is its cancel (the session never saw this id)
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid, "reason": reason}}
        self._spawn(self._send_cancel(dumps(note)))

    # -- the exchange ------------------------------------------------------------------------------

    def _settle(self, rid: str, outcome: Any) -> None:
        """`rid`'s outcome to its caller, once; a reply nobody waits for any more leaves no files behind.
        A sessionless call's result is read as the session's would be (without the era's own fields); one
        that asked, failed inside its handler, or was refused as that era's is made again on the session,
        with its clock started again."""
        if (retry := self._retry.pop(rid, None)) is not None:
            request, on_progress, tool = retry
            again = True
            if outcome is NOT_THIS_ERA or (
                isinstance(outcome, types.ErrorData) and outcome.code in REFUSED_SESSIONLESS
            ):
                if self.modern is not None:  # it said it speaks the era, then refused it
                    log.warning(
                        "upstream %s refused a 2026-era request (%s): calls go to its session", self.url, outcome
                    )
                    self.modern = None
            elif (
                isinstance(outcome, types.ErrorData)
                and outcome.code == types.INVALID_REQUEST
                and ("back-channel" in outcome.message)
            ):  # the SDK's answer when the tool asked its client something: no back-channel on such a request
                self._asking.add(tool)
            elif isinstance(outcome, types.ErrorData) and outcome.code == types.INTERNAL_ERROR:
                # that era hides what a failing handler raised, the session's answer says it; but a server
                # that failed at the HTTP level (a 5xx, a 429) is not asked again at once
                again = outcome is not HTTP_FAILED
            elif isinstance(outcome, dict) and outcome.get("resultType", "complete") != "complete":
                self._asking.add(tool)  # input_required: it asks
                spill.discard(outcome)
            else:
                again = False
                if isinstance(outcome, dict):
                    _as_session_result(outcome)
            if again and rid in self._pending:
                if on_progress is not None:  # the clock starts again: the call is made anew
                    on_progress()
                task = asyncio.get_running_loop().create_task(self._post(rid, dumps(request), on_progress))
                self._pending[rid] = (task, self._pending[rid][1])
                return
        waiting = self._pending.pop(rid, None)
        if waiting is None:
            if isinstance(outcome, dict):
                spill.discard(outcome)
            return
        waiting[1](outcome)

    async def _post(
        self, rid: str, body: bytes, on_progress: Progress | None, headers: dict[str, str] | None = None
    ) -> None:
        try:
            await self._exchange(rid, body, on_progress, headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection failed: as the SDK's transport answers it
            if not self._warned:  # the SDK's path would meet the same cause: said once, not per call
                self._warned = True
                log.warning(
                    "a lean call to %s failed (%s: %s); later ones are logged at debug",
                    self.url,
                    type(exc).__name__,
                    exc,
                )
            else:
                log.debug("lean POST to %s failed: %s", self.url, exc)
        waiting = self._pending.get(rid)
        if waiting is not None and waiting[0] is asyncio.current_task():  # not settled, nor asked again
            self._settle(rid, CLOSED)

    async def _exchange(
        self, rid: str, body: bytes, on_progress: Progress | None, headers: dict[str, str] | None = None
    ) -> None:
        client = self._connection()
        url = self.url
        headers = headers or self._headers()
        for _ in range(MAX_REDIRECTS + 1):
            async with client.post(url, data=body, headers=headers, allow_redirects=False) as response:
                self.heard()
                if response.status in (307, 308) and (url := _within_origin(url, response)) is not None:
                    await response.read()  # the connection goes back to the pool
                    continue
                kind = response.headers.get("content-type", "").lower()
                if kind.startswith("text/event-stream") and response.status < 300:
                    await self._stream(rid, response, on_progress)
                else:
                    self._settle(rid, await self._answer(response, kind, rid))
                return
        self._settle(rid, types.ErrorData(code=types.INVALID_REQUEST, message="too many redirects"))

    async def _answer(self, response: Any, kind: str, rid: str) -> Any:
        """A reply that is not an event stream, as the SDK reads it; one naming another request's id (a
        server's mistake) is not this call's answer: it is told so at once, not left to its clock."""
        if 300 <= response.status < 400:  # a redirect the SDK would not follow either
            where = _shown(response.headers.get("location", ""), self.url)
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"Redirect to {where} not followed")
        if response.status >= 400:
            return await self._http_error(response, kind, rid)
        if response.status == 202:
            return types.ErrorData(code=types.INVALID_REQUEST, message="server answered a request with 202 Accepted")
        if kind.startswith("application/json"):
            raw = await self._body(response)
            if not (isinstance(raw, dict) and ("result" in raw or "error" in raw)):
                return _unread()
            if raw.get("id") != rid:
                if isinstance(raw.get("result"), dict):
                    spill.discard(raw["result"])
                return types.ErrorData(code=types.INTERNAL_ERROR, message="the server answered another request's id")
            return _outcome(raw)
        return types.ErrorData(code=types.INVALID_REQUEST, message=f"Unexpected content type: {kind}")

    async def _http_error(self, response: Any, kind: str, rid: str) -> types.ErrorData:
        """A non-2xx answer as the SDK reads it: the JSON-RPC error in the body, else one for the status.
        To a sessionless request, a 400, 404 or 405 that does not answer it by its id is a refusal of the
        request as such (`NOT_THIS_ERA`: it is made on the session); a 5xx or 429 is this call's failure."""
        refusal = rid in self._retry and response.status in (400, 404, 405)
        if kind.startswith("application/json"):
            try:
                raw = loads_as_sdk(await response.read())
                if isinstance(raw, dict) and isinstance(raw.get("error"), dict):
                    if refusal and raw.get("id") != rid:
                        return NOT_THIS_ERA
                    return types.ErrorData.model_validate(raw["error"])
            except ValueError:
                pass
        if refusal:
            return NOT_THIS_ERA
        if response.status == 404:
            if "mcp-session-id" not in (self._session or {}):
                return types.ErrorData(code=types.METHOD_NOT_FOUND, message="Not Found")
            return types.ErrorData(code=types.INVALID_REQUEST, message="Session terminated")
        return HTTP_FAILED

    async def _body(self, response: Any) -> Any:
        """A JSON body, spooled to disk as it streams once it is long (its long strings stay there); one
        that says it is short, uncompressed (a compressed length says nothing of the text's), is read whole."""
        spiller = self.spooling.spiller
        length = response.content_length
        if (
            length is not None
            and length <= (spiller.threshold if spiller is not None else SHORT_BODY)
            and response.headers.get("content-encoding", "identity").lower() == "identity"
        ):
            try:
                return loads_as_sdk(await response.read())
            except ValueError:
                return None
            finally:
                self.heard()
        body = LineBuffer(spiller)
        try:
            async for chunk in response.content.iter_any():
                self.heard()
                body.add(chunk)
            done = body.take()
            return loads_as_sdk(done if isinstance(done, bytes) else await _read(self._reader, done))
        except ValueError:
            return None
        finally:
            body.discard()

    async def _stream(self, rid: str, response: Any, on_progress: Progress | None) -> None:
        """The call's event stream: settled at its reply, as the SDK is; every other message goes to the
        SDK's session. After the reply the stream is read on briefly (the server closes it then) so the
        connection can be reused. A stream that ends first is resumed from its last event id with GETs,
        as the SDK's client does; without an id, the call fails as there."""
        reader = _Sse(self, response)
        try:
            if await self._until_reply(rid, reader, on_progress):
                with anyio.move_on_after(DRAIN_SECONDS):
                    while (data := await reader.next()) is not None:
                        await self._event(rid, data, on_progress)
                return
        finally:
            reader.close()
        for _ in range(RESUME_ATTEMPTS):
            if reader.last_id is None:
                break
            await anyio.sleep(reader.retry)
            headers = {**self._headers(), "last-event-id": reader.last_id}
            client = self._connection()
            async with client.get(self.url, headers=headers, allow_redirects=False) as again:
                self.heard()
                kind = again.headers.get("content-type", "").lower()
                if again.status != 200 or not kind.startswith("text/event-stream"):
                    break
                reader = _Sse(self, again, reader.last_id, reader.retry)
                try:
                    if await self._until_reply(rid, reader, on_progress):
                        return
                finally:
                    reader.close()
        self._settle(rid, CLOSED)

    async def _until_reply(self, rid: str, reader: _Sse, on_progress: Progress | None) -> bool:
        """Events until this call's reply, which settles it: True; False when the stream ended first."""
        while (data := await reader.next()) is not None:
            if (outcome := await self._event(rid, data, on_progress)) is not None:
                self._settle(rid, outcome)
                return True
        return False

    async def _event(self, rid: str, data: bytes, on_progress: Progress | None) -> Any:
        """One event's data: this call's outcome, or None when the message was someone else's."""
        if not data.strip():  # a priming event (an id to resume from, no message)
            return None
        try:
            raw = loads(data)
        except ValueError as exc:  # as the SDK answers an event it cannot read
            return types.ErrorData(code=types.PARSE_ERROR, message=f"Failed to parse SSE event: {exc}")
        if isinstance(raw, dict) and raw.get("id") == rid and "method" not in raw:
            return _outcome(raw)
        if isinstance(raw, dict) and raw.get("method") == "notifications/progress" and on_progress is not None:
            params = raw.get("params")
            if isinstance(params, dict) and params.get("progressToken") == rid:
                on_progress()
                return None
        await self._to_sdk(raw)
        return None

    async def _to_sdk(self, raw: Any) -> None:
        """A message the SDK's session handles (a question, a log, a notification), as its transport hands it."""
        inject = self._inject
        if inject is None:
            return
        try:
            message: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_python(raw, by_name=False)
            )
        except ValueError as exc:
            message = exc
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await inject.send(message)

    async def _send_cancel(self, body: bytes) -> None:
        if not self.ready:
            return
        with anyio.move_on_after(CANCEL_SECONDS):
            try:
                client = self._connection()
                async with client.post(self.url, data=body, headers=self._headers(), allow_redirects=False) as response:
                    await response.read()
            except Exception as exc:  # best effort, as the SDK's cancel
                log.debug("the cancel to %s was not delivered: %s", self.url, exc)

    async def _discover(self) -> None:
        """Whether the upstream speaks the 2026 era too (`server/discover` lists it): then a bare 2026-era
        host's call of a read-only tool may go to it sessionless (`start`). Asked once per connection; no
        answer, an error or another era leaves every call on the session, as does a server answering its
        session with plain JSON (its 2026-era requests are not watched: a cancel would not stop one)."""
        if not self.ready or self.spooling.answers_json:
            return
        version = MODERN_PROTOCOL_VERSIONS[-1]
        params = {"_meta": self._envelope(version)}
        body = dumps({"jsonrpc": "2.0", "id": DISCOVER_ID, "method": "server/discover", "params": params})
        with anyio.move_on_after(CANCEL_SECONDS):
            try:
                client = self._connection()
                headers = self._modern_headers(version, "server/discover")
                async with client.post(self.url, data=body, headers=headers, allow_redirects=False) as response:
                    kind = response.headers.get("content-type", "").lower()
                    answer = await response.read()
                if response.status != 200 or not kind.startswith("application/json"):
                    return
                result = loads_as_sdk(answer).get("result")
                supported = result.get("supportedVersions") if isinstance(result, dict) else None
            except Exception as exc:  # an older server may refuse it any way it likes
                log.debug("server/discover at %s: %s", self.url, exc)
                return
            if isinstance(supported, list) and self.ready:
                self.modern = next((v for v in reversed(MODERN_PROTOCOL_VERSIONS) if v in supported), None)
                if self.modern is not None:
                    log.info("upstream %s speaks %s: its hosts' sessionless calls go to it so", self.url, self.modern)

    def _envelope(self, version: str) -> dict[str, Any]:
        """A 2026-era request's `_meta` envelope: the gateway asks nothing of its own (no capabilities)."""
        envelope: dict[str, Any] = {types.PROTOCOL_VERSION_META_KEY: version, types.CLIENT_CAPABILITIES_META_KEY: {}}
        if self.client_info is not None:
            envelope[types.CLIENT_INFO_META_KEY] = self.client_info
        return envelope

    def _modern_headers(self, version: str, method: str, name: Any = None) -> dict[str, str]:
        """A 2026-era POST's headers: the configured ones, its routing headers, no session."""
        headers = {**self.headers, **POST_HEADERS, "mcp-protocol-version": version, "mcp-method": method}
        for key in ("mcp-session-id", "last-event-id"):
            headers.pop(key, None)
        if isinstance(name, str):
            headers["mcp-name"] = encode_header_value(name)
        return headers

    def _headers(self) -> dict[str, str]:
        """A POST's headers as the SDK's transport sends them on its session: the configured ones, the
        session's, and what the Streamable HTTP transport requires."""
        return {**self.headers, **(self._session or {}), **POST_HEADERS}

    def _connection(self) -> Any:
        """The leg's HTTP client, made on its first use."""
        if self._client is not None:
            return self._client
        from gateway.proxy.upstream_client import UpstreamClient

        # as the SDK's client connects: no proxy or .netrc from the environment (its httpx client has a
        # transport of its own, so it takes none), TLS trusted as httpcore trusts it (the system's store);
        # no total timeout (a long call's stream may be quiet for long: the call's own clock and the
        # health check notice a server that went away); connections are kept for the next call
        self._client = UpstreamClient(tls=_tls_context)
        return self._client

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class _Sse:
    """A response's SSE events, read as they stream: their lines split at LF, CRLF or CR, a long line
    spooled to disk (its JSON read back with its long strings left there)."""

    def __init__(self, owner: HttpRawRequests, response: Any, last_id: str | None = None, retry: float = RESUME_DELAY):
        self.owner = owner
        self.chunks = response.content.iter_any()
        self.line = LineBuffer(owner.spooling.spiller)
        self.event = _Event(last_id, retry)
        self.lines: deque[bytes] = deque()
        self.held = b""  # a CR that ended a chunk: its LF may open the next one

    @property
    def last_id(self) -> str | None:
        return self.event.last_id

    @property
    def retry(self) -> float:
        return self.event.retry

    async def next(self) -> bytes | None:
        """The next message event's data; None once the stream ends."""
        while True:
            while self.lines:
                if (data := self.event.feed(self.lines.popleft())) is not None:
                    return data
            chunk = await anext(self.chunks, None)
            if chunk is None:  # the stream ended: its last line and event, even without their ends
                done, self.held = self.line.take(), b""
                last = done if isinstance(done, bytes) else await _read_event_line(self.owner._reader, done)
                if last:
                    self.event.feed(last)
                return self.event.feed(b"")
            self.owner.heard()
            await self._split(self.held + chunk)

    def close(self) -> None:
        """A line left half-read (the stream given up on) leaves no spool file behind."""
        self.line.discard()

    async def _split(self, chunk: bytes) -> None:
        self.held = b""
        if chunk.endswith(b"\r"):
            chunk, self.held = chunk[:-1], b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        begin, newline = 0, chunk.find(b"\n")
        while newline >= 0:
            self.line.add(chunk[begin : newline + 1])
            done = self.line.take()
            self.lines.append(done if isinstance(done, bytes) else await _read_event_line(self.owner._reader, done))
            begin, newline = newline + 1, chunk.find(b"\n", newline + 1)
        if begin < len(chunk):
            self.line.add(chunk[begin:])


class _Event:
    """One SSE event as its lines come: its data, once a blank line ends it; the stream's last event id
    and its retry delay (for resuming it)."""

    def __init__(self, last_id: str | None = None, retry: float = RESUME_DELAY) -> None:
        self.data: list[bytes] = []
        self.kind = b""
        self.last_id = last_id
        self.retry = retry

    def feed(self, line: bytes) -> bytes | None:
        """The data of the event this line ends (its blank line), when it is a message; else None."""
        line = line.rstrip(b"\r\n")
        if not line:
            data, kind, self.data, self.kind = self.data, self.kind, [], b""
            return b"\n".join(data) if data and kind in (b"", b"message") else None
        if line.startswith(b":"):  # a comment (a keep-alive)
            return None
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"data":
            self.data.append(value)
        elif field == b"event":
            self.kind = value
        elif field == b"id" and b"\0" not in value:
            self.last_id = value.decode("utf-8", "replace")
        elif field == b"retry" and value.isdigit():
            self.retry = int(value) / 1000
        return None


def _within_origin(url: str, response: Any) -> str | None:
    """Where a 307/308 answer sends the POST when the SDK's client would follow it (same scheme, host and
    port, or http to https on the same host's default ports; no userinfo of its own); else None."""
    location = response.headers.get("location")
    if not location:
        return None
    here, there = httpx2.URL(url), httpx2.URL(url).join(location)
    if there.userinfo and there.userinfo != here.userinfo:
        return None
    same = (here.scheme, here.host, here.port) == (there.scheme, there.host, there.port)
    upgrade = here.host == there.host and (here.scheme, here.port, there.scheme, there.port) == (
        "http",
        None,
        "https",
        None,
    )
    return str(there) if same or upgrade else None


def _shown(location: str, base: str) -> str:
    """A redirect's target as a message may show it: no userinfo, query or fragment."""
    try:
        there = httpx2.URL(base).join(location)
        return str(there.copy_with(userinfo=b"", query=None, fragment=None))
    except Exception:  # not a URL
        return "another address"


def _tls_context() -> Any:
    import httpcore2

    return httpcore2.default_ssl_context()


def _as_session_result(result: dict[str, Any]) -> None:
    """A 2026-era `tools/call` result read as the session's: its `resultType` and the upstream's
    `serverInfo` (the host is told the gateway's) dropped."""
    result.pop("resultType", None)
    meta = result.get("_meta")
    if isinstance(meta, dict) and types.SERVER_INFO_META_KEY in meta:
        meta = {k: v for k, v in meta.items() if k != types.SERVER_INFO_META_KEY}
        if meta:
            result["_meta"] = meta
        else:
            del result["_meta"]


def _unread() -> types.ErrorData:
    return types.ErrorData(code=types.PARSE_ERROR, message="Failed to parse JSON response")


async def relay(
    source: anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
    sink: anyio.abc.ObjectSendStream[SessionMessage | Exception],
) -> None:
    """The SDK transport's messages on to its session (the lean leg sends into the same sink)."""
    async with sink:
        async for message in source:
            try:
                await sink.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the session is gone (the connection is closing)
