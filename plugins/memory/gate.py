"""The gate every model-written summary passes before it is kept: a summary is data stored on the user's
behalf, so it is treated like untrusted input. Each rule is cheap and deterministic.

- It is shorter than the notes it replaces, and not far above `target_tokens`.
- It does not loop (repeated lines, or repeated runs of words).
- It invents nothing: every identifier, number and entry id in it appears in the folded notes.
- Chat-template debris (`<|im_end|>`, `<end_of_turn>`, role headers) is stripped first.

Coverage is then completed, not judged: a folded note whose facts (identifiers, numbers, paths as
written, and CJK words by the search index's own segmentation) are missing from the summary has its
fact lines appended verbatim while they fit; the notes that do not are named, and recall finds them in
the folded originals.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.services.tokens import estimate_tokens
from plugins.memory.sessions import Entry
from plugins.memory.summary import NUMBER, counter_labels, fact_lines, fact_terms, identifiers, not_shown

_DEBRIS = re.compile(
    r"<\|[a-z_]+\|>|</?(?:start|end)_of_turn>|<\|?(?:im_start|im_end|eot_id|endoftext)\|?>|</?s>"
    r"|^\s*(?:<\|?start_header_id\|?>)?\s*(?:assistant|user|system|model)\s*(?:<\|?end_header_id\|?>)?\s*:?\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_ENTRY_ID = re.compile(r"\b[es]\d{5,}\b")
_WORDS = re.compile(r"\w+", re.UNICODE)
MAX_TARGET_RATIO = 2.0  # a summary may run over target_tokens, but not to twice it
LOOP_LINE_SHARE = 0.2  # lines that repeat an earlier line
LOOP_NGRAM_SHARE = 0.3  # runs of 4 words seen before


@dataclass(frozen=True)
class Verdict:
    summary: str  # cleaned
    failed: str = ""  # the rule that failed, empty when it passed


def strip_debris(summary: str) -> str:
    cleaned = _DEBRIS.sub("", summary)
    return re.sub(r"\n{3,}", "\n\n", cleaned).strip()


def _loops(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 4:
        repeated = len(lines) - len(set(lines))
        if repeated / len(lines) > LOOP_LINE_SHARE:
            return f"it repeats itself: {repeated} of {len(lines)} lines are copies of earlier lines"
    words = _WORDS.findall(text.lower())
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    if len(grams) >= 12:
        seen = Counter(grams)
        repeated = sum(c - 1 for c in seen.values() if c > 1)
        if repeated / len(grams) > LOOP_NGRAM_SHARE:
            return f"it loops: {repeated} of {len(grams)} runs of four words repeat"
    return ""


def _invented(summary: str, source: str, folded: int) -> list[str]:
    known_ids = set(identifiers(source))
    invented = [i for i in identifiers(summary) if i not in known_ids and i not in source]
    numbers = set(NUMBER.findall(source)) | {str(folded)}
    invented += [n for n in NUMBER.findall(summary) if n not in numbers and n not in source]
    invented += [e for e in _ENTRY_ID.findall(summary) if e not in source]
    return list(dict.fromkeys(invented))


def check(summary: str, folded: Sequence[Entry], target_tokens: int) -> Verdict:
    """The cleaned summary and the first rule it fails (or none)."""
    text = strip_debris(summary)
    if not text:
        return Verdict(text, "it is empty once chat-template debris is removed")
    size, replaced = estimate_tokens(text), sum(e.tokens for e in folded)
    if size >= replaced:
        return Verdict(text, f"it is not shorter than the notes it replaces ({size} vs {replaced} tokens)")
    if size > MAX_TARGET_RATIO * target_tokens:
        return Verdict(text, f"it is far longer than target_tokens ({size} vs {target_tokens})")
    if loop := _loops(text):
        return Verdict(text, loop)
    source = "\n".join(f"[{e.id}] {e.text}" for e in folded)
    if invented := _invented(text, source, len(folded)):
        return Verdict(text, f"it states what no folded note says: {', '.join(invented[:5])}")
    return Verdict(text)


def with_coverage(summary: str, folded: Sequence[Entry], room: int) -> str:
    """The summary plus, verbatim, the fact lines of notes whose facts it dropped, within `room` tokens in
    all; the notes that do not fit are named (recall finds them in the folded originals)."""
    labels = counter_labels(folded)
    kept: list[str] = []
    left_out: list[Entry] = []
    used = estimate_tokens(summary) + 4
    for entry in folded:
        facts = fact_terms(entry.text, labels)
        if all(t in summary for t in facts):
            continue
        lines = [f"- [{entry.id}] {ln}" for ln in fact_lines(entry, labels, facts) if ln not in summary]
        cost = sum(estimate_tokens(ln) + 1 for ln in lines)
        if used + cost > room:
            left_out.append(entry)
            continue
        kept.extend(lines)
        used += cost
    out = summary + ("\nKept verbatim:\n" + "\n".join(dict.fromkeys(kept)) if kept else "")
    return out + ("\n" + not_shown(left_out, labels) if left_out else "")
