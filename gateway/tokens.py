"""The one token estimate every part uses. It leans high: an undercount overflows the window.

There is no universal tokenizer, so the estimate mimics what BPE tokenizers do: split text
into pre-tokens (letter runs, digit groups, punctuation, whitespace, CJK characters) and
charge each kind its own rate. A calibrated rate from the user's model endpoint (see
`gateway.llm`) scales it when one is known.
"""

from __future__ import annotations

import re
import threading

# Costs per pre-token kind, fitted to lean high against cl100k and Qwen vocabularies.
_PIECES = re.compile(
    r"(?P<cjk>[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)"
    r"|(?P<word>[A-Za-z]+)"
    r"|(?P<num>[0-9]+)"
    r"|(?P<space>\s+)"
    r"|(?P<other>[^\sA-Za-z0-9\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+)"
)

WORD_CHARS_PER_TOKEN = 4.0
CJK_TOKENS_PER_CHAR = 1.0
NUM_DIGITS_PER_TOKEN = 3.0
SAFETY = 1.0

_lock = threading.Lock()
_scale = 1.0  # set by calibration; >= 1 never lowers the estimate below the built-in one


def set_scale(scale: float) -> None:
    global _scale
    with _lock:
        _scale = max(0.5, min(scale, 3.0))


def get_scale() -> float:
    return _scale


def raw_estimate(text: str) -> float:
    total = 0.0
    for match in _PIECES.finditer(text):
        kind = match.lastgroup
        piece = match.group()
        n = len(piece)
        if kind == "word":
            total += 1 + (n - 1) / WORD_CHARS_PER_TOKEN if n > 5 else 1
        elif kind == "cjk":
            total += n * CJK_TOKENS_PER_CHAR
        elif kind == "num":
            total += -(-n // 3)
        elif kind == "space":
            total += 0 if n == 1 and piece == " " else 1
        else:
            total += n
    return total


def estimate_tokens(text: str) -> int:
    """Tokens `text` will cost in the user's model, leaning high."""
    if not text:
        return 0
    return int(raw_estimate(text) * SAFETY * _scale) + 1
