"""The routing table: the merged view the host sees (namespacing, filters, collisions) and where each name goes.

Tools and prompts are shown as `<server><sep><name>`; resource URIs as `<server>+<uri>`,
which is reversible without a lookup table.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
from dataclasses import dataclass

import mcp_types as types

import gateway.compat as compat
from gateway.proxy.definitions import DefinitionLedger
from gateway.proxy.upstream import Upstream, maps_headers
from gateway.services.storage import Storage
from gateway.settings import Settings

log = logging.getLogger("gateway.routing")

MAX_NAME = 64
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]")
URI_SEP = "+"


@dataclass(frozen=True)
class Route:
    server: str
    name: str  # the upstream's own name


def safe_name(name: str) -> str:
    """A name hosts accept: `^[a-zA-Z0-9_-]{1,64}$`; shortened names keep a hash so they stay unique."""
    clean = _BAD_CHARS.sub("_", name) or "_"
    if len(clean) <= MAX_NAME and clean == name:
        return clean
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    return clean if len(clean) <= MAX_NAME else f"{clean[: MAX_NAME - 7]}_{digest}"


def repair_tool(tool: types.Tool, name: str) -> types.Tool:
    """A copy with the host-facing name and an input schema hosts accept: `type: object`, `properties`
    an object of schemas, `required` a list of names. What cannot be repaired is dropped from it."""
    schema = dict(tool.input_schema or {})
    schema["type"] = "object"
    if "properties" in schema:
        props = schema["properties"] if isinstance(schema["properties"], dict) else {}
        schema["properties"] = {k: v for k, v in props.items() if isinstance(v, (dict, bool))}
    required = schema.get("required")
    if "required" in schema:
        if isinstance(required, list):
            schema["required"] = [r for r in required if isinstance(r, str)]
        else:
            del schema["required"]
    return tool.model_copy(update={"name": name, "input_schema": schema})


def wire_problem(tool: types.Tool) -> str | None:
    """Why hosts would reject this definition (it would fail the whole tools/list), or None."""
    wire = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    return compat.wire_problem("tools/list", {"tools": [wire]})


class RoutingTable:
    """Upstreams and the merged view over them. Rebuilt whenever an upstream changes."""

    def __init__(self, settings: Settings, upstreams: dict[str, Upstream], reserved: set[str] | None = None):
        self.settings = settings
        self.upstreams = upstreams
        self.reserved = set(reserved or ())  # names of the gateway's own tools
        self.tools: dict[str, types.Tool] = {}
        self.tool_routes: dict[str, Route] = {}
        # the tools whose input schema maps arguments to `Mcp-Param-*` headers (only their calls have
        # headers the SDK's check can refuse): looked at once per definition, not per call
        self.header_tools: frozenset[str] = frozenset()
        self.prompts: dict[str, types.Prompt] = {}
        self.prompt_routes: dict[str, Route] = {}
        self.collisions: list[str] = []
        self.dropped: list[str] = []  # definitions repaired, or left out because hosts would reject them
        self.changed: dict[str, str] = {}  # host-facing name -> how its definition changed since first seen
        self.config_problems: list[str] = []  # tool overrides that name no tool, or give a name already taken
        self.frozen = settings.gateway.freeze_definitions
        self.ledger = DefinitionLedger(settings.gateway.workspace / "definitions.json", Storage(settings.storage))
        # (server, definition) -> its wire problem, and whether its schema maps arguments to headers
        self._checked: dict[tuple[str, str], tuple[str | None, bool]] = {}
        self.version = 0
        self.rebuild()

    @property
    def sep(self) -> str:
        return self.settings.gateway.separator

    def _exposed(self, server: str, name: str, prefixed: bool) -> str:
        return safe_name(f"{server}{self.sep}{name}" if prefixed else name)

    @staticmethod
    def _overrides(server: str, up: Upstream, problems: list[str]) -> dict[str, str]:
        """The names the host sees for `server`'s renamed tools (own name -> new name). A rename or
        description of a tool the server does not list, or a rename to a name another of its tools
        shows, is a config problem (the tool keeps its own name)."""
        rules = up.config.tools
        listed = {t.name for t in up.tools}
        if up.state == "ok":  # its listing is known
            for table, names in (("rename", rules.rename), ("describe", rules.describe)):
                for old in sorted(set(names) - listed):
                    close = difflib.get_close_matches(old, sorted(listed), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    problems.append(
                        f"server '{server}': tools.{table} names {old!r}, which it does not list{hint}: "
                        "use its own tool names"
                    )
        shown = {n: rules.rename.get(n, n) for n in listed if rules.allows(n)}
        for old, new in sorted(shown.items()):
            other = next((n for n, s in shown.items() if s == new and n != old), None)
            if old != new and other is not None:
                problems.append(
                    f"server '{server}': tools.rename {old!r} = {new!r} collides with its tool {other!r}: "
                    "choose another name"
                )
                shown[old] = old
        return {old: new for old, new in shown.items() if old != new}

    def rebuild(self) -> None:
        tools: dict[str, types.Tool] = {}
        routes: dict[str, Route] = {}
        header_tools: set[str] = set()
        prompts: dict[str, types.Prompt] = {}
        prompt_routes: dict[str, Route] = {}
        owners: dict[str, str] = {name: "the gateway" for name in self.reserved}
        collisions: list[str] = []
        dropped: list[str] = []
        changed: dict[str, str] = {}
        problems: list[str] = []
        # by name within each server (servers in config order): the merged list is byte-identical from
        # one listing to the next whatever order an upstream lists in (local models reuse their prompt
        # cache only then), and a name collision always resolves the same way
        for server, up in self.upstreams.items():
            cfg = up.config
            shown = self._overrides(server, up, problems)
            for tool in sorted(up.tools, key=lambda t: t.name):
                if not cfg.tools.allows(tool.name):
                    continue
                name = self._exposed(server, shown.get(tool.name, tool.name), cfg.prefix)
                if name in owners:
                    alt = self._exposed(server, shown.get(tool.name, tool.name), True)
                    collisions.append(
                        f"tool name '{name}' of server '{server}' collides with {_owner(owners[name])}; "
                        f"shown as '{alt}' instead (set prefix = true on one of them)"
                    )
                    name = alt
                    if name in owners:
                        continue
                first, change = self.ledger.check(server, tool, self.frozen)
                if change:
                    changed[name] = f"tool '{tool.name}' of server '{server}' changed its definition: {change}"
                    if self.frozen and first:
                        tool = types.Tool.model_validate(first)  # the host keeps what it was first shown
                repaired = repair_tool(tool, name)
                if described := cfg.tools.describe.get(tool.name):
                    repaired = repaired.model_copy(update={"description": described})
                if repaired.input_schema != {**(tool.input_schema or {}), "type": "object"}:
                    dropped.append(f"tool '{tool.name}' of server '{server}': its input schema was repaired")
                key = (server, repaired.model_dump_json())
                if key not in self._checked:
                    self._checked[key] = (wire_problem(repaired), maps_headers(repaired.input_schema))
                problem, headed = self._checked[key]
                if problem:
                    dropped.append(
                        f"tool '{tool.name}' of server '{server}' left out: hosts would reject it ({problem})"
                    )
                    continue
                owners[name] = server
                if headed:
                    header_tools.add(name)
                tools[name] = repaired
                routes[name] = Route(server, tool.name)
            for prompt in sorted(up.prompts, key=lambda p: p.name):
                name = self._exposed(server, prompt.name, cfg.prefix)
                if name in prompts:
                    name = self._exposed(server, prompt.name, True)
                prompts[name] = prompt.model_copy(update={"name": name})
                prompt_routes[name] = Route(server, prompt.name)
        for line in collisions:
            if line not in self.collisions:
                log.error("name collision: %s", line)
        for line in dropped:
            if line not in self.dropped:
                log.error("%s", line)
        for line in problems:
            if line not in self.config_problems:
                log.error("config: %s", line)
        self.config_problems = problems
        self.dropped = dropped
        if len(self._checked) > 10_000:  # definitions of upstreams long gone
            self._checked.clear()
        self.tools, self.tool_routes = tools, routes
        self.header_tools = frozenset(header_tools)
        self.prompts, self.prompt_routes = prompts, prompt_routes
        self.collisions = collisions
        self.changed = changed
        self.ledger.flush_soon()  # PostgreSQL's write goes on behind, off the event loop
        self.version += 1

    # -- resources (namespaced by URI prefix, no table needed) ---------------------------

    def resources(self) -> list[types.Resource]:
        out = []
        for server, up in self.upstreams.items():
            ordered = sorted(up.resources, key=lambda r: str(r.uri))
            out += [r.model_copy(update={"uri": f"{server}{URI_SEP}{r.uri}"}) for r in ordered]
        return out

    def resource_templates(self) -> list[types.ResourceTemplate]:
        out = []
        for server, up in self.upstreams.items():
            ordered = sorted(up.templates, key=lambda t: t.uri_template)
            out += [t.model_copy(update={"uri_template": f"{server}{URI_SEP}{t.uri_template}"}) for t in ordered]
        return out

    def resource_route(self, uri: str) -> Route | None:
        """`<server>+<uri>`; or a URI as its server gave it: the one server that lists it, else the only
        server that offers resources (a host that asks for a URI it knows, as it would directly)."""
        server, sep, rest = uri.partition(URI_SEP)
        if sep and server in self.upstreams:
            return Route(server, rest)
        listing = [name for name, up in self.upstreams.items() if any(str(r.uri) == uri for r in up.resources)]
        if listing:  # listed by several servers: ambiguous, the host must name one
            return Route(listing[0], uri) if len(listing) == 1 else None
        offering = [name for name, up in self.upstreams.items() if up.declares("resources")]
        return Route(offering[0], uri) if len(offering) == 1 else None

    # -- lookups ------------------------------------------------------------------------------

    def upstream_for(self, route: Route) -> Upstream:
        return self.upstreams[route.server]

    def definitions_by_server(self) -> dict[str, list[types.Tool]]:
        out: dict[str, list[types.Tool]] = {name: [] for name in self.upstreams}
        for name, tool in self.tools.items():
            out[self.tool_routes[name].server].append(tool)
        return out


def _owner(owner: str) -> str:
    return owner if owner == "the gateway" else f"server '{owner}'"
