"""The one token estimate every part uses. It leans high: an undercount overflows the window.

The estimate counts what BPE tokenizers charge for: letter runs, camelCase humps and long ALL-CAPS
runs, digits and digit runs, punctuation, newlines, tabs and indentation, Hangul and other CJK
characters, other non-ASCII characters and emoji. Each tokenizer family (`FAMILIES`: cl100k, o200k,
Llama 3, Qwen) has its own rates and margin per kind of text (prose, code, JSON, CJK), fitted by
`bench/tokens.py --fit` on a tuning corpus of 26 kinds of text so that no tuning window is
undercounted, and measured on held-out text. `[gateway] tokenizer` names the host's family; `auto`
(the default) takes the largest of the four, so it fits the widest common tokenizer. All counting
runs in C (`bytes.translate`, str methods and a few regexes), not a Python loop per character.

Calibration against the user's own model (gateway.services.model_endpoint) replaces the `auto`
figure of a content kind (prose, code, json, cjk) by the measured rate, with a margin; a named
tokenizer is the user's word about the host and is not overridden.

Exact counts replace the estimate once the real tokenizers are loaded (gateway.services.tokenizers,
in the background from the first text of `EXACT_FROM` characters): a named family counts with its own
tokenizer; `auto` counts with cl100k and Qwen 3.6 (the largest count of the four families on every
corpus kind but JSON schemas and HTML, where o200k's is up to 8.7 % above both) times `AUTO_MARGIN`.
The rates above remain what counts until then, where a tokenizer cannot load, and under calibration.
"""

from __future__ import annotations

import re
import string
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from operator import mul
from typing import Any

from gateway.services import json_wire, tokenizers
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

