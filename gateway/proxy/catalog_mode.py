"""Catalog mode: many servers behind one entry without drowning a small model in definitions.

Instead of every upstream definition, the host is shown three meta-tools: tool_search (FTS5 over
names split like identifiers, descriptions and argument names), tool_schema (one full definition)
and tool_call (arguments checked against the upstream schema, then the normal pipeline).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types

from gateway.args import Args, ToolInputError
from gateway.handlers import guarded, tool
from gateway.plugin import PluginTool, ToolCall
from gateway.proxy.routing import RoutingTable
from gateway.results import error_result
from gateway.services.costs import definition_tokens
from gateway.services.search_index import SearchIndex

CallFn = Callable[[ToolCall], Awaitable[types.CallToolResult]]
MAX_SCHEMA_QUOTE = 1500


def one_line(text: str | None, limit: int = 120) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class CatalogMode:
    def __init__(
        self,
        routing: RoutingTable,
        call: CallFn,
        window: Callable[[str | None], int],
        wait_ready: Callable[[], Awaitable[None]] | None = None,
    ):
        self.routing = routing
        self._call = call
        self._window = window
        self._wait_ready = wait_ready
        self._index: SearchIndex | None = None
        self._indexed_version = -1
        self._validators: dict[str, Any] = {}

    # -- which tools the host sees ---------------------------------------------------------------

    def _server_mode(self, server: str, global_mode: str) -> str:
        cfg = self.routing.upstreams[server].config
        if cfg.pin:
            return "direct"
        if cfg.tool_mode in ("direct", "catalog"):
            return cfg.tool_mode
        return global_mode

    def decide(self, session_id: str | None = None) -> tuple[str, str]:
        """(mode, reason) for the global setting; `auto` picks catalog above a quarter of the host's window."""
        setting = self.routing.settings.gateway.tool_mode
        if setting != "auto":
            return setting, f"tool_mode = {setting}"
        unpinned = [
            t
            for name, t in self.routing.tools.items()
            if not self.routing.upstreams[self.routing.tool_routes[name].server].config.pin
        ]
        window = self._window(session_id)
        cost, quarter = definition_tokens(unpinned), window // 4
        if cost > quarter:
            return (
                "catalog",
                f"auto: upstream definitions take ~{cost} tokens, more than 1/4 of the {window}-token window",
            )
        return (
            "direct",
            f"auto: upstream definitions take ~{cost} tokens, within 1/4 of the {window}-token window",
        )

    def listing(self, session_id: str | None = None, mode: str | None = None) -> tuple[bool, list[types.Tool]]:
        """(whether any upstream is behind the catalog, the upstream tools listed directly), from one
        decision: in auto mode deciding estimates every definition, so it is done once per listing.
        `mode` ("direct" or "catalog") overrides the decision: what the other mode would list."""
        if mode is None:
            mode, _ = self.decide(session_id)
        modes = {server: self._server_mode(server, mode) for server in self.routing.upstreams}
        direct = [
            t for name, t in self.routing.tools.items() if modes[self.routing.tool_routes[name].server] == "direct"
        ]
        return "catalog" in modes.values(), direct

    # -- the index ---------------------------------------------------------------------------------

    def _ensure_index(self) -> SearchIndex:
        if self._index is None:
            self._index = SearchIndex(":memory:", table="tools", columns=("server",))
        if self._indexed_version != self.routing.version:
            self._index.delete({})  # every row
            rows = []
            for name, tool in self.routing.tools.items():
                route = self.routing.tool_routes[name]
                props = (tool.input_schema or {}).get("properties") or {}
                arg_text = " ".join(
                    f"{k} {one_line(v.get('description') if isinstance(v, dict) else '', 60)}" for k, v in props.items()
                )
                words = f"{name} {route.name.replace('-', ' ').replace('_', ' ')} {tool.title or ''}"
                rows.append((name, f"{words}\n{tool.description or ''}\n{arg_text}", (route.server,)))
            self._index.add(rows)
            self._indexed_version = self.routing.version
            self._validators.clear()
        return self._index

    # -- the meta-tools ------------------------------------------------------------------------------

    def tools(self) -> list[PluginTool]:
        return [
            tool(
                "tool_search",
                "Find upstream tools by what they do; returns names to use with tool_schema and tool_call.",
                guarded(self.search),
                {"query": {"type": "string"}, "server": {"type": "string"}, "limit": {"type": "integer"}},
                ["query"],
            ),
            tool(
                "tool_schema",
                "The full definition (arguments) of one upstream tool.",
                guarded(self.schema),
                {"name": {"type": "string"}},
                ["name"],
            ),
            tool(
                "tool_call",
                "Call an upstream tool by name with its arguments.",
                self.call,
                {"name": {"type": "string"}, "arguments": {"type": "object"}},
                ["name"],
            ),
        ]

    async def search(self, args: Args, call: ToolCall) -> dict[str, Any]:
        query = args.str("query", required=True, max_len=500)
        server = args.str("server")
        limit = args.int("limit", 5, lo=1, hi=30)
        if server is not None and server not in self.routing.upstreams:
            raise ToolInputError(f"unknown server {server!r}; servers: {', '.join(self.routing.upstreams)}")
        if self._wait_ready is not None:  # right after start, upstreams may still be listing their tools
            await self._wait_ready()
        index = self._ensure_index()
        results = []
        for hit in index.search(query, limit, {"server": server} if server else None):
            found = self.routing.tools.get(hit.key)
            if found is None:  # gone since the last rebuild: never offered
                continue
            results.append(
                {
                    "name": hit.key,
                    "server": self.routing.tool_routes[hit.key].server,
                    "description": one_line(found.description),
                }
            )
        payload: dict[str, Any] = {"query": query, "tools": results}
        if not results:
            payload["note"] = "no tool matched; try other words (what the tool does, or an argument name)"
        else:
            payload["next"] = f"tool_schema(name='{results[0]['name']}'), then tool_call"
        return payload

    async def schema(self, args: Args, call: ToolCall) -> dict[str, Any]:
        name = args.str("name", required=True, max_len=200)
        found = self.routing.tools.get(name)
        if found is None and self._wait_ready is not None:
            await self._wait_ready()
            found = self.routing.tools.get(name)
        if found is None:
            raise ToolInputError(f"no upstream tool named {name!r}; use tool_search to find one")
        wire = found.model_dump(by_alias=True, mode="json", exclude_none=True)
        wire.pop("outputSchema", None)  # results may be replaced by a fileRef (offload)
        return wire

    async def call(self, call: ToolCall) -> types.CallToolResult:
        try:
            args = Args(call.arguments, "tool_call")
            name = args.str("name", required=True, max_len=200)
            arguments = args.raw.get("arguments") or {}
        except ToolInputError as exc:
            return error_result(str(exc))
        if not isinstance(arguments, dict):
            return error_result('tool_call: `arguments` must be an object, e.g. {"path": "/tmp/a.txt"}')
        tool = self.routing.tools.get(name)
        if tool is None and self._wait_ready is not None:  # a call right after start: upstreams may be starting
            await self._wait_ready()
            tool = self.routing.tools.get(name)
        if tool is None:
            return error_result(f"tool_call: no upstream tool named {name!r}; use tool_search to find one")
        self._ensure_index()
        problem = self._check(name, tool, arguments)
        if problem:
            return error_result(problem)
        # the inner call is the host's call with another name and arguments: same connection, request id,
        # progress reporter and `_meta`, so elicitation and tracing reach the host as for a direct call
        target = dataclasses.replace(call, name=name, arguments=arguments, server=None, tool="")
        result = await self._call(target)
        # the outer pipeline (offload, monitor) sees the upstream call, not the meta-tool
        call.server, call.tool = target.server, target.tool
        return result

    def _check(self, name: str, tool: types.Tool, arguments: dict[str, Any]) -> str | None:
        schema = tool.input_schema or {"type": "object"}
        validator = self._validators.get(name)
        if validator is None:
            import jsonschema  # ~35 ms of import, needed only for catalog mode's first tool_call: not at start

            try:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
                validator = cls(schema)
            except jsonschema.SchemaError:
                return None  # the upstream's own schema is broken: let the upstream judge
            self._validators[name] = validator
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if not errors:
            return None
        lines = [f"- {'.'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}" for e in errors[:5]]
        quoted = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        if len(quoted) > MAX_SCHEMA_QUOTE:
            quoted = quoted[:MAX_SCHEMA_QUOTE] + "…(see tool_schema)"
        return (
            f"tool_call: the arguments for {name} do not match its schema:\n"
            + "\n".join(lines)
            + f"\nExpected input schema: {quoted}\nFix the arguments and call tool_call again."
        )
