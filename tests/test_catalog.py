"""Catalog mode against a fleet of real servers (npm and PyPI, 50 tools)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest
import token_corpus
from conftest import call, inproc, make_settings, probe, run_cli, text_of, write_config
from fleet import fleet

pytestmark = pytest.mark.anyio
ALL_PLUGINS = ["offload", "memory", "documents", "monitor"]
GOLDEN = [
    ("read a file", {"fs__read_text_file", "fs__read_file"}),
    ("current time in Seoul", {"time__get_current_time"}),
    ("staged changes", {"git__git_diff_staged"}),
    ("add two numbers", {"everything__get-sum"}),
    ("create a directory", {"fs__create_directory"}),
    ("convert time between timezones", {"time__convert_time"}),
    ("commit changes to the repository", {"git__git_commit"}),
    ("search nodes in the knowledge graph", {"memory__search_nodes"}),
    ("list files in a directory", {"fs__list_directory", "fs__list_directory_with_sizes"}),
    ("echo a message back", {"everything__echo"}),
]


def first_text(result: types.CallToolResult) -> str:
    """The upstream's own text (the monitor may append a note block after it)."""
    return result.content[0].text


def cl100k_definitions(tools: list[types.Tool]) -> int:
    enc = token_corpus.tokenizers()["cl100k"]
    return sum(len(enc.encode(t.model_dump_json(by_alias=True, exclude_none=True))) for t in tools)


