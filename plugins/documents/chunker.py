"""Chunking that follows the document.

Markdown is parsed with markdown-it-py: headings, paragraphs, lists, tables and fenced code stay
whole; blocks are packed up to the chunk size and every chunk carries its heading path. Only a
block larger than a whole chunk is split: a fence is re-opened and re-closed (with its language)
on every piece, a table repeats its header. Plain text chunks by blank-line paragraphs, source
code by top-level blocks.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import os
import pickle
import re
import threading
from bisect import bisect_left
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.services.search_index import expand
from gateway.services.tokens import ESTIMATOR, EXACT_FROM, estimate_tokens

if TYPE_CHECKING:
    from markdown_it import MarkdownIt

log = logging.getLogger("plugins.documents")

CHUNK_TOKENS = 700
CODE_SUFFIXES = {
    ".py",
    ".js",
    ".ts",
    ".tsx",
    ".jsx",
    ".go",
    ".rs",
    ".java",
    ".kt",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".hpp",
    ".cs",
    ".rb",
    ".php",
    ".swift",
    ".scala",
    ".sh",
    ".bash",
    ".sql",
    ".lua",
    ".r",
    ".m",
}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdx", ".rst", ".txt.md"}
_MD_HINT = re.compile(r"^(#{1,6} |```|~~~|\|.*\|\s*$|[-*] )", re.MULTILINE)
_FENCE_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


@dataclass
class Block:
    text: str
    kind: str  # heading | fence | table | other
    line: int  # first line, 0-based
    level: int = 0  # heading level
    title: str = ""


@dataclass
class Chunk:
    text: str
    heading: str
    line: int
    tokens: int
    part: str = ""


def kind_of(name: str, text: str) -> str:
    lower = name.lower()
    if any(lower.endswith(s) for s in MARKDOWN_SUFFIXES):
        return "markdown"
    if any(lower.endswith(s) for s in CODE_SUFFIXES):
        return "code"
    if len(_MD_HINT.findall(text[:20000])) >= 2:
        return "markdown"
    return "text"


def index_text(chunk: Chunk) -> str:
    """What the search index holds of a chunk: its heading path, then its text."""
    return f"{chunk.heading}\n{chunk.text}"


PARALLEL_ABOVE = 4 * 2**20  # characters; below, one process does it all (a second one takes ~0.4 s to start)
# patterns that start with a literal newline: the regex engine jumps from newline to newline
_LEVEL1 = re.compile(r"\n\n# ")  # a level-1 heading after a blank line (it starts 2 characters in)
_FENCE_LINE = re.compile(r"\n {0,3}(`{3,}|~{3,})([^\n]*)")
ODD_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # line breaks markdown-it and splitlines count apart
# The caller's share: it stores every batch, so the worker gets the rest, in pieces it sends back one by
# one (the caller stores a piece while the worker makes the next, and only the last is left at the end).
FIRST_SHARE = 0.5
WORKER_PIECES = 2


Batch = tuple[list[Chunk], list[str]]  # chunks, in order, and each one's `extra` search column


def chunk_batches(
    text: str, kind: str, size: int = CHUNK_TOKENS, parallel_above: int = PARALLEL_ABOVE
) -> Iterator[Batch | None]:
    """The chunks of a document and each one's `extra` search column (`search_index.expand`), in one
    batch or several: the caller stores each while the next is still being made.

    A Markdown text above `parallel_above` characters is done in parts at once, the later ones in a
    worker process (the work is Python, so a thread would not help): cut at level-1 headings, where
    the chunker starts afresh anyway, and only where the part before is seen to end cleanly (no code
    fence or raw HTML block left open), so the chunks are exactly those of one pass. A `None` means
    "start over": what came before is void and the whole follows in one batch (a part did not start
    or end where it was cut, or the worker failed after a batch went out).
    """
    if len(text) >= EXACT_FROM:
        # one way of counting for the whole document: the real tokenizers now (off the event loop: the
        # caller's store thread), not from whenever their background load ends, mid-document
        ESTIMATOR.load_exact()
    if kind == "markdown" and len(text) > parallel_above and (yield from _in_parts(text, size)):
        return
    chunks = chunk_document(text, kind, size)
    yield chunks, search_columns(chunks)


def search_columns(chunks: list[Chunk]) -> list[str]:
    """Each chunk's `extra` search column, as the index would make it."""
    return [expand(index_text(c)) for c in chunks]