# Per tokenizer family and kind of text: (margin, rates in `FEATURES` order), from
# `bench/tokens.py --fit` on the tuning half of its corpus. The estimate is margin * rates . counts.
# fmt: off
FITTED: dict[str, dict[str, tuple[float, tuple[float, ...]]]] = {
    "cl100k": {
        "prose": (1.085, (1.0, 1.0, 1.115, 1.225, 0.019, 0.0, 0.191, 0.671, 0.15, 0.182, 1.0, 0.667, 0.01, 0.0, 0.85, 1.245, 1.0, 2.0)),
        "code": (1.263, (1.0, 1.187, 1.072, 0.0, 0.195, 0.0, 0.255, 0.986, 0.15, 0.644, 0.617, 1.02, 0.01, 0.275, 0.339, 1.0, 1.0, 3.0)),
        "json": (1.044, (1.306, 1.0, 1.0, 1.14, 0.0, 0.0, 0.0, 0.93, 0.15, 0.0, 0.0, 1.114, 0.01, 0.022, 0.926, 1.0, 1.0, 2.0)),
        "cjk": (1.035, (1.191, 1.033, 1.0, 0.0, 0.0, 0.0, 1.0, 2.391, 0.15, 0.0, 0.0, 0.0, 0.01, 0.0, 0.794, 1.0, 1.0, 2.0)),
    },
    "o200k": {
        "prose": (1.1, (0.5, 0.4, 1.14, 1.32, 0.157, 0.007, 0.445, 0.0, 0.15, 0.0, 1.0, 0.881, 0.01, 0.035, 0.751, 1.0, 1.0, 2.0)),
        "code": (1.267, (0.666, 0.749, 1.086, 0.0, 0.211, 0.0, 0.269, 0.941, 0.15, 0.622, 0.622, 1.017, 0.01, 0.284, 0.333, 1.0, 1.0, 3.0)),
        "json": (1.042, (0.767, 0.686, 1.0, 1.082, 0.0, 0.0, 0.0, 0.943, 0.15, 0.0, 0.0, 1.228, 0.01, 0.099, 0.805, 1.0, 1.0, 2.0)),
        "cjk": (1.032, (0.713, 0.682, 1.0, 0.0, 0.0, 0.0, 0.546, 2.193, 0.15, 0.0, 0.0, 0.0, 0.01, 0.0, 1.133, 1.0, 1.0, 2.0)),
    },
    "llama3": {
        "prose": (1.085, (0.5, 0.4, 1.114, 1.222, 0.017, 0.0, 0.193, 0.661, 0.15, 0.187, 1.0, 0.665, 0.01, 0.0, 0.853, 1.164, 1.0, 2.0)),
        "code": (1.263, (0.665, 0.767, 1.071, 0.0, 0.195, 0.0, 0.256, 0.984, 0.15, 0.647, 0.617, 1.017, 0.01, 0.275, 0.341, 1.0, 1.0, 3.0)),
        "json": (1.044, (0.763, 0.706, 1.0, 1.139, 0.0, 0.0, 0.0, 0.932, 0.15, 0.0, 0.0, 1.119, 0.01, 0.024, 0.922, 1.0, 1.0, 2.0)),
        "cjk": (1.027, (0.747, 0.585, 1.0, 0.0, 0.0, 0.0, 1.0, 2.5, 0.15, 0.0, 0.0, 0.0, 0.01, 0.0, 1.055, 2.36, 1.0, 2.0)),
    },
    "qwen": {
        "prose": (1.063, (0.5, 0.4, 1.113, 1.044, 0.046, 0.008, 1.0, 0.0, 0.15, 0.521, 1.0, 0.929, 0.01, 0.0, 0.812, 1.0, 1.0, 2.092)),
        "code": (1.218, (0.5, 0.521, 1.014, 0.029, 0.169, 0.0, 1.0, 0.19, 0.15, 0.952, 0.594, 1.187, 0.01, 0.254, 0.523, 1.0, 1.0, 3.0)),
        "json": (1.043, (0.5, 0.6, 1.0, 1.025, 0.0, 0.015, 1.0, 0.0, 0.15, 0.406, 1.0, 2.265, 0.01, 0.12, 0.585, 1.0, 1.0, 2.0)),
        "cjk": (1.038, (0.604, 0.431, 1.0, 0.0, 0.0, 0.0, 1.0, 2.5, 0.15, 0.0, 0.0, 0.0, 0.01, 0.0, 1.411, 1.177, 1.0, 2.0)),
    },
}
# fmt: on
FAMILIES = ("cl100k", "o200k", "llama3", "qwen")
TOKENIZERS = ("auto", *FAMILIES)  # what `[gateway] tokenizer` accepts
FAMILY_LABELS = {"cl100k": "cl100k (GPT-4)", "o200k": "o200k (GPT-4o)", "llama3": "Llama 3", "qwen": "Qwen"}
KINDS = ("prose", "code", "json", "cjk")
SAMPLE_ABOVE = 512 * 1024  # characters; larger texts are estimated from evenly spaced slices
SAMPLE_SLICES = 64
SAMPLE_SLICE = 4096
SAMPLE_MARGIN = 1.05
EXACT_FROM = 1024  # characters: the first text this long loads the real tokenizers (shorter ones alone never do)
# characters: a text this long is counted once per process and way of counting (a file read again, the
# same result listed twice): an exact count takes ~0.13 ms per KB
REMEMBER_FROM = 64 * 1024
REMEMBERED = 256  # counts of long texts kept, the least recently used dropped
# What `auto` counts exactly: the two families whose count is the largest on every corpus kind but JSON
# schemas and HTML, and a margin above the largest real/counted over the tuning windows (1.087, o200k on
# HTML); held out it never undercounts any of the four (bench/tokens.py)
AUTO_EXACT = ("cl100k", "qwen")
AUTO_MARGIN = 1.09


def describe_tokenizer(name: str) -> str:
    """What a figure is counted for, in words a user reads (stats, inspect, the monitor)."""
    if name in FAMILY_LABELS:
        return f"the {FAMILY_LABELS[name]} tokenizer"
    return "the widest common tokenizer (the largest of cl100k, o200k, Llama 3 and Qwen)"


