"""Shares of what every caller of one gateway uses: threads off the event loop, worker processes.

One gateway serves many callers (HTTP tokens, each a namespace; "" is the one local user). A pool
has a size in all and a share per caller: a caller runs at most its share at once, waits briefly for a
place within it, and past that wait gets `Busy` ("3 of your queries are running; try again when one
ends"), which tools answer as isError. Within its share a caller queues for the pool in arrival order
(anyio's limiters are first come, first served), so a caller who fills its share never takes the
places another caller needs. Each pool has its own threads (its own anyio limiter), so no pool waits
behind another, nor behind anyio's 40 default worker threads that the SDK and libraries share.

The event loop only waits: anything that can take more than a few milliseconds (a database call, a
file scan, a summary, a ranking) runs through `Pool.run` (a thread) or inside `Pool.slot` (a worker
process started by the caller).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.lowlevel import EventLoopToken

T = TypeVar("T")

CORES = max(1, os.cpu_count() or 1)


class Busy(Exception):
    """A caller is over its share of a pool; the message says what to do. Tools answer it as isError."""


class Pool:
    """`total` places in all, at most `per_caller` for one caller. `noun` names what a place runs, for
    the message ("queries"). A caller waits up to `wait_own` seconds for a place within its share,
    then up to `wait_all` seconds for a place in the pool (other callers' work ends within its own
    limits), and is told `Busy` past either."""

    def __init__(
        self, name: str, total: int, per_caller: int, noun: str, wait_own: float = 2.0, wait_all: float = 60.0
    ):
        self.name, self.noun = name, noun
        self.total, self.per_caller = max(1, total), max(1, min(per_caller, total))
        self.wait_own, self.wait_all = wait_own, wait_all
        self._all: anyio.CapacityLimiter | None = None
        self._threads: anyio.CapacityLimiter | None = None
        self._own: dict[str, anyio.CapacityLimiter] = {}

    def running(self, caller: str) -> int:
        """How many places `caller` holds now."""
        own = self._own.get(caller)
        return 0 if own is None else int(own.borrowed_tokens)

    def callers(self) -> int:
        """How many callers hold or wait for a place (the map shrinks as they finish)."""
        return len(self._own)

    @asynccontextmanager
    async def slot(self, caller: str) -> AsyncIterator[None]:
        """Hold one of `caller`'s places for the block (a worker process it starts, a thread it runs)."""
        if self._all is None:  # limiters belong to the running loop: made at first use
            self._all = anyio.CapacityLimiter(self.total)
            self._threads = anyio.CapacityLimiter(self.total)
        own = self._own.get(caller)
        if own is None:
            own = self._own[caller] = anyio.CapacityLimiter(self.per_caller)
        token = object()
        try:
            try:
                with anyio.fail_after(self.wait_own):
                    await own.acquire_on_behalf_of(token)
            except TimeoutError:
                raise Busy(
                    f"{int(own.borrowed_tokens)} of your {self.noun} are running (at most {self.per_caller} at once "
                    "per caller); try again when one ends"
                ) from None
            try:
                try:
                    with anyio.fail_after(self.wait_all):
                        await self._all.acquire_on_behalf_of(token)
                except TimeoutError:
                    raise Busy(
                        f"every place for {self.noun} on this gateway ({self.total}) is taken by other callers; "
                        "try again shortly"
                    ) from None
                try:
                    yield
                finally:
                    self._all.release_on_behalf_of(token)
            finally:
                own.release_on_behalf_of(token)
        finally:
            if own.borrowed_tokens == 0 and own.statistics().tasks_waiting == 0 and self._own.get(caller) is own:
                del self._own[caller]  # an idle caller costs nothing: the map never grows with callers

    @contextmanager
    def slot_in_thread(self, caller: str, token: EventLoopToken | None = None) -> Iterator[None]:
        """`slot` for blocking code already off the loop (a thread anyio started, or any thread given the
        loop's `token`): the place is taken and given back on the loop, the block runs here. Raises
        anyio's NoEventLoopError when there is no loop to ask (nothing is shared then)."""
        held = self.slot(caller)
        anyio.from_thread.run(held.__aenter__, token=token)
        try:
            yield
        finally:
            anyio.from_thread.run(held.__aexit__, None, None, None, token=token)

    async def run(self, caller: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a thread of this pool, within `caller`'s share."""
        async with self.slot(caller):
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._threads)


_POOLS: dict[str, Pool] = {}


def pool(name: str, total: int, per_caller: int, noun: str, **waits: float) -> Pool:
    """The process's pool of that name (made on first use with these sizes; one per name)."""
    found = _POOLS.get(name)
    if found is None:
        found = _POOLS[name] = Pool(name, total, per_caller, noun, **waits)
    return found


STORE_THREADS = 16  # `store_pool`'s threads: PostgreSQL's connection pool has one for each of them


def store_pool() -> Pool:
    """Database and file-store work of the memory and document tools (SQLite, PostgreSQL, logs)."""
    return pool("store", total=STORE_THREADS, per_caller=4, noun="memory and document calls")


def ingest_pool() -> Pool:
    """Document ingests: chunking and indexing are Python in the gateway's process and hold the GIL for
    seconds on a large document, so one caller ingests one at a time (two at once in all) and the
    others' calls keep their share of the interpreter."""
    return pool("ingest", total=2, per_caller=1, noun="document ingests")


def offload_pool() -> Pool:
    """Writing an oversized result to its file (and waiting briefly for a small one's tables): a result is
    never refused for want of a place, so a caller over its share waits for one of its own."""
    return pool("offload", total=16, per_caller=4, noun="offloads", wait_own=300.0, wait_all=300.0)


def count_pool() -> Pool:
    """Counting a long result's tokens to decide whether it is offloaded (tens of ms for a few hundred KB),
    off the event loop; never behind the caller's file writes, which may wait seconds for tables."""
    return pool("count", total=8, per_caller=2, noun="token counts", wait_own=300.0, wait_all=300.0)


def explore_pool() -> Pool:
    """The offload explore tools' file work (outline, slice, search, compress) in the gateway process."""
    return pool("explore", total=16, per_caller=4, noun="response_* calls")


def worker_pool() -> Pool:
    """Worker processes (SQL, JSONPath over a file): as many at once as the cores can run, half of
    them at most for one caller, so another caller always finds one free within a query's time."""
    total = max(2, CORES)
    return pool("workers", total=total, per_caller=max(1, total // 2), noun="queries")


def conversion_pool() -> Pool:
    """Worker processes turning offloaded results into tables (after the offload, in the background): apart
    from `worker_pool`, so a caller's own conversion never makes its slices and queries wait or be told
    Busy; one at a time per caller, half the cores in all, waiting as long as conversions take."""
    return pool(
        "conversions", total=max(1, CORES // 2), per_caller=1, noun="table conversions", wait_own=600, wait_all=600
    )