def _cut_points(text: str, first_share: float = FIRST_SHARE, pieces: int = WORKER_PIECES) -> list[int]:
    """Where level-1 headings start, outside every code fence, nearest `first_share` of the text and
    then evenly through the rest; no cut (one pass) when no heading is near the first mark."""
    if any(odd in text for odd in ODD_BREAKS):  # one C-level scan each, far quicker than a regex class
        return []
    fences = [(m.start(), m.group(1), m.group(2)) for m in _FENCE_LINE.finditer("\n" + text)]  # line starts
    open_at: list[tuple[int, int]] = []  # (start, end) of fenced code
    opener: tuple[int, str] | None = None
    for start, marker, rest in fences:
        if opener is None:
            if not (marker[0] == "`" and "`" in rest):  # a backtick fence's info string has no backtick
                opener = (start, marker)
        elif marker[0] == opener[1][0] and len(marker) >= len(opener[1]) and not rest.strip():
            open_at.append((opener[0], start))
            opener = None
    if opener is not None:
        open_at.append((opener[0], len(text)))
    starts = [a for a, _ in open_at]
    headings = []
    for m in _LEVEL1.finditer(text):
        at = m.start() + 2
        inside = bisect_left(starts, at) - 1  # the last fence opened before this line (fences are in order)
        if inside >= 0 and at <= open_at[inside][1]:
            continue
        before = text[text.rfind("\n", 0, at - 2) + 1 : at - 2].strip()
        if before[:1] == "#" or (before and not before.strip("=-")):
            continue  # right after another heading (ATX or setext): one pass would join the two
        headings.append(at)
    n = len(text)
    marks = [first_share + (1 - first_share) * i / pieces for i in range(pieces)]
    cuts: list[int] = []
    for mark in marks:
        target = int(n * mark)
        near = [at for at in headings if abs(at - target) < n // 8 and at > (cuts[-1] if cuts else 0)]
        if not near:
            if not cuts:
                return []  # no heading near the first mark: one pass
            continue
        cuts.append(min(near, key=lambda at: abs(at - target)))
    return cuts


def _closed(block: Block) -> bool:
    """Whether a block ends where it says: a code fence with its closing line (an indented code block
    always ends at a line that is not indented); every other kind does."""
    if block.kind != "fence" or (opening := _FENCE_OPEN.match(block.text.split("\n", 1)[0])) is None:
        return True
    marker = opening.group(2)
    lines = block.text.rstrip("\n").split("\n")
    closing = lines[-1].strip() if len(lines) > 1 else ""
    return closing.startswith(marker[0] * len(marker)) and not closing.strip(marker[0])


def _ends_cleanly(blocks: list[Block]) -> bool:
    """Whether the chunker starts afresh at a level-1 heading after these blocks: only after a block
    that is not a heading, and not inside a fence or a raw HTML block (which a heading does not close)."""
    last = blocks[-1] if blocks else None
    return last is not None and last.kind != "heading" and _closed(last) and not last.text.lstrip().startswith("<")


Part = tuple[list[Chunk], list[str], bool, bool]  # chunks, search column, starts at a level-1 heading, ends cleanly


def _worker_part(path: str, size: int) -> str:
    """A later part, in the worker process: the text is read from `path` and its `Part` pickled to
    `path + ".part"`, whose name is returned. Files, not the pool's pipe: the pipe moves 64 KB a turn,
    and each turn waits for the busy parent's GIL (a second a part, with the worker stalled)."""
    with open(path, encoding="utf-8", errors="surrogatepass", newline="") as f:
        text = f.read()
    blocks = markdown_blocks(text)
    starts = bool(blocks) and (blocks[0].kind, blocks[0].level, blocks[0].line) == ("heading", 1, 0)
    chunks = pack(blocks, size)
    part: Part = (chunks, search_columns(chunks), starts, _ends_cleanly(blocks))
    with open(path + ".part", "wb") as f:
        pickle.dump(part, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path + ".part"


def _ready(family: str, exact: bool) -> None:
    """The worker's first task: it imports this module while the caller looks for the cuts, and counts
    tokens as the caller does (its tokenizer family; the real tokenizers if the caller's are loaded)."""
    ESTIMATOR.configure(family, exact)
    ESTIMATOR.exact = exact  # never the tokenizers if the caller does without them
    if exact:
        ESTIMATOR.load_exact()


def _in_parts(text: str, size: int) -> Generator[Batch | None, None, bool]:
    """`chunk_batches` in parts; False when one pass must follow (after a `None` if a batch went out)."""
    import multiprocessing
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    sent = False
    worker = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    # a private directory (mode 0700) of this ingest's own: only our worker reads and writes in it
    scratch = tempfile.TemporaryDirectory(prefix="ctx-ingest-", ignore_cleanup_errors=True)
    try:
        # the process starts now (~0.5 s), not after the cuts are found
        worker.submit(_ready, ESTIMATOR.family, ESTIMATOR.counting_exactly())
        cuts = _cut_points(text)
        if not cuts:
            return False
        bounds = [*cuts, len(text)]
        # every later part is queued at once: the worker makes them one after another
        parts = []
        for i, (start, end) in enumerate(itertools.pairwise(bounds)):
            source = os.path.join(scratch.name, f"part{i}.md")
            with open(source, "w", encoding="utf-8", errors="surrogatepass", newline="") as f:
                f.write(text[start:end])
            parts.append(worker.submit(_worker_part, source, size))
        blocks = markdown_blocks(text[: cuts[0]])
        if not _ends_cleanly(blocks):
            return False
        chunks = pack(blocks, size)
        sent = True
        yield chunks, search_columns(chunks)
        offset = text.count("\n", 0, cuts[0])
        for (start, end), part in zip(itertools.pairwise(bounds), parts, strict=True):
            with open(part.result(), "rb") as f:
                part_chunks, part_extras, starts, ends = pickle.load(f)
            if not starts or (not ends and end < len(text)):
                yield None
                return False
            for chunk in part_chunks:
                chunk.line += offset
            yield part_chunks, part_extras
            offset += text.count("\n", start, end)
    except (OSError, RuntimeError, pickle.UnpicklingError) as exc:  # no worker process, or no room for its files
        log.warning("ingesting in one process: a worker process could not run (%s)", exc)
        if sent:
            yield None
        return False
    finally:
        # parts not begun are dropped, and a part still being made is not waited for (the caller
        # stopped early, or one pass follows): its process ends when it is done
        worker.shutdown(wait=False, cancel_futures=True)
        scratch.cleanup()
    return True


def chunk_document(text: str, kind: str, size: int = CHUNK_TOKENS) -> list[Chunk]:
    if kind == "markdown":
        blocks = markdown_blocks(text)
    elif kind == "code":
        blocks = code_blocks(text)
    else:
        blocks = paragraph_blocks(text)
    return pack(blocks, size)


# Only block structure is needed: inline parsing (emphasis, links) is skipped, and so is markdown-it's
# table rule (60 % of the parse, a token per cell): a table is one paragraph block to markdown-it, and
# `_is_table` tells it by its delimiter row. Made on first use: loading markdown-it is no part of start-up.
@functools.cache
def _markdown() -> MarkdownIt:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").disable(["inline", "text_join"])


_DELIMITER_ROW = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*")


def _is_table(body: str) -> bool:
    head = body.lstrip("\n").split("\n", 2)
    return len(head) >= 2 and "|" in head[0] and "|" in head[1] and _DELIMITER_ROW.fullmatch(head[1]) is not None


_PAUSES = 0
_PAUSES_LOCK = threading.Lock()
_COLLECTING = True  # whether the collector ran before the first pause began


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while markdown-it parses (process-wide, so counted across
    threads): the parse makes several tracked objects a line, and the collector's full passes over
    them as they pile up were a quarter of the parse. Reference counting frees what the parse leaves;
    anything cyclic waits for the collector's next pass."""
    global _PAUSES, _COLLECTING
    with _PAUSES_LOCK:
        if _PAUSES == 0:
            _COLLECTING = gc.isenabled()
            gc.disable()
        _PAUSES += 1
    try:
        yield
    finally:
        with _PAUSES_LOCK:
            _PAUSES -= 1
            if _PAUSES == 0 and _COLLECTING:
                gc.enable()


def markdown_blocks(text: str) -> list[Block]:
    with _collector_paused():  # the tokens live until the blocks are made
        return _markdown_blocks(text)


def _markdown_blocks(text: str) -> list[Block]:
    lines = text.splitlines(keepends=True)
    starts: list[tuple[int, str, int]] = []
    for token in _markdown().parse(text):
        if token.level == 0 and token.nesting >= 0 and token.map:
            kind = {"heading_open": "heading", "fence": "fence", "code_block": "fence", "table_open": "table"}.get(
                token.type, "other"
            )
            level = int(token.tag[1]) if kind == "heading" else 0
            starts.append((token.map[0], kind, level))
    if not starts or starts[0][0] > 0:
        starts.insert(0, (0, "other", 0))
    blocks = []
    for i, (start, kind, level) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(lines)
        body = "".join(lines[start:end])
        if not body.strip():
            continue
        if kind == "other" and _is_table(body):
            kind = "table"
        title = ""
        if kind == "heading":
            first = body.strip().splitlines()[0]
            title = first.lstrip("#").strip().rstrip("#").strip() if first.startswith("#") else first.strip()
        blocks.append(Block(body, kind, start, level, title))
    return blocks


def paragraph_blocks(text: str) -> list[Block]:
    blocks, current, first = [], [], 0
    for n, line in enumerate(text.splitlines(keepends=True)):
        if not line.strip():
            if current:
                blocks.append(Block("".join(current) + line, "other", first))
                current = []
            continue
        if not current:
            first = n
        current.append(line)
    if current:
        blocks.append(Block("".join(current), "other", first))
    return blocks


def code_blocks(text: str) -> list[Block]:
    """Top-level blocks: a blank line followed by an unindented line starts a new block."""
    blocks, current, first, blank = [], [], 0, False
    for n, line in enumerate(text.splitlines(keepends=True)):
        if current and blank and line.strip() and not line[0].isspace():
            blocks.append(Block("".join(current), "other", first))
            current, first = [], n
        blank = not line.strip()
        current.append(line)
    if current:
        blocks.append(Block("".join(current), "other", first))
    return blocks


def pack(blocks: list[Block], size: int) -> list[Chunk]:
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []
    current: list[Block] = []
    current_heading = ""
    used = 0

    def flush() -> None:
        nonlocal current, used
        if current:
            # the sum of the blocks' estimates: each block is estimated once
            chunks.append(Chunk("".join(b.text for b in current), current_heading, current[0].line, used))
        current, used = [], 0

    for block in blocks:
        if block.kind == "heading":
            while path and path[-1][0] >= block.level:
                path.pop()
            path.append((block.level, block.title))
            if any(b.kind != "heading" for b in current):
                flush()  # every section starts a new chunk (a heading right above it joins it)
            current_heading = " > ".join(t for _, t in path)
        cost = estimate_tokens(block.text)
        if cost > size:
            flush()
            heading = " > ".join(t for _, t in path)
            pieces = split_block(block, size)
            for i, piece in enumerate(pieces, 1):
                chunks.append(Chunk(piece, heading, block.line, estimate_tokens(piece), f"{i}/{len(pieces)}"))
            continue
        if used + cost > size:
            flush()
        if not current and block.kind != "heading":
            current_heading = " > ".join(t for _, t in path)
        current.append(block)
        used += cost
    flush()
    return chunks


def split_block(block: Block, size: int) -> list[str]:
    lines = block.text.splitlines(keepends=True)
    if block.kind == "fence" and lines and (opening := _FENCE_OPEN.match(lines[0].rstrip("\n"))):
        marker = opening.group(2)
        closing_index = len(lines)
        for i in range(len(lines) - 1, 0, -1):
            if lines[i].strip().startswith(marker[0] * 3):
                closing_index = i
                break
        inner = lines[1:closing_index]
        head = lines[0] if lines[0].endswith("\n") else lines[0] + "\n"
        tail = opening.group(1) + marker + "\n"
        room = size - estimate_tokens(head + tail) - 2
        return [head + "".join(group) + tail for group in _group(inner, room)]
    if block.kind == "table" and len(lines) > 2:
        header = "".join(lines[:2])
        room = size - estimate_tokens(header) - 2
        return [header + "".join(group) for group in _group(lines[2:], room)]
    return ["".join(group) for group in _group(lines, size)]


def _group(lines: list[str], room: int) -> list[list[str]]:
    groups: list[list[str]] = []
    current: list[str] = []
    used = 0
    for line in lines:
        cost = estimate_tokens(line)
        while cost > room:  # one enormous line: cut it at whitespace
            cut = _cut_point(line, room)
            if current:
                groups.append(current)
                current, used = [], 0
            groups.append([line[:cut] + ("\n" if not line[:cut].endswith("\n") else "")])
            line = line[cut:]
            cost = estimate_tokens(line)
        if used + cost > room and current:
            groups.append(current)
            current, used = [], 0
        current.append(line)
        used += cost
    if current:
        groups.append(current)
    return groups


def _cut_point(line: str, room: int) -> int:
    cut = max(1, len(line) * room // max(1, estimate_tokens(line)))
    space = line.rfind(" ", cut // 2, cut)
    return space + 1 if space > 0 else cut
