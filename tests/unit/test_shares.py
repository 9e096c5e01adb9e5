"""The shares of a pool: one caller over its share waits, then is told; another caller never waits for it."""

from __future__ import annotations

import threading

import anyio
import pytest

from gateway.services.shares import Busy, Pool

pytestmark = pytest.mark.anyio


async def test_a_caller_over_its_share_is_told_and_another_caller_runs() -> None:
    pool = Pool("t", total=4, per_caller=2, noun="queries", wait_own=0.2)
    release = threading.Event()
    started = anyio.Event()
    count = 0

    def block() -> None:
        release.wait(10)

    async def alice() -> None:
        nonlocal count
        count += 1
        if count == 2:
            started.set()
        await pool.run("alice", block)

    async with anyio.create_task_group() as tg:
        tg.start_soon(alice)
        tg.start_soon(alice)
        with anyio.fail_after(5):
            await started.wait()
            while pool.running("alice") < 2:
                await anyio.sleep(0.01)
        with pytest.raises(Busy, match="2 of your queries are running"):
            await pool.run("alice", lambda: None)
        with anyio.fail_after(5):  # bob's place is his own
            assert await pool.run("bob", lambda: "bob ran") == "bob ran"
        release.set()
    assert pool.callers() == 0  # idle callers leave the map


async def test_callers_within_their_share_queue_in_arrival_order() -> None:
    pool = Pool("t", total=1, per_caller=1, noun="queries", wait_own=5)
    order: list[str] = []
    gate = threading.Event()

    async def run(name: str, fn) -> None:
        await pool.run(name, fn)
        order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "alice", lambda: gate.wait(10))
        with anyio.fail_after(5):
            while pool.running("alice") < 1:
                await anyio.sleep(0.01)
        tg.start_soon(run, "bob", lambda: None)
        with anyio.fail_after(5):
            while pool.callers() < 2:
                await anyio.sleep(0.01)
        gate.set()
    assert order == ["alice", "bob"]


async def test_the_whole_pool_taken_by_others_is_told_after_the_wait() -> None:
    pool = Pool("t", total=1, per_caller=1, noun="queries", wait_all=0.2)
    gate = threading.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run, "alice", lambda: gate.wait(10))
        with anyio.fail_after(5):
            while pool.running("alice") < 1:
                await anyio.sleep(0.01)
        with pytest.raises(Busy, match="taken by other callers"):
            await pool.run("bob", lambda: None)
        gate.set()
