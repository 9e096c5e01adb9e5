"""The one token estimate every part uses. It leans high: an undercount overflows the window.

There is no universal tokenizer. The estimate counts what BPE tokenizers charge for: letter
runs, camelCase humps and long ALL-CAPS runs, digits (Qwen-style vocabularies spend one token per
digit), punctuation, newlines, tabs and indentation, Hangul and other CJK characters, other
non-ASCII characters and emoji, times a margin. `bench/tokens.py` fits the rates on 25 kinds of
text (2,000-character windows) against the largest count of four tokenizers (cl100k, o200k, Qwen
3.6, Llama 3), and sizes the margin so that a kind the fit never saw is undercounted in at most 1 %
of its windows (leave-one-kind-out). All counting runs in C (`bytes.translate`, str methods and a
few regexes), not a Python loop per character.

Calibration against the user's own model (gateway.services.model_endpoint) replaces the built-in rate of a content
kind (prose, code, json, cjk) by the measured one, with a margin.
"""

from __future__ import annotations

import re
import string
import threading
from collections.abc import Mapping
from operator import mul
from typing import Any

from gateway.services.text import CJK_RUN, dumps

# The features as patterns: their definition (tests/unit/test_token_counts.py checks `_counts` against
# it). The ASCII ones are counted with byte classes, the rest with these regexes.
_WORD = re.compile(r"[A-Za-z]+")
_HUMP = re.compile(r"[a-z][A-Z]")
_CAPS_RUN = re.compile(r"[A-Z]{5,}")
_HANGUL_RUN = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7af]+")
_NUM_RUN = re.compile(r"[0-9]+")
_OPAQUE = re.compile(r"[A-Za-z0-9+/=_-]{16,}")
_SPACE_RUN = re.compile(r"[ \t]{2,}")
_WIDE_RUN = re.compile("[\u0800-\uffff]+")
_PUNCT_RUN = re.compile(r"[!-/:-@\[-`{-~]+")

# Tokens per unit, fitted by `bench/tokens.py --fit` (an asymmetric least-squares fit, weighted
# against undercounting, under lower bounds from how byte-level BPE works), and the margin it sized.
RATES = {
    "hangul": 1.194,  # per Hangul character
    "cjk": 1.021,  # per other CJK character (Kana, Han)
    "word": 1.003,  # per ASCII letter run: a BPE word is never less than one token
    "word_excess": 0.1,  # per letter beyond the 6th in a run
    "hump": 0.245,  # per camelCase boundary (`getUserName` is three pieces)
    "caps": 0.3,  # per letter beyond the 4th in an ALL-CAPS run (vocabularies hold few of them)
    "digit": 1.0,  # Qwen-style vocabularies spend one token per digit
    "num_run": 0.233,
    "opaque": 0.2,  # extra per character of a long run without spaces (base64, hex, hashes)
    "newline": 0.843,
    "tab": 0.6,
    "space_run": 1.255,  # per run of 2+ spaces/tabs (indentation included)
    "space": 0.01,  # per space/tab in such a run
    "punct": 0.138,  # per punctuation character...
    "punct_run": 0.591,  # ...and per run of them (BPE merges `"},` into few tokens)
    "other": 1.0,  # per other non-ASCII character (é, Cyrillic, ...)
    "wide": 1.0,  # extra per other character of 3 UTF-8 bytes (symbols, dingbats: byte-level tokens)
    "astral": 2.184,  # extra per character outside the BMP (emoji), on top of `other`
}
FIT_MARGIN = 1.168  # the worst kind's 99.5th percentile of real/estimate, over every kind in the fit
KINDS = ("prose", "code", "json", "cjk")
SAMPLE_ABOVE = 512 * 1024  # characters; larger texts are estimated from evenly spaced slices
SAMPLE_SLICES = 64
SAMPLE_SLICE = 4096
SAMPLE_MARGIN = 1.05


class TokenEstimator:
    """The built-in rates times a calibrated multiplier per content kind. The gateway serves one model,
    so the process has one estimator (`ESTIMATOR`); tests and benches may make their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scales: dict[str, float] = dict.fromkeys(KINDS, 1.0)

    def set_scales(self, scales: Mapping[str, float]) -> None:
        """Install calibrated per-kind multipliers (from the model endpoint client)."""
        with self._lock:
            for kind, value in scales.items():
                if kind in self._scales:
                    self._scales[kind] = float(value)

    def reset(self) -> None:
        self.set_scales(dict.fromkeys(KINDS, 1.0))

    def scales(self) -> dict[str, float]:
        return dict(self._scales)

    def estimate(self, text: str) -> int:
        """Tokens `text` will cost in the user's model, leaning high."""
        if not text:
            return 0
        if len(text) > SAMPLE_ABOVE:
            # Offloaded results reach tens of MB; 256 KB of slices tell their rate well enough.
            step = len(text) // SAMPLE_SLICES
            sample = [text[i * step : i * step + SAMPLE_SLICE] for i in range(SAMPLE_SLICES)]
            per_char = sum(self.estimate(s) for s in sample) / sum(map(len, sample))
            return int(per_char * len(text) * SAMPLE_MARGIN) + 1
        counts = _counts(text)
        raw = FIT_MARGIN * sum(map(mul, _RATE_VECTOR, counts))
        return int(raw * self._scales[_kind(text, counts)]) + 1


