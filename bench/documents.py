"""Documents: ingest speed and search latency on a generated 30 MB Markdown corpus, beside a BM25
index rebuilt for every query (what mcp-context-window does) on the same chunks.

    python bench/documents.py [--mb 30]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import pct, table

TOPICS = [
    "install",
    "configure",
    "deploy",
    "rollback",
    "cache",
    "token",
    "session",
    "queue",
    "worker",
    "index",
    "schema",
    "migration",
    "backup",
    "restore",
    "monitor",
    "alert",
    "proxy",
    "certificate",
    "webhook",
    "retry",
    "timeout",
]


def vocabulary() -> list[str]:
    """Real documentation words (installed packages' READMEs), most frequent first: pages drawn from it
    follow the Zipf-like spread of real docs instead of repeating a handful of words."""
    import collections
    import re
    import sysconfig

    counts: collections.Counter[str] = collections.Counter()
    for meta in Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info/METADATA"):
        counts.update(w.lower() for w in re.findall(r"[A-Za-z]{3,}", meta.read_text(errors="replace")))
    return [w for w, _ in counts.most_common(20000)] or TOPICS


# filled in main(): a worker process the documents plugin starts imports this module again
VOCAB: list[str] = []
WEIGHTS: list[float] = []
LANGS = ("python", "bash", "typescript", "json", "toml", "go")


def page(rng: random.Random, n: int) -> str:
    words = lambda k: " ".join(rng.choices(VOCAB, WEIGHTS, k=k))  # noqa: E731
    out = [f"# Service {n}: {words(3)}\n", f"{words(40)}.\n"]
    for s in range(rng.randint(3, 7)):
        out.append(f"## {words(2).title()} {s}\n\n{words(60)}.\n\n{words(30)} `config_{n}_{s}`.\n")
        if rng.random() < 0.7:
            lang = rng.choice(LANGS)
            body = "\n".join(f"run_step_{i}({words(2)!r}, retries={i})" for i in range(rng.randint(3, 25)))
            out.append(f"```{lang}\n{body}\n```\n")
        if rng.random() < 0.4:
            rows = "\n".join(f"| {rng.choice(TOPICS)} | {rng.randint(1, 999)} | {words(4)} |" for _ in range(8))
            out.append(f"| key | value | note |\n|---|---|---|\n{rows}\n")
        if rng.random() < 0.3:
            out.append("### 한국어 메모\n\n배포 전에 캐시를 비우고 세션 토큰을 갱신합니다. 오류가 나면 롤백합니다.\n")
    return "\n".join(out)


def main(mb: int) -> None:
    # imported here, not at the top: the ingest's worker process imports this module again
    from memory import naive_bm25

    from plugins.documents import DocumentStore

    VOCAB[:] = vocabulary()
    WEIGHTS[:] = [1 / (rank + 10) for rank in range(len(VOCAB))]
    rng = random.Random(9)
    docs, size = [], 0
    while size < mb * 2**20:
        docs.append(page(rng, len(docs)))
        size += len(docs[-1].encode())
    corpus = "\n".join(docs)
    store = DocumentStore(Path(tempfile.mkdtemp(prefix="ctx-bench-docs-")) / "index.sqlite")
    t = time.perf_counter()
    info = store.put("doc_bench", "bench", "generated", corpus, "markdown")
    ingest_s = time.perf_counter() - t
    t = time.perf_counter()
    again = store.put("doc_bench", "bench", "generated", corpus, "markdown")
    reingest_s = time.perf_counter() - t
    assert again["unchanged"]
    chunks = [c["text"] for c in store.chunks("doc_bench", 0, info["chunks"])]
    # queries mix frequent and rarer words, as people type them
    queries = [" ".join([*rng.choices(VOCAB[:200], k=1), *rng.choices(VOCAB[200:5000], k=2)]) for _ in range(40)]
    fts, naive = [], []
    for q in queries:
        t = time.perf_counter()
        store.index.search(q, 5)
        fts.append((time.perf_counter() - t) * 1000)
    for q in queries[:5]:
        t = time.perf_counter()
        naive_bm25(chunks, q)
        naive.append((time.perf_counter() - t) * 1000)
    rows = [
        ["measure", "value", "target"],
        ["corpus", f"{size / 2**20:.1f} MB, {len(docs)} pages, {info['chunks']} chunks", ""],
        ["ingest", f"{size / 2**20 / ingest_s:.2f} MB/s ({ingest_s:.1f} s)", ">= 4 MB/s"],
        ["re-ingest unchanged", f"{reingest_s * 1000:.0f} ms", "instant"],
        ["search p50 / p95 (FTS5)", f"{pct(fts, 0.5):.2f} / {pct(fts, 0.95):.2f} ms", "p50 <= 20 ms"],
        ["search p50, BM25 rebuilt per query", f"{pct(naive, 0.5):.0f} ms", ""],
        ["ratio", f"{pct(fts, 0.5) / pct(naive, 0.5):.4f}x", ""],
    ]
    print(table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=30)
    main(parser.parse_args().mb)
