"""Summaries for compaction: the model endpoint when it answers, a fact-keeping fallback when not.

Facts are what notes are kept for: identifiers as written (`src/app.ts:42`, `192.168.3.17`, `v3.1.4`,
`TICKET-88`, `0x5be0c1`), numbers, and CJK words. A counter that numbers the notes themselves ("note 5:",
"step 3 -") is not a fact. The fallback keeps fact lines whole, ranks notes by their facts (filler
last) and names what to recall the notes it had no room for by: nothing is dropped, since recall reads
the folded originals too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Sequence

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

# A run of characters an identifier is made of, as written: paths, URLs, addresses, versions, codes,
# `path:line`, `key=value`; it ends on a letter, digit, `_` or `/` (not on the full stop after it)
_RUN = re.compile(
    r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"  # 1,000,000
    r"|(?:\.{1,2}/|[/~#@$])?[A-Za-z0-9_](?:[A-Za-z0-9_./\\:@#%+~=?&-]*[A-Za-z0-9_/])?"
)
_INNER = re.compile(r"[_./\\:@#=%+~]|\d")  # what makes a run more than a word
_HUMPS = re.compile(r"[a-z][A-Z]|[A-Z]{2}[a-z]|[A-Z][a-z]+[A-Z]")  # camelCase, PascalCase, HTTPServer
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
# "note 5:", "Step 3 -", "update 12." at the start of a note: its number only counts the notes
_LABEL = re.compile(r"\s*([^\W\d_]+)\s*#?(\d+)\b")
LABEL_NOTES = 3  # a word that starts this many folded notes before a number is a counter


def _is_identifier(run: str) -> bool:
    if _INNER.search(run) or _HUMPS.search(run):
        return True
    return run.count("-") >= 2  # kebab-case-names; "follow-up" is a word


def identifiers(text: str) -> list[str]:
    """Identifiers and numbers as written, in order, once each (`src/app.ts:42` stays one)."""
    runs = (m.group() for m in _RUN.finditer(text))
    return list(dict.fromkeys(r for r in runs if _is_identifier(r)))


def cjk_words(text: str) -> list[str]:
    """Hangul, Kana and Han runs of two or more characters: the words the search index finds."""
    return [w for w in CJK_RUN.findall(text) if len(w) >= 2]


def distinctive_terms(text: str) -> list[str]:
    """What a note must not lose: identifiers, paths, numbers (as written) and CJK words."""
    return list(dict.fromkeys([*identifiers(text), *cjk_words(text)]))


def counter_labels(entries: Sequence[Entry]) -> set[str]:
    """Words that number the notes ("note" in "note 5: ...", "note 6: ..."): several notes start with one."""
    starts = Counter(m.group(1).lower() for e in entries if (m := _LABEL.match(e.text)))
    return {word for word, n in starts.items() if n >= LABEL_NOTES}


def fact_terms(text: str, labels: Collection[str] = ()) -> list[str]:
    """The facts of a note: its distinctive terms, less the counter that numbers it."""
    terms = distinctive_terms(text)
    label = _LABEL.match(text)
    if label and label.group(1).lower() in labels:
        counter = label.group(2)
        terms = [t for t in terms if t != counter]
    return terms


def fact_lines(entry: Entry, labels: Collection[str], facts: Sequence[str] | None = None) -> list[str]:
    """The lines of a note that hold its facts (`fact_terms`, when already known), whole; its first line
    when it has none."""
    lines = [ln.strip() for ln in entry.text.splitlines() if ln.strip()]
    facts = fact_terms(entry.text, labels) if facts is None else facts
    kept = [ln for ln in lines if any(t in ln for t in facts)]
    return kept or lines[:1]


def _rare_words(entries: Sequence[Entry]) -> list[int]:
    """Per note, how many of its words no other folded note uses (filler repeats itself)."""
    seen = [set(w.lower() for w in _WORD.findall(e.text)) for e in entries]
    counts = Counter(w for words in seen for w in words)
    return [sum(counts[w] == 1 for w in words) for words in seen]


NOT_SHOWN = "Not shown here (context_recall finds each as written): "


def _hook(terms: Sequence[str]) -> str:
    """What to recall a note by: its most specific term (an identifier over a bare number, the longer)."""
    return max(terms, key=lambda t: (any(c.isalpha() for c in t), len(t)))


def not_shown(
    left_out: Sequence[Entry],
    labels: Collection[str],
    room: int | None = None,
    ranked: Sequence[Sequence[str]] | None = None,
) -> str:
    """The line naming the folded notes a summary has no room for: an identifier of each as written (what
    to recall it by) while `room` tokens last, and how many hold no identifiers or numbers. `ranked`: each
    note's `_ranked_terms`, when already known."""
    if not left_out:
        return ""
    if ranked is None:
        ranked = [_ranked_terms(fact_terms(e.text, labels)) for e in left_out]
    hooks = list(dict.fromkeys(_hook(terms) for terms in ranked if terms))
    plain = len(left_out) - len(hooks)

    def line(shown: int) -> str:
        parts = [", ".join(hooks[:shown]) + (f" and {len(hooks) - shown} more" if shown < len(hooks) else "")]
        if plain:
            parts.append(f"{plain} note{'s' if plain > 1 else ''} without identifiers or numbers")
        return NOT_SHOWN + "; ".join(p for p in parts if p)

    if room is None or estimate_tokens(line(len(hooks))) <= room:
        return line(len(hooks))
    # the most hooks that fit: a line's cost grows with the hooks it names, so a binary search finds it
    # in a few estimates (counting down one hook at a time re-estimated the whole line per hook)
    fits, over = 0, len(hooks)
    while over - fits > 1:
        middle = (fits + over) // 2
        if estimate_tokens(line(middle)) <= room:
            fits = middle
        else:
            over = middle
    return line(fits)


def _ranked_terms(facts: Sequence[str]) -> list[str]:
    """The facts that rank a note (of its `fact_terms`): identifiers and numbers (a CJK word alone is no
    identifier)."""
    return [t for t in facts if not CJK_RUN.fullmatch(t)]


def fallback_summary(entries: Sequence[Entry], target_tokens: int, why: str) -> str:
    """Fact lines kept whole, notes ranked by their identifiers and numbers (filler last), within
    `target_tokens` and half of what the notes cost; the notes left out are named by what to recall them by."""
    labels = counter_labels(entries)
    rare = _rare_words(entries)
    terms = [fact_terms(e.text, labels) for e in entries]  # once per note: every step below reads them
    hooks = [_ranked_terms(t) for t in terms]
    facts = [len(h) for h in hooks]
    ranked = sorted(range(len(entries)), key=lambda i: (facts[i], rare[i], i), reverse=True)
    header = f"Summary of {len(entries)} earlier notes, extractive ({why})."
    room = min(target_tokens, sum(e.tokens for e in entries) // 2) - estimate_tokens(header) - 2
    reserve = min(estimate_tokens(not_shown(entries, labels, ranked=hooks)), room // 3)  # for naming what does not fit
    chosen: dict[int, list[str]] = {}
    used = 0
    for i in ranked:
        lines = fact_lines(entries[i], labels, terms[i])
        cost = sum(estimate_tokens(f"- {ln}") + 1 for ln in lines)  # as written, and its line break
        if used + cost <= room - reserve:
            chosen[i] = lines
            used += cost
    body = [f"- {line}" for i in sorted(chosen) for line in chosen[i]]
    left = [i for i in range(len(entries)) if i not in chosen]
    tail = not_shown([entries[i] for i in left], labels, room - used, [hooks[i] for i in left])
    return "\n".join([header, *body, *([tail] if tail else [])])
