"""One tenant's heavy but legal work on a shared HTTP gateway, and another tenant's plain calls meanwhile.

Used by `tests/test_fair_sharing.py` (the other tenant's calls all answer in time) and
`bench/fair_sharing.py` (both tenants' latencies, idle and under load, from one run).

The gateway fronts the probe server (a real SDK server over stdio) with every plugin on and two named
tokens, alice and bob. Alice's set: 40 SQL queries at once on her 25 MB result (offloaded beforehand),
two recursive JSONPath slices of it, the compaction of a 1,500-note session, a recall over 40 notes of
100,000 characters, two 5 MB documents ingested at once, then a flood of sessions past her share (her
oldest idle ones are reclaimed). Bob meanwhile: an upstream echo, a note, the outline of his own small
result, one after another.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from conftest import RAW_HELLO, free_port, probe, write_config
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdefgh"
SESSIONS_PER_TOKEN = 64  # a small share in the test's config, so the flood is quick to reach
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": RAW_HELLO}
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def gateway_command(tmp_path: Path, python: str, share: bool = True) -> tuple[list[str], str]:
    """The command line of a two-tenant HTTP gateway and its URL."""
    port = free_port()
    cfg = write_config(
        tmp_path,
        {"p": probe("p")},
        plugins=["offload", "memory", "documents", "monitor"],
        max_sessions_per_token=SESSIONS_PER_TOKEN if share else None,
    )
    cfg.write_text(
        cfg.read_text()
        + f'\n[[auth.tokens]]\nname = "alice"\ntoken = "{ALICE}"\n\n[[auth.tokens]]\nname = "bob"\ntoken = "{BOB}"\n'
    )
    argv = [python, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--port", str(port)]
    return argv, f"http://127.0.0.1:{port}/mcp"


@asynccontextmanager
async def tenant(url: str, token: str) -> AsyncIterator[ClientSession]:
    """One host session of a tenant over Streamable HTTP."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(120)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, args: dict[str, Any]) -> types.CallToolResult:
    return await session.call_tool(name, args)


def text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


@dataclass
class Plain:
    """Bob's plain calls: latencies in seconds and any failure."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    calls: list[tuple[float, str, float]] = field(default_factory=list)  # (latency, tool, when it started)

    def slowest(self, n: int = 5) -> list[str]:
        return [f"{tool} {lat * 1000:.0f} ms at {when:.1f}" for lat, tool, when in sorted(self.calls)[-n:]]


async def plain_calls(session: ClientSession, small_id: str, out: Plain, until: Callable[[], bool]) -> None:
    """Bob's round of three plain calls, again and again until `until()` is true."""
    calls: list[tuple[str, dict[str, Any], str]] = [
        ("p__echo", {"text": "bob 안녕"}, "bob 안녕"),
        ("context_append", {"session_id": "bob", "text": "bob's note while alice works"}, "e0"),
        ("response_outline", {"path": small_id}, "data"),
    ]
    n = 0
    while not until():
        name, args, expect = calls[n % len(calls)]
        n += 1
        started = time.perf_counter()
        try:
            result = await call(session, name, args)
        except Exception as exc:  # a lost call is a failure, not the end of the measurement
            out.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        out.latencies.append(time.perf_counter() - started)
        out.calls.append((out.latencies[-1], name, started))
        if result.is_error or expect not in text(result):
            out.failures.append(f"{name}: {text(result)[:200]}")


async def small_result(session: ClientSession) -> str:
    """A result of bob's own, offloaded (small but over the limit): its id."""
    result = await call(session, "p__big", {"size": 1_200_000})
    return json.loads(text(result))["fileRef"]["id"]


@dataclass
class Heavy:
    """What alice's work came to: how many calls answered, how many were told to wait (Busy), failures."""

    answered: int = 0
    busy: int = 0
    failures: list[str] = field(default_factory=list)
    sessions_opened: int = 0
    sessions_refused: int = 0
    first_flood_session_status: int = 0  # what alice's first flood session answers after the flood
    steps: list[tuple[str, float]] = field(default_factory=list)


async def _counted(heavy: Heavy, session: ClientSession, name: str, args: dict[str, Any]) -> None:
    try:
        result = await call(session, name, args)
    except Exception as exc:
        heavy.failures.append(f"{name}: {type(exc).__name__}: {exc}")
        return
    if not result.is_error:
        heavy.answered += 1
    elif "try again" in text(result) or "narrow it" in text(result):  # over her share or her limits: told plainly
        heavy.busy += 1
    else:
        heavy.failures.append(f"{name}: {text(result)[:200]}")


