"""Text helpers every part shares: the CJK character class, compact JSON, sizes as people read them."""

from __future__ import annotations

import json
import re
from typing import Any

# Hangul Jamo, Kana, Hangul compatibility Jamo, CJK ideographs (and extension A), Hangul syllables,
# CJK compatibility ideographs: one class for token counts and for search.
CJK_CLASS = "\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
CJK_RUN = re.compile(f"[{CJK_CLASS}]+")
_SLICE = 1 << 20


def dumps(value: Any) -> str:
    """Compact JSON that keeps Korean as written (no `\\uXXXX` escapes); anything unknown as str()."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def utf8_size(text: str) -> int:
    """Byte length of `text` as UTF-8, without one big copy."""
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + _SLICE].encode("utf-8", "surrogatepass")) for i in range(0, len(text), _SLICE))


def human_size(n: int) -> str:
    """1.3 MB, 256.0 kB, 725 B: sizes as people read them, in decimal units (1 MB = 1,000,000 bytes, as
    file managers and `ls --si` count)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
