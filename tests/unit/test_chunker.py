"""A large Markdown document is chunked in two parts at once: the chunks must be exactly those of one
pass, wherever the cut could go wrong (code fences, raw HTML, headings in a row, odd line breaks)."""

from __future__ import annotations

import pytest

from gateway.services.search_index import expand
from plugins.documents.chunker import _cut_point_for_two, chunk_batches, chunk_document, index_text


def section(n: int, body: str = "") -> str:
    words = " ".join(f"word{i} getUserName{i} 세션을{i}" for i in range(40))
    return f"# Part {n}\n\n{words}.\n\n## Detail {n}\n\n{body or words}\n\n```python\nrun({n})\n```\n\n"


def one_pass(text: str) -> tuple[list, list[str]]:
    chunks = chunk_document(text, "markdown", 120)
    return chunks, [expand(index_text(c)) for c in chunks]


def batches(text: str) -> list:
    return list(chunk_batches(text, "markdown", 120, parallel_above=0))


def joined(batches: list) -> tuple[list, list[str]]:
    """What a store keeps of the batches: everything after the last "start over"."""
    chunks: list = []
    extras: list[str] = []
    for batch in batches:
        chunks, extras = ([], []) if batch is None else (chunks + batch[0], extras + batch[1])
    return chunks, extras


def test_two_parts_give_the_chunks_of_one_pass() -> None:
    text = "".join(section(n) for n in range(40))  # each section ends with a (closed) code fence
    cut = _cut_point_for_two(text)
    assert cut is not None and text[cut:].startswith("# Part 19")  # a little before the middle
    got = batches(text)
    assert len(got) == 2 and None not in got  # it really was done in two parts
    assert joined(got) == one_pass(text)
    assert [c.line for c in joined(got)[0]] == sorted(c.line for c in joined(got)[0])


def _middle(text_before: str, hazard: str, text_after: str) -> str:
    return text_before + hazard + text_after


HAZARDS = {
    # a level-1 "heading" inside fenced code: a comment, not a heading
    "fence": "```bash\n\n# not a heading\n\necho hi\n\n# nor this\n```\n\n",
    "tilde fence with backticks inside": "~~~\n```\n\n# inside\n~~~\n\n",
    "raw html": "<pre>\n\n# inside pre\n\n</pre>\n\n",
    "html comment": "<!--\n\n# inside a comment\n\n-->\n\n",
    "headings in a row": "# First\n\n# Second\n\n",
    "unclosed fence": "```\n\n# inside\n\n",
}


@pytest.mark.parametrize("hazard", HAZARDS)
def test_a_cut_is_never_made_where_one_pass_would_differ(hazard: str) -> None:
    before = "".join(section(n) for n in range(20))
    after = "".join(section(n) for n in range(20, 40))
    text = _middle(before, HAZARDS[hazard], after)
    assert joined(batches(text)) == one_pass(text)


def test_odd_line_breaks_are_done_in_one_pass() -> None:
    text = "".join(section(n) for n in range(40)).replace("\n", "\r\n")
    assert _cut_point_for_two(text) is None
    assert batches(text) == [one_pass(text)]