class TokenEstimator:
    """Counts for one tokenizer family (`auto`: the largest of them), times a calibrated multiplier per
    content kind. The gateway serves one model, so the process has one estimator (`ESTIMATOR`); tests
    and benches may make their own."""

    def __init__(self, family: str = "auto", exact: bool = True) -> None:
        self._lock = threading.Lock()
        self._scales: dict[str, float] = dict.fromkeys(KINDS, 1.0)
        self.exact = exact  # False: the built-in rates only (what counts until the tokenizers load)
        self.may_load = True  # whether a long text starts loading them (`[gateway] exact_tokens`)
        self.family = "auto"
        self._exact_families: tuple[str, ...] = AUTO_EXACT
        self._remembered: OrderedDict[tuple[Any, ...], int] = OrderedDict()  # long texts' counts (`estimate`)
        self.set_family(family)

    def set_family(self, family: str) -> None:
        """Count for this tokenizer family (`[gateway] tokenizer`); `auto` for the widest of them."""
        if family not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {family!r}: use one of {', '.join(TOKENIZERS)}")
        self.family = family
        self._exact_families = AUTO_EXACT if family == "auto" else (family,)

    def configure(self, family: str, may_load: bool) -> None:
        """Count for `family` (`[gateway] tokenizer`); `may_load`: whether the real tokenizers may be
        loaded for it (`[gateway] exact_tokens`)."""
        self.set_family(family)
        self.may_load = may_load

    def load_exact(self) -> bool:
        """Load this family's real tokenizers now (commands that count before they answer); whether they are."""
        return self.exact and self.may_load and tokenizers.load(self._exact_families) is not None

    def counting_exactly(self) -> bool:
        """Whether figures are real tokenizer counts now (loaded, and no calibration overrides them)."""
        return self.exact and not self.calibrated() and tokenizers.ready(self._exact_families) is not None

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

    def calibrated(self) -> bool:
        """Whether a calibration's rates are in use (a named tokenizer is not overridden by one)."""
        return self.family == "auto" and any(v != 1.0 for v in self._scales.values())

    def describe(self) -> str:
        """What the figures are: calibrated, a real tokenizer's counts, or the built-in rates' estimate."""
        if self.calibrated():
            return "calibrated against the model endpoint"
        if self.counting_exactly():
            if self.family != "auto":
                return "counted by " + describe_tokenizer(self.family)
            return f"counted for {describe_tokenizer('auto')}: the larger of cl100k's and Qwen 3.6's counts, +9 %"
        return f"built-in estimate for {describe_tokenizer(self.family)} (the real tokenizers load with the first long text)"

    def short_label(self) -> str:
        """A few words for a note the model reads: `cl100k`, `the calibrated model`, `the widest tokenizer`."""
        if self.calibrated():
            return "the calibrated model"
        return self.family if self.family != "auto" else "the widest tokenizer"

    def estimate(self, text: str) -> int:
        """Tokens `text` will cost in the host's model, leaning high."""
        if len(text) < REMEMBER_FROM:
            return self._estimate(text) if text else 0
        # by its length and hash (the str keeps its hash; the text itself is not kept)
        return self.remembered((len(text), hash(text)), lambda: self._estimate(text))

    def remembered(self, identity: tuple[Any, ...], count: Callable[[], int]) -> int:
        """`count()` of a long text, remembered under `identity` (what names the text: its length and hash,
        a spilled file's digest) and how texts are counted now: a result read again is not counted again."""
        key = (*identity, *self._way())
        with self._lock:
            if (known := self._remembered.get(key)) is not None:
                self._remembered.move_to_end(key)
                return known
        tokens = count()
        if (*identity, *self._way()) != key:  # the way of counting changed meanwhile (tokenizers, a calibration)
            return tokens
        with self._lock:
            self._remembered[key] = tokens
            if len(self._remembered) > REMEMBERED:
                self._remembered.popitem(last=False)
        return tokens

    def at_least(self, prefix: str) -> int:
        """Tokens the built-in rates give, at the least, any text (of up to `SAMPLE_ABOVE` characters) that
        begins with `prefix`: every feature count of a text is at least its prefix's (runs cut at the end
        count less, never more), every rate is positive, and whatever the whole text's kind, its estimate
        is at least the lowest kind's (for `auto`, the calibration-shaped term it never goes below)."""
        counts = _counts(prefix)
        if self.family != "auto":
            return int(min(sum(map(mul, vector, counts)) for vector in _VECTORS[self.family].values()))
        scale = min(1.0, *self._scales.values())
        return int(CALIBRATION_MARGIN * sum(map(mul, CALIBRATION_RATES, counts)) * scale)

    def _way(self) -> tuple[Any, ...]:
        """How texts are counted now: a count made another way is not reused."""
        exact = self.exact and tokenizers.ready(self._exact_families) is not None
        return (self.family, exact, *self._scales.values())

    def _estimate(self, text: str) -> int:
        if len(text) > SAMPLE_ABOVE:
            # Offloaded results reach tens of MB; 256 KB of slices tell their rate well enough.
            step = len(text) // SAMPLE_SLICES
            sample = [text[i * step : i * step + SAMPLE_SLICE] for i in range(SAMPLE_SLICES)]
            per_char = sum(self.estimate(s) for s in sample) / sum(map(len, sample))
            return int(per_char * len(text) * SAMPLE_MARGIN) + 1
        if self.exact and not self.calibrated():
            counters = tokenizers.ready(self._exact_families, start=self.may_load and len(text) >= EXACT_FROM)
            if counters is not None:
                if len(counters) == 1:
                    return counters[0](text)
                return int(AUTO_MARGIN * max(count(text) for count in counters)) + 1
        counts = _counts(text)
        kind = _kind(text, counts)
        if self.family != "auto":
            return int(sum(map(mul, _VECTORS[self.family][kind], counts))) + 1
        if self._scales[kind] != 1.0:  # calibrated: the endpoint's measured rate
            return int(CALIBRATION_MARGIN * sum(map(mul, CALIBRATION_RATES, counts)) * self._scales[kind]) + 1
        # Never below the single widest-lean estimate: the per-family fits undercount the largest true
        # count by 4-16 % on cut answers of CSV lines, logs and query rows (tests/unit/test_offload_fill.py)
        return int(max(_widest(kind, counts), CALIBRATION_MARGIN * sum(map(mul, CALIBRATION_RATES, counts)))) + 1


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
# Above the largest tuning ratio: the first held-out run undercounted up to 3 % of a kind's windows
# (contributor lists in Markdown, regexes in Python), every family alike.
HELD_OUT_SAFETY = 1.02
# margin * rates, per family and kind
_VECTORS = {
    family: {kind: tuple(HELD_OUT_SAFETY * margin * rate for rate in rates) for kind, (margin, rates) in kinds.items()}
    for family, kinds in FITTED.items()
}


