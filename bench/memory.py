"""Session memory: append and recall latency at 100, 1,000 and 10,000 entries, through the MCP
tools (in-process front server, real SQLite, real fsync), beside a BM25 index rebuilt for every
query in pure Python (what mcp-context-window does).

    python bench/memory.py
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, inproc_session, pct, table

WORDS = [
    "deploy",
    "ledger",
    "invoice",
    "refund",
    "token",
    "session",
    "cache",
    "retry",
    "timeout",
    "schema",
    "migration",
    "tenant",
    "billing",
    "payment",
    "webhook",
    "queue",
    "worker",
    "index",
    "latency",
    "rollback",
    "feature",
    "flag",
]
KOREAN = ["세션", "환불", "배포", "캐시", "오류", "지연", "마이그레이션", "결제", "알림", "설정"]


def note(rng: random.Random, i: int) -> str:
    words = rng.sample(WORDS, 6) + rng.sample(KOREAN, 2)
    return f"note {i}: {' '.join(words)} id=ID_{rng.randrange(10**6)} file=src/mod_{i % 50}.py"


def naive_bm25(texts: list[str], query: str, k: int = 5) -> list[int]:
    docs = [re.findall(r"\w+", t.lower()) for t in texts]
    avg = sum(map(len, docs)) / max(1, len(docs))
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(d))
    terms = re.findall(r"\w+", query.lower())
    scores = []
    for i, d in enumerate(docs):
        tf = Counter(d)
        s = 0.0
        for t in terms:
            if tf[t]:
                idf = math.log(1 + (len(docs) - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf[t] * 2.2 / (tf[t] + 1.2 * (0.25 + 0.75 * len(d) / avg))
        scores.append((s, i))
    return [i for _, i in sorted(scores, reverse=True)[:k]]


async def main() -> None:
    rows = [
        [
            "entries",
            "append p50 ms",
            "append p95 ms",
            "recall p50 ms",
            "recall p95 ms",
            "rebuild-per-query p50 ms",
            "ratio",
        ]
    ]
    rng = random.Random(3)
    for size in (100, 1000, 10_000):
        tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-mem-"))
        cfg = tmp / "gw.toml"
        cfg.write_text(
            f'[gateway]\nworkspace = {json.dumps(str(tmp / "ws"))}\nplugins = ["memory"]\nbudget = 4000\n'
            '[llm]\nbase_url = "http://127.0.0.1:9/v1"\n'
        )
        texts: list[str] = []
        async with inproc_session(cfg) as s:
            appends = []
            for i in range(size):
                texts.append(note(rng, i))
                t = time.perf_counter()
                await call(s, "context_append", {"session_id": "bench", "text": texts[-1]})
                appends.append((time.perf_counter() - t) * 1000)
            recalls, naive = [], []
            for _ in range(30):
                query = " ".join(rng.sample(WORDS, 2) + rng.sample(KOREAN, 1))
                t = time.perf_counter()
                result = await call(s, "context_recall", {"session_id": "bench", "query": query, "max_tokens": 800})
                recalls.append((time.perf_counter() - t) * 1000)
                assert not result.is_error
                t = time.perf_counter()
                naive_bm25(texts, query)
                naive.append((time.perf_counter() - t) * 1000)
        rows.append(
            [
                str(size),
                f"{pct(appends, 0.5):.2f}",
                f"{pct(appends, 0.95):.2f}",
                f"{pct(recalls, 0.5):.2f}",
                f"{pct(recalls, 0.95):.2f}",
                f"{pct(naive, 0.5):.2f}",
                f"{pct(recalls, 0.5) / pct(naive, 0.5):.2f}x",
            ]
        )
    print(table(rows))
    print("\nappend includes fsync of the session log; recall is FTS5 BM25 x recency plus packing into max_tokens")


if __name__ == "__main__":
    anyio.run(main)
