"""gateway.pipeline: hooks run in order, one failing plugin never takes the others (or a call) down."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from pydantic import BaseModel

from gateway.pipeline import Pipeline, PluginError, configure, load_plugins
from gateway.plugin import Plugin, ToolCall
from gateway.results import result_text

pytestmark = pytest.mark.anyio


class Tag(Plugin):
    def __init__(self, name: str, fail: str = "") -> None:
        self.name, self.fail = name, fail
        self.stopped = False

    async def start(self, ctx: Any) -> None:
        if self.fail == "start":
            raise RuntimeError("no")

    async def stop(self) -> None:
        self.stopped = True

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        if self.fail == "hook":
            raise ValueError("hook broke")
        return types.CallToolResult(content=[types.TextContent(text=result_text(result) + self.name)])

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        if self.fail == "hook":
            raise ValueError("hook broke")
        return [*tools, types.Tool(name=self.name, input_schema={"type": "object"})]


async def test_hooks_run_in_order_and_a_failing_hook_is_skipped() -> None:
    pipeline = Pipeline([Tag("a"), Tag("bad", fail="hook"), Tag("b")])
    result = await pipeline.on_tool_result(
        ToolCall("t", {}), types.CallToolResult(content=[types.TextContent(text="")])
    )
    assert result_text(result) == "ab"
    tools = await pipeline.on_tools_listed([], "s")
    assert [t.name for t in tools] == ["a", "b"]


async def test_a_plugin_whose_start_fails_is_left_out() -> None:
    good, bad = Tag("good"), Tag("bad", fail="start")
    pipeline = Pipeline([good, bad])
    await pipeline.start(None)  # type: ignore[arg-type]
    assert pipeline.plugins == [good] and "RuntimeError: no" in pipeline.failed["bad"]
    await pipeline.stop()
    assert good.stopped and not bad.stopped


def test_builtins_are_ordered_by_their_order_and_can_be_disabled() -> None:
    names = [p.name for p in load_plugins(None, disabled=["documents"])]
    assert names[:3] == ["offload", "memory", "monitor"] or names.index("offload") < names.index("monitor")
    assert "documents" not in names
    assert [p.name for p in load_plugins(["monitor", "offload"])] == ["monitor", "offload"]  # an explicit list
    with pytest.raises(PluginError, match="plugin 'nope' is not installed"):
        load_plugins(["nope"])


def test_configure_validates_each_table() -> None:
    class Opts(BaseModel, extra="forbid"):
        size: int = 1

    class WithOpts(Plugin):
        name = "opts"
        settings_model = Opts

    plugin = WithOpts()
    configure([plugin], {"opts": {"size": "3"}})
    assert plugin.settings.size == 3
    with pytest.raises(PluginError, match=r"\[plugins\.opts\]:\n  size: Input should be a valid integer"):
        configure([plugin], {"opts": {"size": "big"}})
    with pytest.raises(PluginError, match="takes no settings"):
        configure([Tag("plain")], {"plain": {"x": 1}})


def test_two_plugins_with_one_tool_name_are_refused() -> None:
    from gateway.handlers import guarded, tool

    async def fn(args: Any, call: Any) -> dict[str, Any]:
        return {}

    class A(Plugin):
        def tools(self):
            return [tool("same", "x", guarded(fn))]

    with pytest.raises(PluginError, match="two plugins define the tool 'same'"):
        Pipeline([A(), A()]).tools()


class Now(Tag):
    """Decides at once unless told to wait; `on_tool_result` is its waiting way."""

    def __init__(self, name: str, wait: bool = False, fail: str = "") -> None:
        super().__init__(name, fail)
        self.wait = wait

    def on_tool_result_now(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult | None:
        if self.fail == "now":
            raise ValueError("now broke")
        if self.wait:
            return None
        return types.CallToolResult(content=[types.TextContent(text=result_text(result) + self.name.upper())])


class Quiet(Plugin):
    name = "quiet"  # neither hook: skipped


async def test_plugins_that_decide_at_once_run_without_waiting_up_to_one_that_must_wait() -> None:
    empty = types.CallToolResult(content=[types.TextContent(text="")])
    pipeline = Pipeline([Now("a"), Quiet(), Now("bad", fail="now"), Now("w", wait=True), Tag("t"), Now("b")])
    partial, stopped = pipeline.on_tool_result_now(ToolCall("t", {}), empty)
    assert result_text(partial) == "A" and stopped == 3  # a ran, quiet skipped, bad passed on, w must wait
    # the rest goes on from the one that waited: its own `on_tool_result`, then the others'
    final = await pipeline.on_tool_result(ToolCall("t", {}), partial, stopped)
    assert result_text(final) == "Awtb"

    at_once, stopped = Pipeline([Now("a"), Quiet(), Now("b")]).on_tool_result_now(ToolCall("t", {}), empty)
    assert result_text(at_once) == "AB" and stopped == 3
    # a plugin with only the waiting hook stops the pipeline before it runs
    _, stopped = Pipeline([Tag("t"), Now("a")]).on_tool_result_now(ToolCall("t", {}), empty)
    assert stopped == 0