# What calibration scales (the endpoint's count of a sample over this): one rate per feature, fitted
# on the largest count of the four families, times its margin. The per-kind calibration margins of
# gateway.services.model_endpoint were sized against this shape, so it stays as it was measured.
CALIBRATION_MARGIN = 1.168
CALIBRATION_RATES = (
    1.194,
    1.021,
    1.003,
    0.245,
    0.3,
    0.1,
    1.0,
    0.233,
    0.2,
    0.843,
    0.6,
    1.255,
    0.01,
    0.138,
    0.591,
    1.0,
    1.0,
    2.184,
)


def _widest(kind: str, counts: tuple[int, ...]) -> float:
    """The largest family's estimate: what `auto` counts."""
    return max(sum(map(mul, _VECTORS[family][kind], counts)) for family in FAMILIES)


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
    """Counts per feature (`FEATURES`)."""
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
    """What calibration measures its scale against (`CALIBRATION_RATES`)."""
    return CALIBRATION_MARGIN * sum(map(mul, CALIBRATION_RATES, _counts(text)))


ESTIMATOR = TokenEstimator()


def estimate_tokens(text: str) -> int:
    """Tokens `text` will cost in the host's model, leaning high (the process's estimator)."""
    return ESTIMATOR.estimate(text)


def json_tokens(value: Any) -> int:
    """Tokens of a JSON value as the model reads it (compact JSON, Korean as written). Written by the
    encoder that read it off the wire (`json_wire`), which goes as deep as it read."""
    try:
        text = json_wire.dumps(value).decode()
    except TypeError:  # not a JSON value: its objects as `str` writes them
        text = dumps(value)
    except RecursionError:  # deeper than any encoder goes here: the call itself is refused for it
        return 0
    return estimate_tokens(text)
