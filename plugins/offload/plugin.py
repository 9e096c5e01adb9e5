"""The offload plugin: hooks that replace oversized results, and the exploring tools."""

from __future__ import annotations

import logging
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import ijson
import mcp_types as types
from pydantic import BaseModel, ConfigDict, Field

import plugins.offload.fileref as fileref
import plugins.offload.query as query
from gateway.args import Args, ToolInputError
from gateway.handlers import guarded, integer, tool
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.results import error_result
from gateway.services import heap, shares
from gateway.services.costs import COUNT_APART_ABOVE, size_at_least
from gateway.services.responses import StoreError
from gateway.services.text import human_size
from plugins.offload.explore import MODES, Explorer
from plugins.offload.json_file import BrokenJSON
from plugins.offload.paths import PathError

log = logging.getLogger("plugins.offload")
LOW_SPACE = 64 * 1024 * 1024  # below this, status and inspect warn


def free_space(folder: Path) -> int:
    """Bytes free for the workspace (its nearest existing parent)."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


PATH = {"type": "string", "description": "fileRef id, or the path it gives"}
JSON_PATH = {"type": "string", "description": "e.g. data.0.name; -1 = last"}  # $.data[0].name works too


class OffloadSettings(BaseModel):
    """`[plugins.offload]`"""

    model_config = ConfigDict(extra="forbid")
    response_ttl_hours: float = Field(48, gt=0)  # offloaded files older than this are removed at start


class OffloadPlugin(Plugin):
    name = "offload"
    order = 100  # first: the plugins after it (the monitor) see the fileRef, not the oversized result
    settings_model = OffloadSettings
    reads_spilled = True  # a huge reply's texts stay on disk and are moved into the workspace, never read

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.explorers: dict[str, Explorer] = {}  # one per namespace: a caller sees only its own results
        self.offloaded: Counter[str] = Counter()  # per host connection: a tenant sees only its own
        self.settings = OffloadSettings()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        await anyio.to_thread.run_sync(self._sweep, ctx)  # file work: off the loop
        if not ijson.backend.startswith("yajl2_c"):
            log.warning("ijson runs on its %s backend, not the C one: large JSON files will be slow", ijson.backend)
        # last: a start that fails before this leaves no worker behind (`serve` started one already, beside its
        # imports, through `gateway.early`: then this does nothing)
        threading.Thread(target=query.start_ahead, name="sql-worker-ahead", daemon=True).start()

    def _sweep(self, ctx: GatewayContext) -> None:
        """What a crash left and what outlived its TTL, in every namespace. A sweep that fails is logged in
        one line: offload starts all the same (without it every tenant would get oversized results inline)."""
        ttl = self.settings.response_ttl_hours
        try:
            namespaces = ctx.namespaces()
        except OSError as exc:
            log.warning("cannot list the namespaces to sweep (%s); offload starts without sweeping", exc)
            namespaces = [""]
        for namespace in namespaces:
            store = ctx.responses_for(namespace)
            try:
                if stale := store.remove_stale_temp_files():
                    log.info("removed %d temp entries left by an interrupted offload in %s", stale, store.folder)
                if removed := store.remove_older_than(ttl):
                    log.info("removed %d offloaded responses older than %s h from %s", removed, ttl, store.folder)
            except Exception as exc:
                log.warning(
                    "sweeping %s failed (%s: %s); offload starts all the same", store.folder, type(exc).__name__, exc
                )

    async def stop(self) -> None:
        query.stop_all()  # a conversion in the background must not hold the exit

    def _ctx(self) -> GatewayContext:
        assert self.ctx is not None, "offload plugin not started"
        return self.ctx

    def status(self, session_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {"offloaded": self.offloaded[session_id]}
        if ijson.backend not in ("yajl2_c", "yajl2_cffi"):  # the pure-Python parser: large JSON is slow
            out["warning"] = (
                f"ijson runs without its C extension ({ijson.backend}): outlines of large JSON results are slow; "
                "reinstall ijson from a wheel for your platform"
            )
        if self.ctx is not None:
            free = free_space(self.ctx.responses.folder)
            out["workspace_free"] = human_size(free)
            if free < LOW_SPACE:
                out["warning"] = (
                    f"only {human_size(free)} free for offloaded results: large results will fail; run "
                    "`mcp-context-gateway clean` or free disk space"
                )
        return out

    # -- hooks ----------------------------------------------------------------------------------

    def _policy(self, server: str, tool: str) -> str:
        config = self._ctx().settings.servers.get(server)
        return config.offload_policy(tool) if config is not None else "auto"

    async def on_tools_listed(self, tools: list[types.Tool], session_id: str) -> list[types.Tool]:
        # Hosts validate structuredContent against outputSchema and would reject a fileRef; a tool whose
        # results are never offloaded keeps its schema.
        routes = self._ctx().routing.tool_routes
        return [
            t.model_copy(update={"output_schema": None})
            if t.name in routes
            and t.output_schema
            and self._policy(routes[t.name].server, routes[t.name].name) != "never"
            else t
            for t in tools
        ]

    def _limits(self, call: ToolCall) -> tuple[str, int, int] | None:
        """The call's offload policy and (max size, max tokens); None when its results are never offloaded."""
        if call.server is None:
            return None
        policy = self._policy(call.server, call.tool)
        if policy == "never":
            return None
        window = self._ctx().window
        return policy, window.max_response_size(call.server), window.max_response_tokens(call.server, call.session_id)

    def on_tool_result_now(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult | None:
        if (limits := self._limits(call)) is None:
            return result
        policy, max_size, max_tokens = limits
        if policy != "auto" or size_at_least(result) > min(max_size, COUNT_APART_ABOVE):
            return None  # writing the file waits, or its count does (in a thread)
        cost = call.cost_of(result)
        return None if cost.size > max_size or cost.tokens > max_tokens else result

    async def on_tool_result(self, call: ToolCall, result: types.CallToolResult) -> types.CallToolResult:
        if (limits := self._limits(call)) is None:
            return result
        policy, max_size, max_tokens = limits
        # a result over the size limit is offloaded whatever its tokens: they are counted while its file
        # is converted (`fileref.offload`), off the event loop; one under it is counted to decide, unless
        # a prefix of its text is over the token limit already (then it too is counted beside its conversion)
        if (
            policy == "auto"
            and size_at_least(result) <= max_size
            and await call.fits_apart(result, max_size, max_tokens)
        ):
            return result
        responses = self._ctx().responses_for(call.namespace)
        written: list[Path] = []
        try:
            replaced = await shares.offload_pool().run(
                call.namespace,
                fileref.offload,
                responses,
                call,
                result,
                max_size,
                max_tokens,
                written,
                policy == "always",
            )
        except anyio.get_cancelled_exc_class():
            # the host cancelled (or went away) while the file was written: nobody will receive it
            for path in written:
                path.unlink(missing_ok=True)
            raise
        except shares.Busy as exc:  # no place within minutes: never the oversized result instead
            return error_result(f"The result of {call.name} is too large for the context and {exc}")
        except OSError as exc:  # never the oversized result instead: it would flood the context
            log.error("offload of %s failed: %s", call.name, exc)
            try:  # cached if the write had counted it
                cost = await call.cost_apart(result)
                figures = f"{human_size(cost.size)}, ~{cost.tokens} tokens"
            except Exception:  # a result that cannot be counted: its bytes then
                figures = f"at least {human_size(size_at_least(result))}"
            return error_result(
                f"The result of {call.name} ({figures}) is too large for the "
                f"context and could not be saved to the workspace ({exc.strerror or exc}; "
                f"{human_size(free_space(responses.folder))} free in {responses.folder}). Run "
                "`mcp-context-gateway clean` or free disk space, then call the tool again."
            )
        except Exception as exc:  # whatever it was, never the oversized result instead
            log.exception("offload of %s failed", call.name)
            return error_result(
                f"The result of {call.name} is too large for the context and could not be saved to the workspace "
                f"({type(exc).__name__}: {str(exc)[:200]}); the gateway's log has the details."
            )
        heap.give_back_soon()  # the result's pages, once the reply is written and its text freed
        if replaced is None:
            return result
        self.offloaded[call.session_id] += 1
        return replaced

    # -- the exploration tools -----------------------------------------------------------------------

    def tools(self) -> list[PluginTool]:
        path = {"path": PATH}
        handle = self._tool
        return [
            tool(
                "response_outline",
                "Outline an offloaded result: type, keys, item counts, samples and ready-to-use hints. "
                "Call this first; never read the whole file.",
                handle(lambda e: e.outline),
                path,
                ["path"],
            ),
            tool(
                "response_compress",
                "A smaller view of an offloaded JSON result (by mode), optionally below json_path.",
                handle(lambda e: e.compress),
                path
                | {
                    "mode": {"type": "string", "enum": list(MODES)},
                    "json_path": JSON_PATH,
                    "array_head": {"type": "integer"},
                    "array_tail": {"type": "integer"},
                    "max_length": {"type": "integer"},
                    "keys": {"type": "array", "items": {"type": "string"}},
                },
                ["path", "mode"],
            ),
            tool(
                "response_slice",
                "A value of an offloaded JSON result (json_path), or lines start_line..end_line of any result.",
                handle(lambda e: e.slice),
                path
                | {
                    "json_path": JSON_PATH,
                    "start_line": {"type": "integer"},
                    "end_line": {"type": "integer"},
                },
                ["path"],
            ),
            tool(
                "response_search",
                "Lines (text) or records (JSON) of an offloaded result that contain the query words, "
                "ranked, with paths or line numbers.",
                handle(lambda e: e.search),
                path | {"query": {"type": "string"}, "limit": integer(default=10), "offset": integer(default=0)},
                ["path", "query"],
            ),
            tool(
                "response_query",
                "DuckDB SQL over a whole offloaded result (table names: in the fileRef and response_outline).",
                handle(lambda e: e.query),
                path | {"sql": {"type": "string"}, "max_tokens": integer("default: the result limit")},
                ["path", "sql"],
            ),
        ]

    def _explorer(self, namespace: str) -> Explorer:
        if namespace not in self.explorers:
            self.explorers[namespace] = Explorer(self._ctx().responses_for(namespace), namespace)
        return self.explorers[namespace]

    def _tool(self, handler: Any) -> Any:
        """`handler(explorer)` is the bound method to run for the caller's namespace."""

        async def threaded(args: Args, call: ToolCall) -> dict[str, Any]:
            budget = self._ctx().window.max_response_tokens(None, call.session_id)
            method = handler(self._explorer(call.namespace))
            try:  # file work stays off the event loop, within the caller's share of the explore threads
                return await shares.explore_pool().run(call.namespace, method, args, budget)
            except UnicodeDecodeError:
                raise ToolInputError("the file is not UTF-8 text; open it with its openCmd instead") from None
            except BrokenJSON as exc:
                raise ToolInputError(str(exc)) from None

        return guarded(threaded, (StoreError, PathError))
