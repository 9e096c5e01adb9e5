"""Session memory: notes that live outside the context window and come back when needed.

One append-only JSONL log per session under `{workspace}/sessions/` (`tail -f` shows it grow);
recall by BM25 x recency over an FTS5 index rebuilt from the logs; compaction folds old notes
into a summary (model endpoint, or a fact-keeping fallback) without deleting anything.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types

from gateway.args import Args
from gateway.handlers import guarded, integer, tool
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.services.model_endpoint import LLMUnavailable
from gateway.services.storage import Logs
from gateway.services.storage_error import StorageError
from gateway.services.tokens import estimate_tokens
from plugins.memory.gate import check, with_coverage
from plugins.memory.guide import GUIDE
from plugins.memory.recall import Query, folded_worth_showing, order
from plugins.memory.sessions import AlreadyFolded, Entry, RecallIndex, Session, SessionError, check_session_id
from plugins.memory.summary import INSTRUCTION, STRICT_INSTRUCTION, fallback_summary

log = logging.getLogger("plugins.memory")

NEAR_BUDGET = 0.8
RECENCY_WEIGHT = 0.25
MAX_TEXT = 200_000


SID = {"type": "string", "description": "your name for this memory, e.g. 'billing-refactor'"}


class MemoryPlugin(Plugin):
    name = "memory"
    order = 200

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.sessions: dict[tuple[str, str], Session] = {}  # (namespace, session id)
        self.recall_indexes: dict[str, RecallIndex] = {}  # one per namespace
        self.logs: dict[str, Logs] = {}  # one per namespace: the sessions' logs
        self._locks: dict[str, anyio.Lock] = {}

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
        if namespace not in self.logs:
            assert self.ctx is not None
            self.logs[namespace] = self.ctx.storage.logs(self._folder(namespace), "memory", namespace)
        return self.logs[namespace]

    def _session(self, session_id: Any, namespace: str = "") -> Session:
        sid = check_session_id(session_id)
        key = (namespace, sid)
        if key not in self.sessions:
            self.sessions[key] = Session(sid, self._logs(namespace).log(sid))
        session = self.sessions[key]
        session.refresh()
        return session

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

    def _usage(self, session: Session, session_id: str) -> dict[str, Any]:
        used, budget = session.used_tokens(), self._budget(session_id)
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
                sid,
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
                "Memory size vs budget, compaction state, and the gateway's context estimate.",
                self._tool(self.status_tool),
                sid,
                ["session_id"],
            ),
            tool(
                "context_compact",
                "Fold older notes into one summary (pinned and the newest keep_recent stay). "
                "dry_run shows what would fold.",
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
                "Bring back pinned notes and the notes that best match a query, within max_tokens.",
                self._tool(self.recall),
                sid | {"query": {"type": "string"}, "max_tokens": integer("default: the budget")},
                ["session_id"],
            ),
            tool("context_guide", "How to use these tools together; read once.", self._guide),
        ]

    def _tool(self, fn: Any) -> Any:
        async def locked(args: Args, call: ToolCall) -> dict[str, Any]:
            sid = check_session_id(args.raw.get("session_id"))
            async with self._locks.setdefault(f"{call.namespace}/{sid}", anyio.Lock()):  # one session: one at a time
                return await fn(args, call)

        return guarded(locked, (SessionError, StorageError))

    async def _guide(self, call: ToolCall) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text=GUIDE)])

    async def open(self, args: Args, call: ToolCall) -> dict[str, Any]:
        session = await anyio.to_thread.run_sync(self._session, args.raw["session_id"], call.namespace)
        created = await anyio.to_thread.run_sync(self._create, session)
        active = session.active()
        pinned = [e.view() for e in active if e.pinned]
        return {
            "session_id": session.id,
            "created": created,
            "entries": len(active),
            "pinned": pinned,
            "last_compaction": session.last_compaction,
            **self._usage(session, call.session_id),
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
        session = await anyio.to_thread.run_sync(self._session, args.raw["session_id"], call.namespace)
        entry = await anyio.to_thread.run_sync(session.append_entry, text, pinned)
        return {"id": entry.id, "tokens": entry.tokens, "pinned": pinned, **self._usage(session, call.session_id)}

    async def status_tool(self, args: Args, call: ToolCall) -> dict[str, Any]:
        assert self.ctx is not None
        session = await anyio.to_thread.run_sync(self._session, args.raw["session_id"], call.namespace)
        unknown = await anyio.to_thread.run_sync(
            lambda: None if session.exists else self._unknown(session.id, call.namespace)
        )
        active = session.active()
        out: dict[str, Any] = {
            "session_id": session.id,
            # the gateway's figures are worth asking for before any note: an unknown name is said, not refused
            **({"note": unknown} if unknown else {}),
            **self._usage(session, call.session_id),
            "entries": len(active),
            "pinned": sum(e.pinned for e in active),
            "superseded": len(session.entries) - len(active),
            "last_compaction": session.last_compaction,
            "token_counts": self.ctx.llm.describe(),
            "window": self.ctx.window.for_session(call.session_id).describe(),
        }
        figures = {k: v for k, v in self.ctx.status(call.session_id).items() if k != self.name}
        if figures:
            out["gateway"] = figures
        return out

    async def compact(self, args: Args, call: ToolCall) -> dict[str, Any]:
        assert self.ctx is not None
        keep_recent = args.int("keep_recent", 5, lo=0, hi=10_000)
        target = args.int("target_tokens", max(200, self._budget(call.session_id) // 4), lo=50, hi=100_000)
        dry_run = args.bool("dry_run", False)
        session = await anyio.to_thread.run_sync(self._existing, args.raw["session_id"], call.namespace)
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
            return {
                "dry_run": True,
                "would_fold": [e.id for e in fold],
                "tokens_folded": sum(e.tokens for e in fold),
                "kept": [e.id for e in active if e not in fold],
            }
        text = "\n\n".join(f"[{e.id}] {e.text}" for e in fold)
        summary, writer, gate = await self._summarize(text, fold, target)
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
            entry = await anyio.to_thread.run_sync(
                session.append_compaction, summary, fold, writer.split(" (")[0], gate
            )
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

    async def _summarize(self, text: str, fold: list[Entry], target: int) -> tuple[str, str, str]:
        """(summary, who wrote it and why, the gate's verdict). The model's summary must pass the gate; a failed
        one is retried once with a stricter prompt, then the extractive fallback is kept. Either way the fact
        lines it lacks are added verbatim while they fit, and the notes left out are named."""
        assert self.ctx is not None
        folded = sum(e.tokens for e in fold)
        failures: list[str] = []
        try:
            for instruction in (INSTRUCTION, STRICT_INSTRUCTION):
                verdict = check(await self.ctx.llm.summarize(text, instruction, max_tokens=target), fold, target)
                if not verdict.failed:
                    model = self.ctx.llm.model or self.ctx.llm.base_url
                    gate = "passed" if not failures else f"passed on the retry (first: {failures[0]})"
                    room = min(folded * 3 // 4, max(2 * target, estimate_tokens(verdict.summary) + target))
                    return with_coverage(verdict.summary, fold, room), f"model ({model})", gate
                failures.append(verdict.failed)
        except LLMUnavailable as exc:
            why = "the model endpoint was not available"
            return fallback_summary(fold, target, why), f"fallback (extractive; {why}: {exc})", "-"
        rule = re.split(r":| \(", failures[-1])[0]  # the rule, without the summary's words it quotes
        why = f"the model's summary failed the gate twice: {rule}"
        gate = f"the model's summary failed twice ({'; '.join(failures)}): it may be too weak to summarize"
        return fallback_summary(fold, target, why), f"fallback (extractive; {why})", gate

    async def recall(self, args: Args, call: ToolCall) -> dict[str, Any]:
        text = args.str("query", "", max_len=2000) or ""
        max_tokens = args.int("max_tokens", self._budget(call.session_id), lo=50, hi=1_000_000)
        session = await anyio.to_thread.run_sync(self._existing, args.raw["session_id"], call.namespace)
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
            hits = await anyio.to_thread.run_sync(self._recall_index(call.namespace).search, session, text, 200)
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
