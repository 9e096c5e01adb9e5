"""A third-party plugin: a setting of its own, one tool, and a hook that counts upstream results."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gateway import Args, GatewayContext, Plugin, PluginTool, ToolCall, guarded, tool


class TinySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    greeting: str = "hello"


class TinyPlugin(Plugin):
    settings_model = TinySettings

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.started = False

    async def start(self, ctx: GatewayContext) -> None:
        self.started = True

    def tools(self) -> list[PluginTool]:
        return [tool("tiny_hello", "Say the configured greeting.", guarded(self.hello))]

    async def hello(self, args: Args, call: ToolCall) -> dict[str, Any]:
        return {"greeting": self.settings.greeting, "upstream_results_seen": list(self.seen)}

    async def on_tool_result(self, call: ToolCall, result: Any) -> Any:
        if call.server is not None:
            self.seen.append(call.name)
        return result


class BrokenPlugin(Plugin):
    """Its start fails: the gateway must leave it out and keep serving."""

    def tools(self) -> list[PluginTool]:
        return [tool("broken_tool", "Never listed: the plugin fails to start.", guarded(self.never))]

    async def never(self, args: Args, call: ToolCall) -> dict[str, Any]:
        return {}

    async def start(self, ctx: GatewayContext) -> None:
        raise RuntimeError("broken on purpose")
