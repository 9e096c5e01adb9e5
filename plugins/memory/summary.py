"""Summaries for compaction: the model endpoint when it answers, a fact-keeping fallback when not.

Sentence scoring (TF-ISF) keeps almost none of the identifiers that notes are full of, so the
fallback ranks whole entries, keeps lines with identifiers, paths, numbers and error codes
verbatim, and ends with the list of every identifier mentioned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.services.tokens import estimate_tokens
from plugins.memory.sessions import Entry

INSTRUCTION = (
    "You compress a working session's notes so they can be recalled later. Write a concise summary. "
    "Keep every identifier, file path, command, number, error code, decision and open question exactly "
    "as written. Do not invent anything."
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


def identifiers(text: str) -> list[str]:
    return list(dict.fromkeys(m.group().rstrip(".") for m in _IDENTIFIER.finditer(text)))


def _is_fact(line: str) -> bool:
    return bool(_IDENTIFIER.search(line) or _NUMBER.search(line))


def fallback_summary(entries: Sequence[Entry], target_tokens: int) -> str:
    """Whole entries ranked by their facts and recency; fact lines kept verbatim; identifiers listed."""
    ranked = sorted(
        range(len(entries)),
        key=lambda i: (sum(_is_fact(ln) for ln in entries[i].text.splitlines()), i / max(1, len(entries))),
        reverse=True,
    )
    all_ids: list[str] = []
    for entry in entries:
        all_ids.extend(identifiers(entry.text))
    all_ids = list(dict.fromkeys(all_ids))
    id_line = ("Identifiers mentioned: " + ", ".join(all_ids)) if all_ids else ""
    room = max(40, target_tokens - estimate_tokens(id_line))
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
    header = f"Summary of {len(entries)} earlier notes (extractive: the model endpoint was not available)."
    return "\n".join([header, *body, *([id_line] if id_line else [])])


def with_identifiers(summary: str, entries: Sequence[Entry]) -> str:
    """A model-written summary plus any identifier it dropped, so recall still finds them."""
    missing = [i for e in entries for i in identifiers(e.text) if i not in summary]
    missing = list(dict.fromkeys(missing))
    return summary + ("\nAlso mentioned: " + ", ".join(missing) if missing else "")
