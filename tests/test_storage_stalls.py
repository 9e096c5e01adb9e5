"""A PostgreSQL that stalls under a running gateway (its processes stopped, as a frozen VM or a stuck
disk stops them): the calls that need it answer isError within seconds, saying so, and every other
call, upstream calls included, keeps answering meanwhile; so do two replicas ingesting one document."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import PY, Notes, call, gateway_env, probe, start_postgres, text_of, write_config
from mcp import ClientSession

from gateway.proxy.upstream_stdio import linear_stdio_client

pytestmark = pytest.mark.anyio


@pytest.fixture
def own_postgres() -> Iterator[Any]:
    """A PostgreSQL server of this test's own (stopping it must not stall any other test)."""
    server = start_postgres()
    try:
        yield server
    finally:
        with stalled(server, stop=False):  # whatever happened, it runs again before it is stopped
            pass
        server.cleanup()
        server.pgdata.parent.rmdir()


@contextmanager
def stalled(server: Any, stop: bool = True) -> Iterator[None]:
    """Every process of the server stopped (SIGSTOP) for the block, then continued."""
    main = int((server.pgdata / "postmaster.pid").read_text().split()[0])
    pids = [main]
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == main:
                pids.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    try:
        if stop:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@asynccontextmanager
async def gateway(tmp_path: Path, dsn: str, plugins: list[str], notes: Any = None) -> AsyncIterator[ClientSession]:
    """A gateway process over stdio on PostgreSQL, the probe behind it (`p__grow` changes its tools)."""
    cfg = write_config(tmp_path, {"p": probe("p", "--mutate", "grow")}, plugins=plugins)
    cfg.write_text(cfg.read_text() + f'\n[storage]\nbackend = "postgres"\ndsn = {json.dumps(dsn)}\n')
    with open(tmp_path / "gw.err", "ab") as errlog:
        async with (
            linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, errlog) as streams,
            ClientSession(*streams, message_handler=notes) as session,
        ):
            await session.initialize()
            await session.list_tools()
            yield session


async def test_a_stalled_database_never_holds_up_routing(tmp_path: Path, own_postgres: Any) -> None:
    """The upstream's tools change while PostgreSQL is stopped: the routing table is rebuilt (the host
    hears of the new tools) and upstream calls answer at once; the definitions ledger is written
    behind, once the database is back."""
    notes = Notes()
    async with gateway(tmp_path, own_postgres.get_uri(), [], notes) as session:
        notes.changed = anyio.Event()  # (set by the listings at start)
        with stalled(own_postgres):
            with anyio.fail_after(10):
                assert text_of(await call(session, "p__grow")) != ""
                await notes.changed.wait()
                while "p__grown" not in {t.name for t in (await session.list_tools()).tools}:
                    await anyio.sleep(0.05)  # rebuilt with the ledger's database stopped
                assert text_of(await call(session, "p__echo", {"text": "still here"})) == "still here"
        with anyio.fail_after(60):  # the new tool's first definition reaches the database after all
            while "grown" not in _ledger_tools(own_postgres.get_uri()):
                await anyio.sleep(0.2)
    assert "Traceback" not in (tmp_path / "gw.err").read_text()


def _ledger_tools(dsn: str) -> set[str]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT tool FROM ctx_definitions.definitions").fetchall()}


async def test_calls_that_need_a_stalled_database_answer_is_error_within_seconds(
    tmp_path: Path, own_postgres: Any
) -> None:
    """Memory and document calls against a stopped PostgreSQL answer isError saying it did not answer
    (within the gateway's limit, not never); an upstream call made meanwhile answers at once; once the
    database runs again, the next call succeeds."""
    async with gateway(tmp_path, own_postgres.get_uri(), ["memory", "documents"]) as session:
        assert not (await call(session, "context_append", {"session_id": "s", "text": "before"})).is_error
        assert not (await call(session, "doc_ingest", {"text": "# Runbook\n\nrestart it", "title": "r"})).is_error
        answers: dict[str, Any] = {}

        async def ask(tool: str, args: dict[str, Any]) -> None:
            answers[tool] = await call(session, tool, args)

        with stalled(own_postgres):
            with anyio.fail_after(30):  # the gateway's limit is 13 s
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask, "context_append", {"session_id": "s", "text": "during"})
                    tg.start_soon(ask, "doc_search", {"query": "restart"})
                    with anyio.fail_after(5):  # meanwhile
                        assert text_of(await call(session, "p__echo", {"text": "here"})) == "here"
                    assert not answers  # the database calls were still waiting then
        for tool, result in answers.items():
            said = text_of(result)
            assert result.is_error and "PostgreSQL did not answer within" in said and "\n" not in said, (tool, said)
        back = await call(session, "context_append", {"session_id": "s", "text": "after"})
        assert not back.is_error, text_of(back)
        found = await call(session, "doc_search", {"query": "restart"})
        assert not found.is_error and "restart it" in text_of(found)
    assert "Traceback" not in (tmp_path / "gw.err").read_text()
