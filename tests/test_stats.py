"""Usage figures: what a known sequence of calls records, the `stats` command, context_status's line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import call, inproc, make_settings, ok, probe, run_cli, write_config

from gateway.services.costs import result_cost
from gateway.services.stats import summary

pytestmark = pytest.mark.anyio


async def test_a_known_sequence_of_calls_is_counted(tmp_path: Path) -> None:
    servers = {"p": probe("p"), "whole": probe("whole", offload="never"), "cat": probe("cat", tool_mode="catalog")}
    settings = make_settings(tmp_path, servers, plugins=["offload", "memory"], max_response_size=100_000)
    big = {"size": 400_000, "kind": "text"}
    async with inproc(settings) as (gateway, session):
        await session.list_tools()
        inline = await call(session, "whole__big", big)  # the same result, never offloaded: its full cost
        offloaded = await call(session, "p__big", big)
        assert "fileRef" in offloaded.content[0].text
        await call(session, "p__echo", {"text": "hi"})
        await call(session, "p__fail")
        await call(session, "tool_call", {"name": "cat__whoami", "arguments": {}})
        status = await ok(session, "context_status", {"session_id": "s1"})
        gateway.stats.flush()

    figures = summary(settings.gateway.workspace / "stats.db")
    rows = {(r["server"], r["tool"], r["via"]): r for r in figures["rows"]}
    saved = result_cost(inline).tokens - result_cost(offloaded).tokens
    assert saved > 90_000  # 400 kB of log lines
    assert rows[("p", "big", "direct")]["tokens_saved"] == saved
    assert rows[("p", "big", "direct")]["saved_by"] == {"offload": saved}
    assert rows[("p", "big", "direct")]["tokens_returned"] == result_cost(offloaded).tokens
    assert rows[("p", "big", "direct")]["result_bytes"] == 400_000
    assert rows[("whole", "big", "direct")]["tokens_saved"] == 0
    assert rows[("p", "fail", "direct")]["errors"] == 1
    assert rows[("cat", "whoami", "catalog")]["calls"] == 1  # through tool_call, counted as the upstream tool
    listing = rows[("gateway", "tools/list", "list")]  # labelled as /metrics does; its calls are the listings
    assert listing["saved_by"].keys() == {"catalog"} and listing["tokens_saved"] > 0 and listing["calls"] >= 1
    assert figures["totals"]["all"]["calls"] == 6 and figures["totals"]["day"]["errors"] == 1
    # the model's own line: this session's calls before it (context_status is the sixth call)
    line = status["gateway"]["usage"]
    assert line.startswith("5 calls") and f"~{saved + listing['tokens_saved']:,} kept out of the window" in line


def test_stats_command_prints_the_figures(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    empty = run_cli("stats", "--config", str(cfg))
    assert empty.returncode == 0 and "no calls recorded" in empty.stdout
    from gateway.services.stats import Row, Stats

    stats = Stats(tmp_path / "ws")
    stats.record(Row("s", "fs", "read_file", "direct", False, 1_300_000, 700, 340_000, "offload", 12.5))
    stats.record(Row("s", "fs", "read_file", "direct", True, 10, 5, 0, "", 3.0))
    stats.flush()
    out = run_cli("stats", "--config", str(cfg), "--period", "week")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("fs "))
    assert row.split()[:5] == ["fs", "read_file", "direct", "2", "1"] and "340,000" in row and "offload" in row
    as_json = json.loads(run_cli("stats", "--config", str(cfg), "--json").stdout)
    assert as_json["totals"]["all"] == {"calls": 2, "errors": 1, "tokens_returned": 705, "tokens_saved": 340_000}
    # the figures say which tokenizer they are counted for, and how to name the host's
    assert "for the widest common tokenizer" in out.stdout and "[gateway] tokenizer" in out.stdout
    assert as_json["tokenizer"] == "auto"
    named = run_cli("stats", "--config", str(cfg), CTX_TOKENIZER="cl100k")
    assert "for the cl100k (GPT-4) tokenizer" in named.stdout and "widest" not in named.stdout
    flag = run_cli("stats", "--config", str(cfg), "--tokenizer", "llama3")
    assert flag.returncode == 0 and "for the Llama 3 tokenizer" in flag.stdout
