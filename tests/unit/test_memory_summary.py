"""Facts as written, counters that are not facts, the fallback's size and the recall order."""

from __future__ import annotations

import time

from gateway.services.tokens import estimate_tokens
from plugins.memory.recall import Query, folded_worth_showing, order
from plugins.memory.sessions import Entry
from plugins.memory.summary import (
    NOT_SHOWN,
    counter_labels,
    fact_terms,
    fallback_summary,
    identifiers,
    not_shown,
)


def _entries(*texts: str, folded_into: str | None = None) -> list[Entry]:
    return [
        Entry(id=f"e{i + 1:05d}", text=t, ts=0, tokens=estimate_tokens(t), superseded_by=folded_into)
        for i, t in enumerate(texts)
    ]


def test_identifiers_stay_whole_as_written() -> None:
    text = "src/app.ts:42 and 192.168.3.17, pin v3.1.4 (0x5be0c1); quota 1,200 a minute at https://a.b/c?d=1."
    assert identifiers(text) == ["src/app.ts:42", "192.168.3.17", "v3.1.4", "0x5be0c1", "1,200", "https://a.b/c?d=1"]
    assert identifiers("a follow-up on the side; 주소가 10.0.3.7로 바뀌었다") == ["10.0.3.7"]


def test_a_counter_that_numbers_the_notes_is_no_fact() -> None:
    notes = _entries(*(f"note {i}: routine progress" for i in range(1, 5)), "port 8080 is taken")
    labels = counter_labels(notes)
    assert labels == {"note"}
    assert fact_terms(notes[0].text, labels) == [] and fact_terms(notes[4].text, labels) == ["8080"]
    assert counter_labels(_entries("note 1: a", "note 2: b")) == set()  # two notes are no numbering yet


def test_the_fallback_keeps_fact_lines_whole_within_half_and_names_the_rest() -> None:
    facts = [f"ticket OPS-{i} is owned by person {i}; see src/mod_{i}.py:{i * 10}" for i in range(8)]
    filler = [f"note {i}: routine progress on the layout, nothing blocking" for i in range(16)]
    notes = _entries(*(x for pair in zip(filler, facts + [""] * 8, strict=True) for x in pair if x))
    summary = fallback_summary(notes, 1000, "the model endpoint was not available")
    lines = summary.splitlines()
    assert lines[0] == "Summary of 24 earlier notes, extractive (the model endpoint was not available)."
    assert estimate_tokens(summary) <= sum(e.tokens for e in notes) / 2
    body = [ln[2:] for ln in lines if ln.startswith("- ")]
    assert body and all(ln in facts for ln in body)  # whole fact lines, no filler
    assert lines[-1].startswith(NOT_SHOWN) and "16 notes without identifiers or numbers" in lines[-1]
    left = [f for f in facts if f not in body]
    assert left and all(f.split("see ")[1] in lines[-1] for f in left)  # what to recall each by, whole


def test_the_fallback_of_ten_thousand_notes_takes_well_under_a_second() -> None:
    """The line naming what did not fit was re-estimated whole once per name dropped from it: 10,000
    notes took 48 s (on the event loop, in a compaction), 3,000 took 5 s."""
    notes = _entries(*(f"step {i}: checked host-{i}.internal port {8000 + i}" for i in range(10_000)))
    started = time.monotonic()
    summary = fallback_summary(notes, 1000, "the model endpoint was not available")
    assert time.monotonic() - started < 5  # about 0.6 s here; the quadratic count took 48 s
    assert estimate_tokens(summary) <= 1000 + 10
    tail = summary.splitlines()[-1]
    assert tail.startswith(NOT_SHOWN) and tail.endswith(" more") and "host-9999.internal" not in tail


def test_the_names_of_what_did_not_fit_are_as_many_as_the_room_takes() -> None:
    """As many names as fit in `room`: the same line as counting down one name at a time."""
    notes = _entries(*(f"ticket OPS-{i} sits in src/mod_{i}.py:{i * 10}" for i in range(300)), "no facts here")
    labels = counter_labels(notes)

    every = not_shown(notes, labels).split("; ")[0][len(NOT_SHOWN) :].split(", ")
    assert len(every) == 300

    def counted_down(room: int) -> str:
        for shown in range(300, -1, -1):
            text = NOT_SHOWN + ", ".join(every[:shown]) + (f" and {300 - shown} more" if shown < 300 else "")
            text += "; 1 note without identifiers or numbers"
            if estimate_tokens(text) <= room or shown == 0:
                return text
        raise AssertionError

    for room in (5, 20, 50, 137, 400, 1000, 5000):
        assert not_shown(notes, labels, room) == counted_down(room), room


def test_recall_prefers_the_original_line_over_fragments() -> None:
    summary = _entries("Also mentioned: src/app.ts, 42, TICKET-88, 88")[0]
    original = _entries("src/app.ts:42 assumes the cookie is set", folded_into="s00001")[0]
    query = Query.of("src/app.ts:42")
    assert query.exact == ("src/app.ts:42",)
    assert folded_worth_showing(query, [summary], [original]) == [original]
    assert order(query, [summary, original]) == [original, summary]
    kept_whole = _entries("- src/app.ts:42 assumes the cookie is set")[0]
    assert folded_worth_showing(query, [kept_whole], [original]) == []  # the summary has the line itself


def test_a_summarys_pointer_line_is_not_a_match() -> None:
    pointer = _entries(f"Summary of 3 notes.\n{NOT_SHOWN}TICKET-88; 2 notes without identifiers or numbers")[0]
    original = _entries("TICKET-88 is owned by Dana", folded_into="s00001")[0]
    assert order(Query.of("TICKET-88"), [pointer, original]) == [original, pointer]


def test_words_spread_over_a_summary_lose_to_one_line_that_holds_them() -> None:
    summary = _entries("owner: several people\nthe billing ticket moved")[0]
    original = _entries("the billing ticket owner is Dana", folded_into="s00001")[0]
    assert folded_worth_showing(Query.of("billing ticket owner"), [summary], [original]) == [original]
