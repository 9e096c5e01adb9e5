"""The fast feature counts equal the features' definition (their regex patterns), on any text."""

from __future__ import annotations

import random
from itertools import repeat

from gateway.services import tokens as tk


def reference_counts(text: str) -> tuple[int, ...]:
    """The features counted straight from their patterns (how `_counts` was first written)."""
    n = len(text)
    lengths = list(map(len, tk._WORD.findall(text)))
    numbers = list(map(len, tk._NUM_RUN.findall(text)))
    spaces = list(map(len, tk._SPACE_RUN.findall(text)))
    puncts = list(map(len, tk._PUNCT_RUN.findall(text)))
    caps = list(map(len, tk._CAPS_RUN.findall(text)))
    non_ascii = 0 if text.isascii() else n - len(text.encode("ascii", "ignore"))
    cjk = sum(map(len, tk.CJK_RUN.findall(text))) if non_ascii else 0
    hangul = sum(map(len, tk._HANGUL_RUN.findall(text))) if cjk else 0
    wide = sum(map(len, tk._WIDE_RUN.findall(text))) - cjk if non_ascii else 0
    return (
        hangul,
        cjk - hangul,
        len(lengths),
        len(tk._HUMP.findall(text)),
        sum(caps) - 4 * len(caps),
        sum(lengths) - sum(map(min, lengths, repeat(6))),
        sum(numbers),
        len(numbers),
        sum(map(len, tk._OPAQUE.findall(text))),
        text.count("\n"),
        text.count("\t"),
        len(spaces),
        sum(spaces),
        sum(puncts),
        len(puncts),
        non_ascii - cjk,
        wide,
        (len(text.encode("utf-16-le", "surrogatepass")) // 2 - n) if non_ascii else 0,
    )


SAMPLES = [
    "",
    "call 1",
    "getUserName returns HTTPServerError for XMLHttpRequest",
    '{"id": 12345, "token": "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=", "ok": true}',
    "def f(x):\n\treturn  x  +  1\n    # indented\n",
    "한국어 문서를 검색합니다. 토큰 수는 얼마입니까?",
    "漢字とかなカナ, café, naïve, Ωmega, ✓ done 😀🎉",
    "a\ud800b lone surrogate",
    "AAAAA BBBBBBBBBB aaaaaaaaaaaaaaaaaaaaaaaaaaaaa 0000000000000000 ----==== ++//",
    "!!!???...,,, ;;; :-) \t \t  end",
]


def test_counts_match_the_patterns_on_samples_and_noise() -> None:
    rng = random.Random(7)
    alphabet = "aZbQ09 \t\n\r!{}_-+/=.,가나漢字é😀\u0800\ud800ABCDEFxyz    "
    noise = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))) for _ in range(3000)]
    for text in SAMPLES + noise:
        assert tk._counts(text) == reference_counts(text), repr(text[:80])


def test_a_lone_surrogate_is_counted_not_raised() -> None:
    # an upstream's `\ud800` escape reaches the estimate as a lone surrogate; it used to raise there,
    # so offload passed such a result on uncounted
    assert tk.estimate_tokens("x" * 100 + "\ud800") > tk.estimate_tokens("x" * 100)


def test_a_long_text_is_counted_once_per_way_of_counting(monkeypatch) -> None:
    """A file read again costs no second count (tens of ms for a few MB with the real tokenizers); a
    different text of the same length, another tokenizer family or a calibration counts anew."""
    estimator = tk.TokenEstimator(exact=False)
    counted: list[int] = []
    real = estimator._estimate
    monkeypatch.setattr(estimator, "_estimate", lambda text: counted.append(len(text)) or real(text))
    text = "a line of a log file, 42 of them\n" * 3_000  # ~100 KB
    first = estimator.estimate(text)
    assert estimator.estimate(text) == first and estimator.estimate("".join(text)) == first
    assert counted == [len(text)]
    assert estimator.estimate(text[:-1] + "x") > 0 and len(counted) == 2  # same length, other text
    estimator.set_family("cl100k")
    assert estimator.estimate(text) != first and len(counted) == 3
    estimator.set_scales({kind: 1.5 for kind in tk.KINDS})
    estimator.estimate(text)
    assert len(counted) == 4
    short = "short text " * 100  # below REMEMBER_FROM: cheap, counted every time
    estimator.estimate(short), estimator.estimate(short)
    assert counted[-2:] == [len(short), len(short)]


def test_a_count_taken_while_the_way_of_counting_changed_is_not_remembered(monkeypatch) -> None:
    text = "a line of a log file, 42 of them\n" * 3_000
    true_count = tk.TokenEstimator(exact=False).estimate(text)
    estimator = tk.TokenEstimator(exact=False)
    real = estimator._estimate

    def calibrated_meanwhile(counted: str) -> int:
        estimator.set_scales(dict.fromkeys(tk.KINDS, 1.5))  # a calibration lands during the count
        return real(counted)

    monkeypatch.setattr(estimator, "_estimate", calibrated_meanwhile)
    assert estimator.estimate(text) > true_count
    monkeypatch.setattr(estimator, "_estimate", real)
    estimator.set_scales(dict.fromkeys(tk.KINDS, 1.0))  # back as it was: the count must be too
    assert estimator.estimate(text) == true_count


def test_no_text_is_estimated_below_what_its_prefix_promises() -> None:
    """`at_least(prefix)` is a floor for every text that begins with it, whatever its kind turns out to
    be: offload decides from it that a result is over its token limit without counting it whole."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import token_corpus

    rng = random.Random(11)
    texts = [
        t
        for kind in ("english", "python_source", "json_pretty", "korean", "opaque", "numeric")
        for t in getattr(token_corpus, kind)(20)
    ]
    texts += [
        "".join(
            rng.choice(["word ", "Ab", "12", "  ", "\t", "{}", "가나", "漢", "😀", "x" * 20, "\n"]) for _ in range(2000)
        )
        for _ in range(20)
    ]
    texts += [a + b for a, b in zip(texts, reversed(texts), strict=True)]  # a prefix of one kind, the rest of another
    estimators = [tk.TokenEstimator(family, exact=False) for family in tk.TOKENIZERS]
    calibrated = tk.TokenEstimator(exact=False)
    calibrated.set_scales({"prose": 1.3, "code": 0.8, "json": 1.0, "cjk": 1.1})
    for text in texts:
        for cut in sorted({len(text) // 7, len(text) // 3, len(text) // 2, len(text) - 1, len(text)}):
            for estimator in [*estimators, calibrated]:
                assert estimator.at_least(text[:cut]) <= estimator.estimate(text), (estimator.family, cut, text[:60])
