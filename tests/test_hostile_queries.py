"""response_query on a shared gateway, tried the way a hostile or unlucky caller would: a real gateway
process over stdio in front of the probe server. No query may take the process down, block another
caller's queries, or leave a result it cannot query again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import (
    PY,
    RAW_HELLO,
    call,
    gateway_env,
    gateway_pid,
    gateway_pipes,
    ok,
    outline_with_tables,
    peak_rss,
    probe,
    text_of,
    write_config,
)
from mcp import ClientSession

from gateway.proxy.upstream_stdio import linear_stdio_client

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def _gateway(tmp_path: Path) -> AsyncIterator[tuple[ClientSession, Path]]:
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload"], max_response_size=4096)
    with open(tmp_path / "gw.err", "wb") as errlog:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            yield session, cfg
    assert "Traceback" not in (tmp_path / "gw.err").read_text()


async def _offloaded(session: ClientSession, size: int = 200_000) -> str:
    result = await call(session, "p__big", {"size": size})
    return json.loads(text_of(result))["fileRef"]["id"]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from /proc (Linux)")
async def test_huge_answers_neither_fill_the_memory_nor_the_disk(tmp_path: Path) -> None:
    async with _gateway(tmp_path) as (session, cfg):
        rid = await _offloaded(session)
        pid = gateway_pid(cfg)
        await ok(session, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
        before = peak_rss(pid)
        # 1.5 GB of rows: DuckDB builds them in one chunk; the query's own process runs out, not the gateway
        huge = await call(
            session,
            "response_query",
            {"path": rid, "sql": "SELECT repeat('x', 10000000) AS s FROM range(150)", "max_tokens": 100},
        )
        assert huge.is_error and "more memory than one may use" in text_of(huge)
        # 600 MB of rows in small pieces: read back up to the cap, the rest left unread
        wide = await ok(
            session,
            "response_query",
            {"path": rid, "sql": "SELECT repeat('x', 100000) AS s FROM range(6000)", "max_tokens": 100},
        )
        assert str(wide["row_count"]).startswith("more than ") and "narrow it" in wide["note"]
        assert Path(wide["fileRef"]["path"]).stat().st_size < 80 * 1024 * 1024
        assert peak_rss(pid) - before < 256 * 1024 * 1024  # it was 5.9 GB
        # the process is there for everyone else
        assert "still here" in text_of(await call(session, "p__echo", {"text": "still here"}))
        small = await ok(session, "response_query", {"path": rid, "sql": "SELECT max(id) FROM items"})
        assert small["rows"] == [[2499]]


async def test_concurrent_queries_on_one_result_all_answer(tmp_path: Path) -> None:
    async with _gateway(tmp_path) as (session, _):
        rid = await _offloaded(session)
        answers: list[Any] = []

        async def ask(i: int) -> None:
            sql = f"SELECT count(*) + {i} FROM items, range(200)"
            with anyio.fail_after(120):
                # past one caller's share of worker processes a query is told to try again, as a model would
                while "try again when one ends" in text_of(
                    answer := await call(session, "response_query", {"path": rid, "sql": sql})
                ):
                    pass
            answers.append(answer)

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(ask, i)
        assert all(not a.is_error for a in answers), [text_of(a) for a in answers if a.is_error]
        assert sorted(a.structured_content["rows"][0][0] for a in answers) == [2500 * 200 + i for i in range(4)]


async def test_a_damaged_sidecar_is_built_again_and_comments_end_a_query(tmp_path: Path) -> None:
    async with _gateway(tmp_path) as (session, _):
        rid = await _offloaded(session)
        first = await ok(session, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
        sidecars = list((tmp_path / "ws").rglob(f".*{rid.removeprefix('resp_')}*.duckdb"))
        assert len(sidecars) == 1
        sidecars[0].write_bytes(b"not a database" * 100)
        again = await ok(session, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
        assert again["rows"] == first["rows"] == [[2500]]
        # past 5,000 rows the total is counted, not asked again with the SQL wrapped in a subquery
        many = await ok(
            session, "response_query", {"path": rid, "sql": "SELECT * FROM range(6000) -- the end", "max_tokens": 60}
        )
        assert many["row_count"] == 6000


async def test_the_exit_does_not_wait_for_a_conversion(tmp_path: Path) -> None:
    """A 60 MB result is being converted when the gateway is told to stop: it ends at once, not when the
    conversion ends (the conversion's process is killed)."""
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload"], max_response_size=4096)
    proc = gateway_pipes(cfg)
    assert proc.stdin is not None and proc.stdout is not None

    def send(message: dict[str, Any]) -> None:
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()

    def reply(rid: int) -> dict[str, Any]:
        while True:
            message = json.loads(proc.stdout.readline())
            if message.get("id") == rid:
                return message

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": RAW_HELLO})
        reply(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "p__big", "arguments": {"size": 60_000_000}},
            }
        )
        assert "fileRef" in reply(2)["result"]["content"][0]["text"]
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=20) is not None
    finally:
        proc.kill()
        proc.wait()


async def test_a_huge_meta_is_counted_and_kept_out(tmp_path: Path) -> None:
    """A small result carrying 5 MB of `_meta` (a trace): the answer passes, its big key goes to a file
    named in a small `_meta`, so the host never receives the 5 MB."""
    async with _gateway(tmp_path) as (session, _):
        result = await call(session, "p__big", {"size": 5_000_000, "kind": "meta"})
        assert not result.is_error and text_of(result) == "done"
        meta = result.meta or {}
        assert len(json.dumps(meta)) < 4096 and meta["small"] == 1
        note = meta["mcp-context-gateway/offloadedMeta"]
        assert note["keys"] == ["trace"]
        saved = await ok(
            session, "response_query", {"path": note["id"], "sql": "SELECT length(json->>'$.trace') FROM doc"}
        )
        assert saved["rows"] == [[5_000_000]]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from /proc (Linux)")
