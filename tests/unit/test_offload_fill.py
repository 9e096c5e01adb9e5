"""Answers cut to a token budget use most of it, by the largest count of four real tokenizers, and never
more: on real files (tests/fixtures/real), at a small and a usual budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import token_corpus

from gateway.args import Args
from gateway.services.responses import ResponseStore
from plugins.offload.explore import Explorer

REAL = Path(__file__).parent.parent / "fixtures" / "real"
# (what, tool, file, kind, arguments, the lowest fill): counted with the real tokenizers (`auto`: 1.09x
# the larger of cl100k's and Qwen's), an answer fills 0.85-0.96 of its budget; a wildcard over a map is
# cut at whole shapes of an API model's documentation, some of them large (0.79 at 4,000 tokens)
CASES = [
    ("lines of a CRLF csv", "slice", "birdstrikes-head.csv", "text", {"start_line": 1, "end_line": 1500}, 0.84),
    ("lines of a log", "slice", "dpkg-head.log", "text", {"start_line": 1, "end_line": 1200}, 0.84),
    ("a wildcard over a map", "slice", "sts-service-2.json", "json", {"json_path": "$.shapes[*]"}, 0.75),
    ("a large value", "slice", "package-lock.json", "json", {"json_path": "packages"}, 0.84),
    ("rows of a query", "query", "birdstrikes-head.csv", "text", {"sql": "SELECT * FROM items"}, 0.84),
]


@pytest.fixture(scope="module")
def largest() -> Any:
    encoders = token_corpus.tokenizers().values()
    return lambda text: max(len(e.encode(text)) for e in encoders)


@pytest.mark.parametrize("budget", [1000, 4000])
@pytest.mark.parametrize(("what", "tool", "name", "kind", "args", "lowest"), CASES, ids=[c[0] for c in CASES])
def test_a_cut_answer_fills_its_budget(
    tmp_path: Path, largest: Any, budget: int, what: str, tool: str, name: str, kind: str, args: dict, lowest: float
) -> None:
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", (REAL / name).read_bytes().decode(), kind)
    answer = getattr(Explorer(store), tool)(Args({"path": saved.id, **args}, "t"), budget)
    text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))  # as the reply is written
    assert any(k in answer for k in ("note", "next")) or "more items" in text, f"{what}: not cut at {budget}"
    fill = largest(text) / budget
    assert lowest <= fill <= 1.0, f"{what}: {fill:.2f} of {budget} tokens"