async def test_catalog_mode_with_a_real_fleet(tmp_path: Path) -> None:
    servers = fleet(tmp_path)
    async with inproc(make_settings(tmp_path, servers, plugins=ALL_PLUGINS)) as (gateway, direct):
        direct_tools = (await direct.list_tools()).tools
        assert len(gateway.routing.tools) >= 40, sorted(gateway.routing.tools)
        direct_cost = cl100k_definitions(direct_tools)
        expected = {
            "convert": json.loads(
                first_text(
                    await call(
                        direct,
                        "time__convert_time",
                        {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Seoul"},
                    )
                )
            ),
            "sum": first_text(await call(direct, "everything__get-sum", {"a": 3, "b": 4})),
        }
    settings = make_settings(tmp_path, servers, plugins=ALL_PLUGINS, tool_mode="catalog", max_response_size=65536)
    async with inproc(settings) as (gateway, s):
        listed = (await s.list_tools()).tools
        names = {t.name for t in listed}
        assert {"tool_search", "tool_schema", "tool_call"} <= names and not any("__" in n for n in names)
        cost = cl100k_definitions(listed)
        assert cost < 1500, f"catalog mode lists {cost} tokens of definitions"
        assert direct_cost > 4 * cost

        hits = 0
        for query, wanted in GOLDEN:
            found = (await call(s, "tool_search", {"query": query, "limit": 3})).structured_content["tools"]
            hits += bool(wanted & {t["name"] for t in found})
        assert hits == len(GOLDEN), f"{hits}/{len(GOLDEN)} golden queries found their tool in the top 3"
        only_git = (await call(s, "tool_search", {"query": "status", "server": "git"})).structured_content["tools"]
        assert only_git and all(t["server"] == "git" for t in only_git)

        schema = (await call(s, "tool_schema", {"name": "time__convert_time"})).structured_content
        assert set(schema["inputSchema"]["required"]) == {"source_timezone", "time", "target_timezone"}
        via = await call(
            s,
            "tool_call",
            {
                "name": "time__convert_time",
                "arguments": {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Seoul"},
            },
        )
        assert json.loads(first_text(via)) == expected["convert"]
        got = await call(s, "tool_call", {"name": "everything__get-sum", "arguments": {"a": 3, "b": 4}})
        assert first_text(got) == expected["sum"]

        wrong = await call(s, "tool_call", {"name": "time__convert_time", "arguments": {"time": 12}})
        message = text_of(wrong)
        assert wrong.is_error and "source_timezone" in message and "Expected input schema" in message
        assert '"required"' in message
        unknown = await call(s, "tool_call", {"name": "fs__teleport", "arguments": {}})
        assert unknown.is_error and "tool_search" in text_of(unknown)

        big = tmp_path / "files" / "big.log"
        big.write_text("\n".join(f"2026-11-30 INFO line {i} of a long log" for i in range(20000)))
        offloaded = await call(s, "tool_call", {"name": "fs__read_text_file", "arguments": {"path": str(big)}})
        ref = json.loads(first_text(offloaded))["fileRef"]
        assert Path(ref["path"]).name.startswith("fs__read_text_file-")
        assert Path(ref["path"]).read_text() == big.read_text()


async def test_catalog_follows_list_changed_and_restarts(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, {"p": probe("p"), "pinned": probe("pinned", pin=True)}, plugins=[], tool_mode="catalog"
    )
    async with inproc(settings) as (gateway, s):
        names = {t.name for t in (await s.list_tools()).tools}
        assert "pinned__echo" in names and "p__echo" not in names and "tool_search" in names

        async def search(query: str) -> list[str]:
            result = await call(s, "tool_search", {"query": query, "limit": 5})
            return [t["name"] for t in result.structured_content["tools"]]

        assert "p__grown" not in await search("appeared later")
        await call(s, "tool_call", {"name": "p__grow"})
        with anyio.fail_after(10):
            while "p__grown" not in await search("appeared later"):
                await anyio.sleep(0.1)
        assert text_of(await call(s, "tool_call", {"name": "p__grown"})) == "grown"
        # a restart brings the server back without the added tool: the catalog never offers it again
        await call(s, "tool_call", {"name": "p__crash"})
        with anyio.fail_after(20):
            while gateway.upstreams["p"].restarts < 1 or gateway.upstreams["p"].state != "ok":
                await anyio.sleep(0.1)
        assert "p__grown" not in await search("appeared later")
        gone = await call(s, "tool_call", {"name": "p__grown"})
        assert gone.is_error


async def test_auto_mode_decides_by_the_window(tmp_path: Path) -> None:
    servers = {"big": probe("big", "--extra-tools", "60")}
    async with inproc(make_settings(tmp_path, servers, plugins=[], tool_mode="auto", context_window=8000)) as (g, s):
        names = {t.name for t in (await s.list_tools()).tools}
        assert names == {"tool_search", "tool_schema", "tool_call"}
        assert g.catalog_mode.decide()[0] == "catalog"
    async with inproc(make_settings(tmp_path, servers, plugins=[], tool_mode="auto", context_window=1_000_000)) as (
        g,
        s,
    ):
        names = {t.name for t in (await s.list_tools()).tools}
        assert "big__extra_59" in names and "tool_search" not in names
    cfg = write_config(tmp_path, servers, plugins=[], tool_mode="auto", context_window=8000)
    out = run_cli("inspect", "--config", str(cfg))
    assert "(tool mode catalog: auto:" in out.stdout and "in direct mode it would receive 75 tools" in out.stdout


async def test_per_server_override_in_direct_mode(tmp_path: Path) -> None:
    servers = {"noisy": probe("noisy", "--extra-tools", "20", tool_mode="catalog"), "daily": probe("daily")}
    async with inproc(make_settings(tmp_path, servers, plugins=[])) as (_, s):
        names = {t.name for t in (await s.list_tools()).tools}
        assert "daily__echo" in names and not any(n.startswith("noisy__") for n in names)
        assert {"tool_search", "tool_schema", "tool_call"} <= names
        found = (await call(s, "tool_search", {"query": "extra tool number", "server": "noisy"})).structured_content
        assert found["tools"] and all(t["server"] == "noisy" for t in found["tools"])
        assert text_of(await call(s, "tool_call", {"name": "noisy__whoami"})) == "noisy"
