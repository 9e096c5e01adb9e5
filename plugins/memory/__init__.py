"""Session memory: notes that live outside the context window and come back when needed.

One append-only JSONL log per session under `{workspace}/sessions/` (`tail -f` shows it grow);
recall by BM25 x recency over an FTS5 index rebuilt from the logs; compaction folds old notes
into a summary (model endpoint, or a fact-keeping fallback) without deleting anything.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types

from gateway.args import Args
from gateway.handlers import guarded, integer, tool
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.services import heap, shares
from gateway.services.model_endpoint import LLMUnavailable
from gateway.services.storage import Logs
from gateway.services.storage_error import StorageError
from gateway.services.tokens import estimate_tokens
from plugins.memory.gate import check, with_coverage
from plugins.memory.guide import GUIDE
from plugins.memory.recall import Query, folded_worth_showing, order
from plugins.memory.sessions import (
    AlreadyFolded,
    Entry,
    RecallIndex,
    Session,
    SessionCache,
    SessionError,
    check_session_id,
)
from plugins.memory.summary import INSTRUCTION, STRICT_INSTRUCTION, fallback_summary

log = logging.getLogger("plugins.memory")

NEAR_BUDGET = 0.8
RECENCY_WEIGHT = 0.25
MAX_TEXT = 200_000
GIVE_BACK_CHARS = 4_000_000  # sessions this large dropped from memory: their pages go back to the system
T = TypeVar("T")


SID = {"type": "string"}  # named in context_open, the tool called first


class MemoryPlugin(Plugin):
    name = "memory"
    order = 200

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.sessions: dict[str, SessionCache] = {}  # one per namespace: its share of sessions held in memory
        self.recall_indexes: dict[str, RecallIndex] = {}  # one per namespace
        self.logs: dict[str, Logs] = {}  # one per namespace: the sessions' logs
        self._locks: dict[str, anyio.Lock] = {}  # of the sessions a call holds or waits for, only
        self._opening = threading.Lock()  # a namespace's index and logs are opened once, by one thread

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self._folder("").mkdir(parents=True, exist_ok=True)
        self._recall_index("")  # a damaged index is found (and moved aside) at start, not at the first recall

    async def stop(self) -> None:
        for index in self.recall_indexes.values():
            index.index.close()
        for logs in self.logs.values():
            logs.close()

    def _folder(self, namespace: str) -> Path:
        assert self.ctx is not None, "memory plugin not started"
        return self.ctx.namespace_dir(namespace) / "sessions"

    def _recall_index(self, namespace: str) -> RecallIndex:
        with self._opening:
            return self._open_index(namespace)

    def _open_index(self, namespace: str) -> RecallIndex:
        if namespace not in self.recall_indexes:
            assert self.ctx is not None
            index = self.ctx.storage.search_index(
                self._folder(namespace) / "index.sqlite",
                "memory",
                namespace,
                RecallIndex.TABLE,
                RecallIndex.COLUMNS,
                RecallIndex.SCHEMA,
            )
            self.recall_indexes[namespace] = RecallIndex(index)
        return self.recall_indexes[namespace]

    def _logs(self, namespace: str) -> Logs:
        with self._opening:
            if namespace not in self.logs:
                assert self.ctx is not None
                self.logs[namespace] = self.ctx.storage.logs(self._folder(namespace), "memory", namespace)
            return self.logs[namespace]

    def _session(self, session_id: Any, namespace: str = "") -> Session:
        """The session brought up to its log (in a thread: reading a log is I/O)."""
        sid = check_session_id(session_id)
        cache = self.sessions.get(namespace) or self.sessions.setdefault(namespace, SessionCache())
        return cache.get(sid, lambda: Session(sid, self._logs(namespace).log(sid)))

    def _existing(self, session_id: Any, namespace: str) -> Session:
        """A session that was opened or written to; an unknown name (a typo) is an error naming those that exist."""
        session = self._session(session_id, namespace)
        if not session.exists:
            raise SessionError(self._unknown(session.id, namespace))
        return session

    def _unknown(self, session_id: str, namespace: str) -> str:
        names = self._logs(namespace).names()
        listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        return (
            f"no memory session {session_id!r}; "
            + (f"the sessions here: {listed}" if names else "there are no sessions yet")
            + " (context_open or context_append starts one)"
        )

    def _budget(self, session_id: str | None = None) -> int:
        assert self.ctx is not None
        return self.ctx.window.budget(session_id)

    async def _run(self, call: ToolCall, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` off the event loop, in the caller's share of the store's threads: logs, the index,
        ranking and summaries all take CPU or wait on a disk, and the loop serves every tenant."""
        return await shares.store_pool().run(call.namespace, self._then_give_back, call.namespace, fn, *args)

    def _then_give_back(self, namespace: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        finally:  # the call is done with its session: when a large one left the cache, its memory is free now
            cache = self.sessions.get(namespace)
            if cache is not None and cache.settle() >= GIVE_BACK_CHARS:
                heap.give_back()  # else a thread's heap keeps the pages (+60 MB after one 60 MB session)

    @staticmethod
    def _usage(session: Session, budget: int) -> dict[str, Any]:
        used = session.used_tokens()
        out: dict[str, Any] = {"tokens_used": used, "budget": budget}
        if used >= NEAR_BUDGET * budget:
            out["warning"] = (
                f"memory holds {used} of {budget} tokens; consider context_compact(session_id="
                f"'{session.id}') to fold older notes into a summary"
            )
        if session.damaged_lines:
            out["damaged_lines"] = session.damaged_lines
            out["damaged_note"] = (
                f"{session.damaged_lines} line(s) of {Path(session.log.where).name} could not be read and were skipped; "
                "every other note is intact and new ids never reuse old ones"
            )
        return out

    def tools(self) -> list[PluginTool]:
        sid = {"session_id": SID}
        return [
            tool(
                "context_open",
                "Open (or create) a memory session; shows its pinned notes and size. Start here.",
                self._tool(self.open),
                {"session_id": SID | {"description": "your name for this memory, e.g. 'billing-refactor'"}},
                ["session_id"],
            ),
            tool(
                "context_append",
                "Save a note outside the context window (facts, decisions, results). "
                "pinned=true for the goal and key constraints.",
                self._tool(self.append),
                sid | {"text": {"type": "string"}, "pinned": {"type": "boolean"}},
                ["session_id", "text"],
            ),
            tool(
                "context_status",
                "Memory size vs budget, compaction state, and the context estimate.",
                self._tool(self.status_tool),
                sid,
                ["session_id"],
            ),
            tool(
                "context_compact",
                "Fold older notes into one summary; pinned ones and the newest keep_recent stay. dry_run: preview.",
                self._tool(self.compact),
                sid
                | {
                    "keep_recent": integer(default=5),
                    "target_tokens": integer("default: a quarter of the budget"),
                    "dry_run": {"type": "boolean"},
                },
                ["session_id"],
            ),
            tool(
                "context_recall",
                "Pinned notes plus the notes that best match query, within max_tokens.",
                self._tool(self.recall),
                sid | {"query": {"type": "string"}, "max_tokens": integer("default: the budget")},
                ["session_id"],
            ),
            tool("context_guide", "How to use these tools together; read once.", self._guide),
        ]

    def _tool(self, fn: Any) -> Any:
        async def locked(args: Args, call: ToolCall) -> dict[str, Any]:
            sid = check_session_id(args.raw.get("session_id"))
            async with self._one_at_a_time(f"{call.namespace}/{sid}"):
                return await fn(args, call)

        return guarded(locked, (SessionError, StorageError))

    @asynccontextmanager
    async def _one_at_a_time(self, key: str) -> AsyncIterator[None]:
        """One call at a time on a session; its lock is forgotten when no call holds or waits for it."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = anyio.Lock()
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting and self._locks.get(key) is lock:
                del self._locks[key]

    async def _guide(self, call: ToolCall) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text=GUIDE)])

    # Each tool: arguments read on the loop, then the work (log, index, ranking, summary) in `_run`.

    async def open(self, args: Args, call: ToolCall) -> dict[str, Any]:
        budget = self._budget(call.session_id)
        return await self._run(call, self._open, args.raw["session_id"], call.namespace, budget)

    def _open(self, session_id: Any, namespace: str, budget: int) -> dict[str, Any]:
        session = self._session(session_id, namespace)
        created = self._create(session)
        active = session.active()
        return {
            "session_id": session.id,
            "created": created,
            "entries": len(active),
            "pinned": [e.view() for e in active if e.pinned],
            "last_compaction": session.last_compaction,
            **self._usage(session, budget),
            "log": session.log.where,
        }

    @staticmethod
    def _create(session: Session) -> bool:
        """Whether the session is new; an opened session exists: status and recall know it by name."""
        if session.exists:
            return False
        session.log.touch()
        return True

    async def append(self, args: Args, call: ToolCall) -> dict[str, Any]:
        text = args.str("text", required=True, max_len=MAX_TEXT)
        pinned = args.bool("pinned", False)
        budget = self._budget(call.session_id)
        return await self._run(call, self._append, args.raw["session_id"], call.namespace, text, pinned, budget)

    def _append(self, session_id: Any, namespace: str, text: str, pinned: bool, budget: int) -> dict[str, Any]:
        session = self._session(session_id, namespace)
        entry = session.append_entry(text, pinned)
        return {"id": entry.id, "tokens": entry.tokens, "pinned": pinned, **self._usage(session, budget)}

    async def status_tool(self, args: Args, call: ToolCall) -> dict[str, Any]:
        assert self.ctx is not None
        budget = self._budget(call.session_id)
        out = await self._run(call, self._status, args.raw["session_id"], call.namespace, budget)
        out["token_counts"] = self.ctx.llm.describe()
        out["window"] = self.ctx.window.for_session(call.session_id).describe()
        figures = {k: v for k, v in self.ctx.status(call.session_id).items() if k != self.name}
        if figures:
            out["gateway"] = figures
        return out

    def _status(self, session_id: Any, namespace: str, budget: int) -> dict[str, Any]:
        session = self._session(session_id, namespace)
        unknown = None if session.exists else self._unknown(session.id, namespace)
        active = session.active()
        return {
            "session_id": session.id,
            # the gateway's figures are worth asking for before any note: an unknown name is said, not refused
            **({"note": unknown} if unknown else {}),
            **self._usage(session, budget),
            "entries": len(active),
            "pinned": sum(e.pinned for e in active),
            "superseded": len(session.entries) - len(active),
            "last_compaction": session.last_compaction,
        }

    async def compact(self, args: Args, call: ToolCall) -> dict[str, Any]:
        keep_recent = args.int("keep_recent", 5, lo=0, hi=10_000)
        target = args.int("target_tokens", max(200, self._budget(call.session_id) // 4), lo=50, hi=100_000)
        dry_run = args.bool("dry_run", False)
        plan = await self._run(call, self._plan, args.raw["session_id"], call.namespace, keep_recent, dry_run)
        if isinstance(plan, dict):  # nothing to fold, or the dry run
            return plan
        session, fold, before = plan
        summary, writer, gate = await self._summarize(call, fold, target)
        return await self._run(call, self._fold, session, fold, before, summary, writer, gate)

    def _plan(
        self, session_id: Any, namespace: str, keep_recent: int, dry_run: bool
    ) -> dict[str, Any] | tuple[Session, list[Entry], int]:
        """The notes to fold (the session, them, its tokens before), or the answer when none will be."""
        session = self._existing(session_id, namespace)
        active = session.active()
        candidates = [e for e in active if not e.pinned]
        fold = candidates[: max(0, len(candidates) - keep_recent)]
        before = session.used_tokens()
        if len(fold) < 2:
            return {
                "folded": 0,
                "note": (
                    f"nothing to fold: only {len(fold)} unpinned note{'' if len(fold) == 1 else 's'} older than the "
                    f"{len(candidates) - len(fold)} kept recent (keep_recent={keep_recent}), and a fold needs 2 or more"
                    + ("; lower keep_recent" if len(candidates) >= 2 else "")
                ),
                "tokens_used": before,
            }
        if dry_run:
            folding = {e.id for e in fold}
            return {
                "dry_run": True,
                "would_fold": [e.id for e in fold],
                "tokens_folded": sum(e.tokens for e in fold),
                "kept": [e.id for e in active if e.id not in folding],
            }
        return session, fold, before

    @staticmethod
    def _fold(session: Session, fold: list[Entry], before: int, summary: str, writer: str, gate: str) -> dict[str, Any]:
        folded_tokens = sum(e.tokens for e in fold)
        summary_tokens = estimate_tokens(summary)
        if summary_tokens >= folded_tokens:  # compaction must never grow a session
            return {
                "folded": 0,
                "note": f"nothing folded: the summary ({summary_tokens} tokens, {writer.split(' (')[0]}) would not be "
                f"smaller than the {len(fold)} notes it replaces ({folded_tokens} tokens); the notes stay as they are",
                "tokens_used": before,
                "gate": gate,
            }
        try:
            entry = session.append_compaction(summary, fold, writer.split(" (")[0], gate)
        except AlreadyFolded as exc:
            return {
                "folded": 0,
                "note": f"another compaction folded {len(exc.ids)} of these notes meanwhile; nothing was folded twice. "
                "Call context_status to see the session now.",
                "tokens_used": session.used_tokens(),
            }
        return {
            "folded": len(fold),
            "folded_ids": [e.id for e in fold],
            "summary_id": entry.id,
            "summary": summary,
            "written_by": writer,
            "gate": gate,
            "tokens_before": before,
            "tokens_after": session.used_tokens(),
        }

    async def _summarize(self, call: ToolCall, fold: list[Entry], target: int) -> tuple[str, str, str]:
        """(summary, who wrote it and why, the gate's verdict). The model's summary must pass the gate; a failed
        one is retried once with a stricter prompt, then the extractive fallback is kept. Either way the fact
        lines it lacks are added verbatim while they fit, and the notes left out are named. The model is
        awaited; the gate and the fallback run off the loop."""
        assert self.ctx is not None
        folded = sum(e.tokens for e in fold)
        failures: list[str] = []
        try:
            text = await self._run(call, lambda: "\n\n".join(f"[{e.id}] {e.text}" for e in fold))
            for instruction in (INSTRUCTION, STRICT_INSTRUCTION):
                answer = await self.ctx.llm.summarize(text, instruction, max_tokens=target)
                verdict = await self._run(call, check, answer, fold, target)
                if not verdict.failed:
                    model = self.ctx.llm.model or self.ctx.llm.base_url
                    gate = "passed" if not failures else f"passed on the retry (first: {failures[0]})"
                    room = min(folded * 3 // 4, max(2 * target, estimate_tokens(verdict.summary) + target))
                    covered = await self._run(call, with_coverage, verdict.summary, fold, room)
                    return covered, f"model ({model})", gate
                failures.append(verdict.failed)
        except LLMUnavailable as exc:
            why = "the model endpoint was not available"
            summary = await self._run(call, fallback_summary, fold, target, why)
            return summary, f"fallback (extractive; {why}: {exc})", "-"
        rule = re.split(r":| \(", failures[-1])[0]  # the rule, without the summary's words it quotes
        why = f"the model's summary failed the gate twice: {rule}"
        gate = f"the model's summary failed twice ({'; '.join(failures)}): it may be too weak to summarize"
        return await self._run(call, fallback_summary, fold, target, why), f"fallback (extractive; {why})", gate

    async def recall(self, args: Args, call: ToolCall) -> dict[str, Any]:
        text = args.str("query", "", max_len=2000) or ""
        max_tokens = args.int("max_tokens", self._budget(call.session_id), lo=50, hi=1_000_000)
        return await self._run(call, self._recall, args.raw["session_id"], call.namespace, text, max_tokens)

    def _recall(self, session_id: Any, namespace: str, text: str, max_tokens: int) -> dict[str, Any]:
        session = self._existing(session_id, namespace)
        active = session.active()
        query = Query.of(text)
        out: dict[str, Any] = {"session_id": session.id, "pinned": [], "matches": []}
        used = 0
        pinned_matched = False
        for e in (e for e in active if e.pinned):  # pinned first, but never more than half of the budget
            if used + e.tokens > max_tokens // 2:
                out.setdefault("left_out", {})["pinned"] = sum(e.pinned for e in active) - len(out["pinned"])
                break
            view = e.view()
            if query and query.matches(e.text):
                view["matches_query"] = pinned_matched = True
            out["pinned"].append(view)
            used += e.tokens
        found: list[Entry] = []
        if query:
            hits = self._recall_index(namespace).search(session, text, 200)
            position = {e.id: i for i, e in enumerate(active)}
            n = max(1, len(active) - 1)
            scored = sorted(
                (
                    (score * (1 + RECENCY_WEIGHT * position[key] / n), key)
                    for key, score in hits
                    if key in position and not session.entries[key].pinned
                ),
                reverse=True,
            )
            folded = [e for e in session.entries.values() if e.superseded_by]
            found = order(query, [session.entries[k] for _, k in scored] + folded_worth_showing(query, active, folded))
        if not found and not pinned_matched:  # no query (or nothing matched it): the most recent notes
            found = [e for e in reversed(active) if not e.pinned]
            if query:
                out["note"] = "nothing matched the query; showing the most recent notes"
        left = 0
        for entry in found:
            if used + entry.tokens > max_tokens:
                left += 1
                continue
            view = entry.view()
            if entry.superseded_by:
                view["from_folded_note"] = f"folded into {entry.superseded_by}"
            out["matches"].append(view)
            used += entry.tokens
        if left:
            out.setdefault("left_out", {})["matches"] = left
            out["hint"] = "raise max_tokens or use a narrower query to see the rest"
        out["tokens"] = used
        out["max_tokens"] = max_tokens
        return out
