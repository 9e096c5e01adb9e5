"""Questions from an upstream to a 2026-era host, as multi-round-trip results.

Upstreams speak the handshake era: during a call they ask the client (elicitation, sampling, roots)
with a request of their own. A 2026-07-28 host has no channel for such a request; it expects the
call to answer `input_required` with the questions embedded and a `requestState`, and then sends
the same call again with the answers. An `Exchange` joins the two: the upstream call runs in the
background, its question becomes the `input_required` answer to the host's call, the host's retry
(matched by `requestState`) carries the answer back to the waiting upstream, and the upstream's
final result (or its next question) answers the retry.

A call on the lean path runs without a task of its own (`Gateway._start_lean_modern`): its exchange
then has a `handover`, which puts the first question to the host as the answer to its call (the call
waits for its retry from then on, as every other), and a `halt` that stops its upstream call where
another exchange's task is cancelled (`cancel`: the host gave up on its retry, or the quota).

Every such call has an exchange, but only a round with a question out counts against the quotas
(`MAX_PER_NAMESPACE` per token, `MAX_EXCHANGES` in all): over one, the oldest open round of the
caller (or, over the quota of all, of the caller holding the most) is closed, and its call answers
an error saying why, to the waiting host or to its retry.

`requestState` is a random token naming an exchange held in memory: it reveals nothing, and a
token that names no exchange of this namespace is refused. Its first part names the gateway process
that holds the exchange (`REPLICA`), so a retry that a load balancer sent to another replica is told
so plainly instead of "expired".
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from pydantic import BaseModel, ValidationError

from gateway.results import error_result

ANSWER_WAIT = 600.0  # how long a question waits for the host's retry; then the upstream hears "decline"
KEEP_FINISHED = 60.0  # a result nobody came back for is dropped after this
MAX_KEPT_PER_NAMESPACE = 64  # and one namespace's results waiting for their retry: beyond, its oldest go
MAX_PER_NAMESPACE = 64  # open rounds (a question out, its answer awaited) one namespace may hold
MAX_EXCHANGES = 1024  # and all of them (calls merely in flight are not rounds: never counted)
REPLICA = secrets.token_hex(4)  # this process, as the first part of every requestState it issues

RESPONSE_TYPES: dict[str, type[BaseModel]] = {
    "elicitation/create": types.ElicitResult,
    "sampling/createMessage": types.CreateMessageResult,
    "roots/list": types.ListRootsResult,
}

Outcome = types.CallToolResult | types.InputRequiredResult


class Exchange:
    """One host call that an upstream may interrupt with questions."""

    def __init__(self, namespace: str, rounds: Exchanges | None = None):
        self.token = f"{REPLICA}.{secrets.token_urlsafe(18)}"
        self.namespace = namespace
        self._rounds = rounds  # where a question opens a round (within the quotas)
        self.evicted: str | None = None  # why its round was closed by the quota (the call answers that)
        # an asyncio queue, not an anyio memory stream: made and passed through once per 2026-era call
        # (the gateway runs on asyncio); one exchange's whole round took 30-36 us with the stream, 14-15 now
        self._outcomes: asyncio.Queue[Outcome] = asyncio.Queue()  # a result, and questions each awaiting its answer
        self._asked: dict[str, tuple[str, anyio.Event]] = {}  # key -> (method, answered)
        self._answers: dict[str, Any] = {}
        self._count = 0
        self.finished_at: float | None = None
        self.call: Any = None  # the host's call (the pipeline runs on it when the result comes)
        self.scope = anyio.CancelScope()  # the upstream call running in the background
        self.busy = False  # a host request is waiting for this exchange's next outcome
        # a call without a task of its own (the lean path): the first question goes to the host through this
        # (False: the host's call is gone, nobody to ask), and `halt` stops the upstream call
        self.handover: Callable[[Outcome], bool] | None = None
        self.halt: Callable[[], None] | None = None

    @property
    def waiting(self) -> bool:
        """A question is open (the host is expected back with its answer)."""
        return bool(self._asked)

    async def ask(self, request: types.ElicitRequest | types.CreateMessageRequest | types.ListRootsRequest) -> Any:
        """Put a question to the host (as the answer to its call); the host's answer, or None when it
        did not come back in time."""
        self._count += 1
        key = f"q{self._count}"
        answered = anyio.Event()
        if self._rounds is not None:
            self._rounds.opened(self)
        self._asked[key] = (request.method, answered)
        try:
            outcome = types.InputRequiredResult(input_requests={key: request}, request_state=self.token)
            handover, self.handover = self.handover, None
            if handover is None:
                await self._outcomes.put(outcome)
            elif not handover(outcome):
                return None
            with anyio.move_on_after(ANSWER_WAIT):
                await answered.wait()
        finally:
            self._asked.pop(key, None)
            if self._rounds is not None and not self._asked:
                self._rounds.closed(self)
        return self._answers.pop(key, None)

    def answer(self, responses: dict[str, Any] | None) -> str | None:
        """The host's answers from its retry; a problem with them as text, or None."""
        problems = []
        for key, value in (responses or {}).items():
            if key not in self._asked:
                problems.append(f"no question {key!r} is open")
                continue
            method, answered = self._asked[key]
            raw = value.model_dump(by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value
            try:
                self._answers[key] = RESPONSE_TYPES[method].model_validate(raw)
            except ValidationError as exc:
                problems.append(f"the answer to {key!r} is not a {method} result ({exc.error_count()} errors)")
                continue
            answered.set()
        return "; ".join(problems) or None

    async def finish(self, result: types.CallToolResult) -> None:
        self.finish_now(result)

    def finish_now(self, result: types.CallToolResult) -> None:
        self.finished_at = time.monotonic()
        self._outcomes.put_nowait(result)
        if self._rounds is not None:
            self._rounds.kept(self)

    def cancel(self) -> None:
        """Stop the upstream call: its task's scope, or a task-free call's `halt`."""
        self.scope.cancel()
        halt, self.halt = self.halt, None
        if halt is not None:
            halt()

    async def next_outcome(self) -> Outcome:
        """The upstream's next question or its final result, whichever comes first."""
        return await self._outcomes.get()


class Exchanges:
    """The open exchanges, by `requestState` token."""

    def __init__(self) -> None:
        self.open: dict[str, Exchange] = {}
        self.rounds: dict[str, Exchange] = {}  # those with a question out, oldest first (the quotas count these)
        # finished calls still open (a result waits for the host's retry, or its call's own task is about
        # to take it): in the order they finished (the clock only moves on: the oldest first), and by
        # namespace for its cap. A new call drops the old ones from the head and never walks the rest (a
        # caller holding thousands made every caller's call take milliseconds)
        self._finished: dict[str, float] = {}
        self._kept: dict[str, dict[str, None]] = {}

    def new(self, namespace: str) -> Exchange:
        """Every 2026-era call's exchange; only its questions count against the quotas (`opened`)."""
        self._drop_old(time.monotonic())
        exchange = Exchange(namespace, self)
        self.open[exchange.token] = exchange
        return exchange

    def kept(self, exchange: Exchange) -> None:
        """`exchange` finished: its result is kept for the retry for KEEP_FINISHED seconds, and of one
        namespace's the newest MAX_KEPT_PER_NAMESPACE only (a retry of a dropped one is told it expired).
        One a host request waits on (`busy`) is not kept: that request takes it and closes it, or keeps
        it open for a retry and calls this again (`Gateway._next`)."""
        token = exchange.token
        if self.open.get(token) is not exchange or exchange.finished_at is None or exchange.busy:
            return
        kept = self._kept.setdefault(exchange.namespace, {})
        for order in (kept, self._finished):  # finished again: at the end (the head stays the oldest)
            order.pop(token, None)
        kept[token] = None
        self._finished[token] = exchange.finished_at
        while len(kept) > MAX_KEPT_PER_NAMESPACE:
            self._drop(next(iter(kept)))

    def _drop_old(self, now: float) -> None:
        """Results nobody came back for, oldest first, until a recent one."""
        finished = self._finished
        while finished:
            token, at = next(iter(finished.items()))
            if now - at <= KEEP_FINISHED:
                break
            self._drop(token)

    def _drop(self, token: str) -> None:
        self._finished.pop(token, None)
        ex = self.open.pop(token, None)
        if ex is not None:
            self.rounds.pop(token, None)
            self._unkeep(ex)

    def _unkeep(self, exchange: Exchange) -> None:
        kept = self._kept.get(exchange.namespace)
        if kept is not None and kept.pop(exchange.token, 0) is None and not kept:
            del self._kept[exchange.namespace]

    def opened(self, exchange: Exchange) -> None:
        """A question goes out: a round opens. Over a quota the oldest open round goes (its upstream call
        is cancelled, and the call answers an error): the namespace's own, or at the quota of all, one of
        the namespace holding the most; another caller's rounds are never the price of this one."""
        if exchange.token in self.rounds:
            return
        own = [ex for ex in self.rounds.values() if ex.namespace == exchange.namespace]
        for ex in own[: max(0, len(own) - MAX_PER_NAMESPACE + 1)]:
            self._evict(ex, f"{MAX_PER_NAMESPACE} questions of this caller were open (the most one token may hold)")
        while len(self.rounds) >= MAX_EXCHANGES:
            held = Counter(ex.namespace for ex in self.rounds.values())
            most = max(held, key=lambda ns: (held[ns], ns == exchange.namespace))
            oldest = next(ex for ex in self.rounds.values() if ex.namespace == most)
            self._evict(oldest, f"{MAX_EXCHANGES} questions were open in all, this caller's the most")
        self.rounds[exchange.token] = exchange

    def closed(self, exchange: Exchange) -> None:
        """Its questions are answered (or given up): the round no longer counts."""
        self.rounds.pop(exchange.token, None)

    def find(self, token: str, namespace: str) -> Exchange | None:
        exchange = self.open.get(token)
        return exchange if exchange is not None and exchange.namespace == namespace else None

    def close(self, exchange: Exchange) -> None:
        if self.open.get(exchange.token) is exchange:
            self._drop(exchange.token)
        elif self.rounds.get(exchange.token) is exchange:
            del self.rounds[exchange.token]

    @staticmethod
    def elsewhere(token: str) -> bool:
        """Whether a requestState was issued by another gateway process (a replica, or this one before a
        restart): its round cannot be answered here."""
        replica, dot, _ = token.partition(".")
        return bool(dot) and replica != REPLICA

    def _evict(self, exchange: Exchange, why: str) -> None:
        """Close a round: its upstream call hears a cancel, and the call answers `why` (the exchange
        stays findable until then, so the host's retry gets that answer, not "expired")."""
        self.rounds.pop(exchange.token, None)
        exchange.evicted = f"This call was ended before its answer came: {why}. Call the tool again."
        task_free = exchange.halt is not None
        exchange.cancel()
        if task_free and exchange.finished_at is None:  # no task answers it (`Gateway._run_exchange` does)
            exchange.finish_now(error_result(exchange.evicted))
