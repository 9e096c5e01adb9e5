"""Summaries for compaction: the model endpoint when it answers, a fact-keeping fallback when not.

Sentence scoring (TF-ISF) keeps almost none of the identifiers that notes are full of, so the
fallback ranks whole entries, keeps lines with identifiers, paths, numbers and error codes
verbatim, and ends with the list of every identifier mentioned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.services.text import CJK_RUN
from gateway.services.tokens import estimate_tokens
from plugins.memory.sessions import Entry

INSTRUCTION = (
    "You compress a working session's notes so they can be recalled later. Write a concise summary. "
    "Keep every identifier, file path, command, number, error code, decision and open question exactly "
    "as written. Do not invent anything."
)
# The retry after a summary failed the gate: small models need the rules spelled out.
STRICT_INSTRUCTION = (
    "Summarize the notes below in a few short lines. Rules: use only names, numbers and words that appear in "
    "the notes; copy identifiers, paths and numbers exactly; write each fact once; do not repeat any line; do "
    "not add entry ids or anything the notes do not say; keep it shorter than the notes."
)

_IDENTIFIER = re.compile(
    r"(?:[A-Za-z]:)?(?:[\w.-]*[/\\])+[\w.-]+"  # paths
    r"|\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+(?:\(\))?"  # dotted names: module.func, file.ext
    r"|\b[a-z]+(?:[A-Z][a-z0-9]*)+\b"  # camelCase
    r"|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b"  # PascalCase with 2+ humps
    r"|\b[A-Za-z0-9]+(?:_[A-Za-z0-9]+)+\b"  # snake_case, ERR_CONN_RESET
    r"|\b(?=[\w-]*\d)[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+\b"  # kebab ids with a digit: eu-central-1
    r"|\b[a-z0-9]+(?:-[a-z0-9]+){2,}\b"  # kebab-case-names
    r"|\b[A-Z]{1,5}-?\d{2,}\b"  # error codes: E1234, HTTP-500, PROJ-42
    r"|\b0x[0-9a-fA-F]+\b"
    r"|#\d+\b"
    r"|\b\d+\.\d+\.\d+\b"  # versions
)
_NUMBER = re.compile(r"\d")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def identifiers(text: str) -> list[str]:
    return list(dict.fromkeys(m.group().rstrip(".") for m in _IDENTIFIER.finditer(text)))


def cjk_words(text: str) -> list[str]:
    """Hangul, Kana and Han runs of two or more characters: the words the search index finds."""
    return [w for w in CJK_RUN.findall(text) if len(w) >= 2]


def distinctive_terms(text: str) -> list[str]:
    """What a note must not lose: identifiers, paths, numbers and CJK words."""
    return list(dict.fromkeys([*identifiers(text), *NUMBER.findall(text), *cjk_words(text)]))


def _is_fact(line: str) -> bool:
    return bool(_IDENTIFIER.search(line) or _NUMBER.search(line))


def fallback_summary(entries: Sequence[Entry], target_tokens: int) -> str:
    """Whole entries ranked by their facts and recency; fact lines kept verbatim; the identifiers of the notes
    that did not fit listed."""
    ranked = sorted(
        range(len(entries)),
        key=lambda i: (sum(_is_fact(ln) for ln in entries[i].text.splitlines()), i / max(1, len(entries))),
        reverse=True,
    )
    all_ids: list[str] = []
    for entry in entries:
        all_ids.extend(distinctive_terms(entry.text))
    all_ids = list(dict.fromkeys(all_ids))
    # room for whole fact lines: within the target, and well below what the notes cost (a summary must
    # shrink the session); identifiers of notes left out are listed after them
    budget = min(target_tokens, int(0.7 * sum(e.tokens for e in entries)))
    room = max(40, budget - min(estimate_tokens(", ".join(all_ids)), budget // 3))
    chosen: dict[int, list[str]] = {}
    used = 0
    for i in ranked:
        lines = [ln.strip() for ln in entries[i].text.splitlines() if ln.strip()]
        facts = [ln for ln in lines if _is_fact(ln)] or lines[:1]
        cost = sum(estimate_tokens(ln) + 1 for ln in facts)
        if used + cost > room and chosen:
            continue
        chosen[i] = facts
        used += cost
    body = [f"- {line}" for i in sorted(chosen) for line in chosen[i]]
    kept = "\n".join(body)
    missing = [i for i in all_ids if i not in kept]  # what the notes that did not fit mention
    id_line = ("Also mentioned: " + ", ".join(missing)) if missing else ""
    header = f"Summary of {len(entries)} earlier notes (extractive: the model endpoint was not available)."
    return "\n".join([header, *body, *([id_line] if id_line else [])])
