"""Which notes answer a recall query, in which order: the active notes the index found, and the folded
originals whenever they say more than what is active.

Identifiers in a query are matched as written (`src/app.ts:42`, `192.168.3.17`), case aside: a note that
holds one whole comes before one that only shares its pieces. A folded original is brought back when
it holds a query identifier in a line no active note repeats verbatim (a summary kept fragments, or
left the note out), when it holds query words no active note has, or when one of its lines holds more
of the query than any active line does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.services.search_index import query_terms
from plugins.memory.sessions import Entry
from plugins.memory.summary import NOT_SHOWN, identifiers


def _content(text: str) -> str:
    """A note without a summary's line naming what it left out (a pointer, not what the notes said)."""
    return "\n".join(ln for ln in text.lower().splitlines() if not ln.startswith(_POINTER))


_POINTER = NOT_SHOWN.lower()


@dataclass(frozen=True)
class Query:
    exact: tuple[str, ...]  # identifiers as written, lower-cased
    words: tuple[str, ...]  # the index's terms: words, identifier parts, CJK bigrams

    @classmethod
    def of(cls, text: str) -> Query:
        return cls(tuple(i.lower() for i in identifiers(text)), tuple(t.lower() for t in query_terms(text)))

    def __bool__(self) -> bool:
        return bool(self.exact or self.words)

    def exact_in(self, text: str) -> int:
        content = _content(text)
        return sum(t in content for t in self.exact)

    def cover(self, text: str) -> int:
        """The most query words one line of the text holds (a fact is a line, not a bag of fragments)."""
        return max((sum(w in line for w in self.words) for line in _content(text).splitlines()), default=0)

    def matches(self, text: str) -> bool:
        lowered = text.lower()
        return any(t in lowered for t in self.exact + self.words)


def _lines_with(text: str, query: Query) -> list[str]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return [ln for ln in lines if query.exact_in(ln) or query.cover(ln)] or lines


def folded_worth_showing(query: Query, active: Sequence[Entry], folded: Sequence[Entry]) -> list[Entry]:
    """The folded originals that say more about the query than the active notes do."""
    shown = "\n".join(e.text for e in active)
    shown_lower = shown.lower()
    best_cover = max((query.cover(e.text) for e in active), default=0)
    missing = [w for w in query.words if w not in shown_lower]
    out = []
    for entry in folded:
        exact, cover = query.exact_in(entry.text), query.cover(entry.text)
        if not (exact or cover):
            continue
        repeated = all(line in shown for line in _lines_with(entry.text, query))
        if repeated:
            continue  # a summary kept its lines whole: nothing more to show
        lowered = entry.text.lower()
        if exact or cover > best_cover or any(w in lowered for w in missing):
            out.append(entry)
    return out


def order(query: Query, entries: Sequence[Entry]) -> list[Entry]:
    """Identifiers as written first, then the notes whose one line holds most of the query; otherwise
    the order given (the index's rank)."""
    if not query:
        return list(entries)
    position = {e.id: i for i, e in enumerate(entries)}
    return sorted(entries, key=lambda e: (-query.exact_in(e.text), -query.cover(e.text), position[e.id]))
