"""A large Markdown document is chunked in parts at once: the chunks must be exactly those of one pass,
wherever a cut could go wrong (code fences, raw HTML, headings in a row, odd line breaks)."""

from __future__ import annotations

import pytest

from gateway.services.search_index import expand
from plugins.documents.chunker import _cut_points, chunk_batches, chunk_document, index_text


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


def test_parts_give_the_chunks_of_one_pass() -> None:
    text = "".join(section(n) for n in range(40))  # each section ends with a (closed) code fence
    cuts = _cut_points(text)
    assert [text[cut:].split("\n", 1)[0] for cut in cuts] == ["# Part 20", "# Part 30"]  # half, then evenly
    got = batches(text)
    assert len(got) == 3 and None not in got  # it really was done in three parts
    assert joined(got) == one_pass(text)
    assert [c.line for c in joined(got)[0]] == sorted(c.line for c in joined(got)[0])


HAZARDS = {
    # a level-1 "heading" inside fenced code: a comment, not a heading
    "fence": "```bash\n\n# not a heading\n\necho hi\n\n# nor this\n```\n\n",
    "tilde fence with backticks inside": "~~~\n```\n\n# inside\n~~~\n\n",
    "raw html": "<pre>\n\n# inside pre\n\n</pre>\n\n",
    "unclosed raw html": "<pre>\n\n# inside pre\n\n",  # the rest of the document is inside it
    "html comment": "<!--\n\n# inside a comment\n\n-->\n\n",
    "headings in a row": "# First\n\n# Second\n\n",
    "unclosed fence": "```\n\n# inside\n\n",
}


@pytest.mark.parametrize("hazard", HAZARDS)
@pytest.mark.parametrize("at", [20, 30])  # where the caller's part ends; where the worker's first part ends
def test_a_cut_is_never_made_where_one_pass_would_differ(hazard: str, at: int) -> None:
    before = "".join(section(n) for n in range(at))
    after = "".join(section(n) for n in range(at, 40))
    text = before + HAZARDS[hazard] + after
    assert joined(batches(text)) == one_pass(text)


def test_odd_line_breaks_are_done_in_one_pass() -> None:
    text = "".join(section(n) for n in range(40)).replace("\n", "\r\n")
    assert _cut_points(text) == []
    assert batches(text) == [one_pass(text)]


def test_the_collector_is_paused_while_parsing_and_restored_after() -> None:
    import gc
    import threading

    from plugins.documents import chunker

    seen: list[bool] = []
    md = chunker._markdown()
    real_parse = md.parse

    def parse(text: str):  # notes the collector's state while markdown-it runs
        seen.append(gc.isenabled())
        return real_parse(text)

    assert gc.isenabled()
    md.parse = parse
    try:
        chunker.markdown_blocks("# A\n\ntext\n")
        assert seen == [False] and gc.isenabled()
        # two pauses at once (two ingests in threads): the collector comes back after the last one
        inner_done = threading.Event()
        with chunker._collector_paused():
            worker = threading.Thread(target=lambda: (chunker.markdown_blocks("# B\n"), inner_done.set()))
            worker.start()
            worker.join()
            assert inner_done.is_set() and not gc.isenabled()
        assert gc.isenabled()
        # a collector someone else turned off stays off
        gc.disable()
        chunker.markdown_blocks("# C\n")
        assert not gc.isenabled()
    finally:
        gc.enable()
        del md.parse


def test_a_lone_surrogate_crosses_to_the_worker_and_back() -> None:
    # an offloaded result's JSON escape can leave one; the parts go through files in UTF-8
    text = "".join(section(n, "odd \ud800 char" if n == 35 else "") for n in range(40))
    got = batches(text)
    assert len(got) == 3 and None not in got
    assert joined(got) == one_pass(text)
    assert any("\ud800" in c.text for c in got[2][0])


def test_the_worker_counts_as_its_caller_and_never_loads_what_the_caller_does_without() -> None:
    """A caller counting with the built-in estimate (`exact_tokens = false`, or its tokenizers not
    loaded): its worker process neither starts loading the real tokenizers at its first long text nor
    counts with them, so a document's parts are counted one way."""
    import subprocess
    import sys

    script = (
        "import threading\n"
        "from plugins.documents.chunker import _ready\n"
        "from gateway.services.tokens import ESTIMATOR\n"
        "_ready('cl100k', False)\n"
        "ESTIMATOR.estimate('word ' * 1000)\n"
        "print(any(t.name == 'tokenizers' for t in threading.enumerate()), ESTIMATOR.exact, ESTIMATOR.family)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "cl100k"]