async def _all_at_once(calls: list[Callable[[], Awaitable[None]]]) -> None:
    async with anyio.create_task_group() as tg:
        for one in calls:
            tg.start_soon(one)


async def big_result(url: str, size: int = 25_000_000) -> str:
    """Alice's 25 MB result, offloaded before the measurement: its id. (While an upstream writes 25 MB on
    its one stdio pipe, a call of anyone's to that same upstream waits behind it, with or without a
    gateway: that is the upstream's order, not a share the gateway hands out.)"""
    async with tenant(url, ALICE) as alice:
        big = await call(alice, "p__big", {"size": size})
        return json.loads(text(big))["fileRef"]["id"]


async def heavy_work(
    url: str,
    heavy: Heavy,
    rid: str,
    notes: int = 1_500,
    flood: int = SESSIONS_PER_TOKEN + 50,
    queries: int = 40,
    long_notes: int = 40,
    parts: int = 600,
) -> None:
    """Alice's set on her result `rid`, step by step (each step's seconds in `heavy.steps`). The defaults
    are the load the bench measures; the test runs a smaller one of every kind."""
    async with tenant(url, ALICE) as alice:
        started = time.perf_counter()

        def step(name: str) -> None:
            heavy.steps.append((name, time.perf_counter() - started))

        sqls = [
            f"SELECT name, count(*) AS n, sum(price) FROM items WHERE id % {k + 2} = 0 GROUP BY name ORDER BY n DESC LIMIT 5"
            for k in range(queries)
        ]
        await _all_at_once(
            [lambda s=s: _counted(heavy, alice, "response_query", {"path": rid, "sql": s}) for s in sqls]
        )
        step(f"{queries} queries")
        recursive = {"path": rid, "json_path": "$.data..*"}
        await _all_at_once([lambda: _counted(heavy, alice, "response_slice", recursive)] * 2)
        step("2 recursive slices")
        note = "note {n}: the deploy of service {n} moved to region eu-{m} after the incident review"
        batch = 50
        for first in range(0, notes, batch):
            await _all_at_once(
                [
                    lambda n=n: _counted(
                        heavy, alice, "context_append", {"session_id": "big", "text": note.format(n=n, m=n % 7)}
                    )
                    for n in range(first, min(first + batch, notes))
                ]
            )
        step(f"{notes} notes")
        await _counted(heavy, alice, "context_compact", {"session_id": "big", "keep_recent": 10})
        step("compaction")
        long_note = "alpha beta gamma delta 한국어 검색 " * 3_500  # about 100,000 characters
        for n in range(long_notes):
            await _counted(heavy, alice, "context_append", {"session_id": "long", "text": f"{n} {long_note[:100_000]}"})
        await _counted(
            heavy, alice, "context_recall", {"session_id": "long", "query": "gamma 검색", "max_tokens": 4000}
        )
        step(f"recall over {long_notes} long notes")
        document = "".join(
            f"# Part {i}\n\n" + f"service {i} moved to region eu-{i % 7} 세션을 " * 200 + "\n\n" for i in range(parts)
        )
        await _all_at_once(
            [lambda t=t: _counted(heavy, alice, "doc_ingest", {"text": document + t, "title": t}) for t in ("d1", "d2")]
        )
        step(f"two documents of {len(document) >> 20} MB ingested at once")
    await session_flood(url, ALICE, flood, heavy)
    step("session flood")


async def session_flood(url: str, token: str, count: int, heavy: Heavy) -> None:
    """`count` sessions opened and left open (no DELETE), as a careless or hostile host does."""
    auth = {"authorization": f"Bearer {token}"}
    first = ""
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
        for _ in range(count):
            answer = await http.post(url, json=INIT, headers=HEADERS | auth)
            if answer.status_code == 200:
                heavy.sessions_opened += 1
                first = first or answer.headers.get("mcp-session-id", "")
            else:
                heavy.sessions_refused += 1
        if first:  # past her share, her oldest idle session was reclaimed (its host would open a new one)
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            again = await http.post(url, json=ping, headers=HEADERS | auth | {"mcp-session-id": first})
            heavy.first_flood_session_status = again.status_code


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
