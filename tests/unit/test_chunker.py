"""A large Markdown document is chunked in two halves at once: the chunks must be exactly those of one
pass, wherever the cut could go wrong (code fences, raw HTML, headings in a row, odd line breaks)."""

from __future__ import annotations

import pytest

from gateway.services.search_index import expand
from plugins.documents.chunker import _half_point, _in_two_halves, chunk_document, index_text, indexed_chunks


def section(n: int, body: str = "") -> str:
    words = " ".join(f"word{i} getUserName{i} 세션을{i}" for i in range(40))
    return f"# Part {n}\n\n{words}.\n\n## Detail {n}\n\n{body or words}\n\n```python\nrun({n})\n```\n\n"


def one_pass(text: str) -> tuple[list, list[str]]:
    chunks = chunk_document(text, "markdown", 120)
    return chunks, [expand(index_text(c)) for c in chunks]


def test_two_halves_give_the_chunks_of_one_pass() -> None:
    text = "".join(section(n) for n in range(40))  # each section ends with a (closed) code fence
    cut = _half_point(text)
    assert cut is not None and text[cut:].startswith("# Part 20")
    halves = _in_two_halves(text, cut, 120)
    assert halves is not None  # it really was done in two halves
    assert halves == one_pass(text) == indexed_chunks(text, "markdown", 120, parallel_above=0)
    assert [c.line for c in halves[0]] == sorted(c.line for c in halves[0])


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
    assert indexed_chunks(text, "markdown", 120, parallel_above=0) == one_pass(text)


def test_odd_line_breaks_are_done_in_one_pass() -> None:
    text = "".join(section(n) for n in range(40)).replace("\n", "\r\n")
    assert _half_point(text) is None
    assert indexed_chunks(text, "markdown", 120, parallel_above=0) == one_pass(text)