FEATURES = (  # the order `features` counts in (and the rates are summed in)
    "hangul",
    "cjk",
    "word",
    "hump",
    "caps",
    "word_excess",
    "digit",
    "num_run",
    "opaque",
    "newline",
    "tab",
    "space_run",
    "space",
    "punct",
    "punct_run",
    "other",
    "wide",
    "astral",
)
_RATE_VECTOR = tuple(RATES[name] for name in FEATURES)
_CJK_AT, _HANGUL_AT, _PUNCT_AT, _NEWLINE_AT, _SPACE_AT = (
    FEATURES.index(k) for k in ("cjk", "hangul", "punct", "newline", "space")
)


def _classes(spec: dict[str, str]) -> bytes:
    """A `bytes.translate` table: each listed ASCII character to its class letter, every other byte
    (UTF-8 continuation bytes included) to a space, so `split()` yields the runs of one class."""
    table = bytearray(b" " * 256)
    for chars, cls in spec.items():
        for byte in chars.encode():
            table[byte] = ord(cls)
    return bytes(table)


_PUNCT_CHARS = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum())  # `_PUNCT_RUN`'s class
_LETTER = _classes({string.ascii_letters: "a"})
_LONG_RUN = re.compile(rb"a{7,}")
_CASE = _classes({string.ascii_lowercase: "l", string.ascii_uppercase: "U"})
_UPPER = _classes({string.ascii_uppercase: "U"})
_DIGIT = _classes({string.digits: "0"})
_PUNCT = _classes({_PUNCT_CHARS: "!"})
_OPAQUE_CHARS = _classes({string.ascii_letters + string.digits + "+/=_-": "o"})
_BLANK = _classes({" \t": "s"})


def _runs(classes: bytes, mark: bytes) -> int:
    """Runs of one class in a translated text (`_classes`): where one starts, after a space or at 0."""
    return classes.count(b" " + mark) + classes.startswith(mark)


def _counts(text: str) -> tuple[int, ...]:
    """The feature counts in `FEATURES` order. The ASCII features (the patterns above) are counted on
    the UTF-8 bytes mapped to one class letter per feature by `bytes.translate`: runs are what
    `split()` returns, boundaries what `count` finds (twice as fast as a regex pass per feature, and
    the same counts: a non-ASCII character breaks a run either way). A lone surrogate (an upstream's
    JSON escape) is counted as one other character."""
    n = len(text)
    plain = text.isascii()
    data = text.encode("ascii") if plain else text.encode("utf-8", "surrogatepass")
    letter = data.translate(_LETTER)
    letters = letter.count(b"a")
    long_runs = _LONG_RUN.findall(letter) if letters > 6 else []  # few words are long: no object for the rest
    case = data.translate(_CASE)
    caps = [size for size in map(len, data.translate(_UPPER).split()) if size >= 5] if b"UUUUU" in case else []
    digits = data.translate(_DIGIT)
    digit = digits.count(b"0")
    punct = data.translate(_PUNCT)
    punct_chars = punct.count(b"!")
    opaque = data.translate(_OPAQUE_CHARS)
    blanks = (
        [size for size in map(len, data.translate(_BLANK).split()) if size >= 2]
        if b"\t" in data or b"  " in data
        else []
    )
    non_ascii = 0 if plain else n - len(text.encode("ascii", "ignore"))
    cjk = sum(map(len, CJK_RUN.findall(text))) if non_ascii else 0
    hangul = sum(map(len, _HANGUL_RUN.findall(text))) if cjk else 0
    wide = sum(map(len, _WIDE_RUN.findall(text))) - cjk if non_ascii else 0
    return (
        hangul,
        cjk - hangul,
        _runs(letter, b"a") if letters else 0,
        case.count(b"lU"),  # `[a-z][A-Z]`: the pair cannot overlap itself, so `count` finds each
        sum(caps) - 4 * len(caps),
        sum(map(len, long_runs)) - 6 * len(long_runs),  # letters beyond the 6th of each run
        digit,
        _runs(digits, b"0") if digit else 0,
        sum(size for size in map(len, opaque.split()) if size >= 16) if b"o" * 16 in opaque else 0,
        text.count("\n"),
        text.count("\t"),
        len(blanks),
        sum(blanks),
        punct_chars,
        _runs(punct, b"!") if punct_chars else 0,
        non_ascii - cjk,
        wide,
        (len(text.encode("utf-16-le", "surrogatepass")) // 2 - n) if non_ascii else 0,
    )


def features(text: str) -> dict[str, int]:
    """Counts per feature (the names of `RATES`)."""
    return dict(zip(FEATURES, _counts(text), strict=True))


def classify(text: str, feats: Mapping[str, int] | None = None) -> str:
    """prose, code, json or cjk: the kind whose calibrated rate applies."""
    return _kind(text, tuple(feats[k] for k in FEATURES) if feats is not None else _counts(text))


def _kind(text: str, counts: tuple[int, ...]) -> str:
    chars = max(1, len(text))
    if (counts[_CJK_AT] + counts[_HANGUL_AT]) * 3 >= chars:
        return "cjk"
    punct = counts[_PUNCT_AT]
    head = text.lstrip()[:1]
    if head in ("{", "[") and punct * 8 >= chars:
        return "json"
    if punct * 12 >= chars and counts[_NEWLINE_AT] and (counts[_SPACE_AT] or punct * 6 >= chars):
        return "code"
    return "prose"


def raw_estimate(text: str) -> float:
    """The built-in estimate, before calibration."""
    return FIT_MARGIN * sum(map(mul, _RATE_VECTOR, _counts(text)))


ESTIMATOR = TokenEstimator()


def estimate_tokens(text: str) -> int:
    """Tokens `text` will cost in the user's model, leaning high (the process's estimator)."""
    return ESTIMATOR.estimate(text)


def json_tokens(value: Any) -> int:
    """Tokens of a JSON value as the model reads it (compact JSON, Korean as written)."""
    return estimate_tokens(dumps(value))