@pytest.mark.parametrize("kind", ["records", "wide"])
async def test_a_long_conversion_does_not_hold_another_results_query(tmp_path: Path, kind: str) -> None:
    """A large result is still being turned into tables when a small result is asked: the small one's
    answer comes while the large conversion still runs (one process each, no lock between them). The
    large one: 60 MB of records, or 30 MB of 100,000 objects whose 20 keys no other object has."""
    async with _gateway(tmp_path) as (session, cfg):
        small = await _offloaded(session)
        await ok(session, "response_query", {"path": small, "sql": "SELECT count(*) FROM items"})
        pid = gateway_pid(cfg)
        before = peak_rss(pid)
        if kind == "wide":
            wide = await call(session, "p__big", {"size": 30_000_000, "kind": "wide"})
            big = json.loads(text_of(wide))["fileRef"]["id"]
        else:
            big = await _offloaded(session, 60_000_000)
        answer = await ok(session, "response_query", {"path": small, "sql": "SELECT max(id) FROM items"})
        assert answer["rows"] == [[2499]]
        sidecar = list((tmp_path / "ws").rglob(f".*{big.removeprefix('resp_')}*.duckdb"))
        assert sidecar == []  # the large conversion had not finished when the small answer came
        if kind == "wide":  # and when it has, the result is one JSON value a row, in bounded memory
            counted = await ok(session, "response_query", {"path": big, "sql": "SELECT count(*) FROM items"})
            assert counted["rows"] == [[100_000]]
            assert peak_rss(pid) - before < 1024 * 1024 * 1024  # it peaked at 1.4 GB


def _cpu_ticks(pid: int) -> int:
    """The CPU time a process has used, in clock ticks (Linux: /proc); 0 once it is gone."""
    try:
        return sum(int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
    except (OSError, ValueError):
        return 0


def _workers(parent: int) -> list[int]:
    """The SQL worker processes whose parent is `parent` (Linux: read from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"plugins.offload.sql_worker" in argv and (parent == 0 or ppid == parent):
            found.append(int(proc.name))
    return found


SLOW = "SELECT count(*) FROM range(400000) a, range(1000) b WHERE (a.range * b.range) % 7 = {i}"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="counts worker processes in /proc (Linux)")
async def test_one_callers_queries_get_a_share_of_the_workers(tmp_path: Path) -> None:
    """Many slow queries at once: at most the pool's share runs (at a lower priority), the rest are told
    to try again, and the gateway answers other calls meanwhile."""
    from gateway.services.shares import worker_pool

    share = worker_pool().per_caller
    async with _gateway(tmp_path) as (session, cfg):
        rid = await _offloaded(session)
        await ok(session, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
        await outline_with_tables(session, rid)  # the profiles are done: no conversion's worker runs beside
        pid = gateway_pid(cfg)
        with anyio.fail_after(30):  # nor a spare still starting (its imports would count as running)
            before = {w: _cpu_ticks(w) for w in _workers(pid)}
            while True:
                await anyio.sleep(0.3)
                now = {w: _cpu_ticks(w) for w in _workers(pid)}
                if now == before:
                    break
                before = now
        answers: list[Any] = []
        most, lowest = 0, 0
        spent: dict[int, int] = {}  # worker -> its CPU ticks at the last look

        async def ask(i: int) -> None:
            answers.append(await call(session, "response_query", {"path": rid, "sql": SLOW.format(i=i)}))

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(ask, i)
            with anyio.fail_after(60):
                while len(answers) < 6:
                    workers = _workers(pid)  # some wait warm, idle, for the caller's next request
                    now = {w: _cpu_ticks(w) for w in workers}
                    running = [w for w, t in now.items() if w in spent and t > spent[w]]
                    spent = now
                    most = max(most, len(running))
                    for worker in workers:
                        with contextlib.suppress(OSError):
                            lowest = max(lowest, os.getpriority(os.PRIO_PROCESS, worker))
                    await anyio.sleep(0.05)
            with anyio.fail_after(10):  # the gateway answers meanwhile
                assert "here" in text_of(await call(session, "p__echo", {"text": "here"}))
        assert 1 <= most <= share and lowest >= 10  # below the gateway's priority
        busy = [text_of(a) for a in answers if a.is_error]
        assert busy and all("try again when one ends" in b for b in busy), busy


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_query_worker_ends_with_a_killed_gateway(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload"], max_response_size=4096)
    proc = gateway_pipes(cfg)
    assert proc.stdin is not None and proc.stdout is not None

    def ask(rid: int, method: str, params: dict[str, Any]) -> None:
        proc.stdin.write(
            (json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode()
        )
        proc.stdin.flush()

    try:
        ask(1, "initialize", RAW_HELLO)
        proc.stdout.readline()
        proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        ask(2, "tools/call", {"name": "p__big", "arguments": {"size": 200_000}})
        while (reply := json.loads(proc.stdout.readline())).get("id") != 2:
            pass  # notifications before the answer
        rid = json.loads(reply["result"]["content"][0]["text"])["fileRef"]["id"]
        sql = SLOW.format(i=1).replace("range(400000)", "range(100000000)")
        ask(3, "tools/call", {"name": "response_query", "arguments": {"path": rid, "sql": sql}})
        deadline = time.monotonic() + 60
        while not (running := [w for w in _workers(proc.pid) if _niced(w)]):  # mid-query
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10  # was still running 30 s later
        while any(_state(w) not in ("Z", "X") for w in running):
            assert time.monotonic() < deadline, "the worker outlived the gateway"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def _niced(pid: int) -> bool:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid) >= 10
    except OSError:
        return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
