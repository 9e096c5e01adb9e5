"""The documents plugin: its tools, settings and the SQLite store of documents and chunks."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.args import Args, ToolInputError
from gateway.handlers import guarded, integer, tool
from gateway.plugin import GatewayContext, Plugin, PluginTool, ToolCall
from gateway.services import shares
from gateway.services.responses import ID_PATTERN, StoreError, saved_kind
from gateway.services.storage import Storage
from gateway.services.storage_error import StorageError
from gateway.settings import expand_vars
from plugins.documents.chunker import chunk_batches, index_text, kind_of

log = logging.getLogger("plugins.documents")

T = TypeVar("T")

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_DIR_FILES = 2000
MAX_DIR_FOLDERS = 5000  # a folder ingest walks at most this many folders
MAX_JSON_AS_TEXT = 4 * 1024 * 1024


class IngestError(ValueError):
    pass


def _same_or_below(path: Path, root: Path) -> bool:
    if sys.platform == "win32":  # pragma: no cover
        return [p.lower() for p in path.parts[: len(root.parts)]] == [p.lower() for p in root.parts]
    return path.parts[: len(root.parts)] == root.parts


def resolve_ingest_path(raw: str, roots: list[Path], private: list[Path] | None = None) -> Path:
    """A real path below one of the roots, compared by whole segments after resolving symlinks, and
    never one of the gateway's own (`private`: the workspace, the config file, the tokens file)."""
    if not roots:
        raise IngestError(
            "doc_ingest reads files only below configured ingest roots, and none are configured. Pass the "
            "content as `text`, or start the gateway with --ingest-root /absolute/dir (or CTX_INGEST_ROOTS, "
            "or ingest_roots = [...] under [plugins.documents] in the config)."
        )
    if "\x00" in raw:
        raise IngestError("file_path contains a NUL byte")
    candidate = Path(os.path.expanduser(raw))
    if ".." in candidate.parts:
        raise IngestError("file_path may not contain '..'; give the path as it is")
    if not candidate.is_absolute():
        candidate = roots[0] / candidate
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    try:
        real = Path(os.path.realpath(candidate, strict=True))
    except OSError:
        raise IngestError(f"{raw} does not exist") from None
    if not any(_same_or_below(real, root) for root in real_roots):
        allowed = ", ".join(str(r) for r in real_roots)
        raise IngestError(f"{raw} resolves to {real}, which is outside the ingest roots ({allowed})")
    for own in private or []:
        if _same_or_below(real, own):
            what = (
                "workspace, which holds every caller's notes, documents and results"
                if own.is_dir()
                else "config or tokens file"
            )
            raise IngestError(f"{raw} is in the gateway's own {what} ({own}); it is never ingested")
    mode = os.stat(real).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise IngestError(f"{raw} is not a regular file (device, pipe or socket); only text files can be ingested")
    return real


def read_text_file(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise IngestError(f"{path.name} is {size // 2**20} MB; the limit is {MAX_FILE_BYTES // 2**20} MB per file")
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise IngestError(
            f"{path.name} is a binary file; only UTF-8 text can be ingested (this is not a PDF or Office extractor)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IngestError(
            f"{path.name} is not UTF-8 text (invalid byte at offset {exc.start}); convert it to UTF-8 first"
        ) from None


@dataclass(frozen=True)
class Statements:
    """The store's statements in one engine's words (its placeholders)."""

    get: str
    add_chunk: str
    add_doc: str
    forget_chunks: str
    forget_doc: str
    chunks: str


def _statements(mark: str) -> Statements:
    return Statements(
        get=f"SELECT doc_id, title, source, sha, kind, chunks, tokens, bytes, outline FROM docs WHERE doc_id = {mark}",
        add_chunk=f"INSERT INTO chunks VALUES ({', '.join([mark] * 7)})",
        add_doc=f"INSERT INTO docs VALUES ({', '.join([mark] * 10)})",
        forget_chunks=f"DELETE FROM chunks WHERE doc_id = {mark}",
        forget_doc=f"DELETE FROM docs WHERE doc_id = {mark}",
        chunks=f"SELECT idx, heading, text, tokens, part FROM chunks WHERE doc_id = {mark} AND idx BETWEEN {mark} "
        f"AND {mark} ORDER BY idx",
    )


STATEMENTS = {"sqlite": _statements("?"), "postgres": _statements("%s")}


class DocumentStore:
    """Documents and chunks in one SQLite file (or one PostgreSQL schema): metadata, chunk text, and the
    full-text index."""

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS docs (doc_id TEXT PRIMARY KEY, title TEXT, source TEXT, sha TEXT, kind TEXT,
            chunks INTEGER, tokens INTEGER, bytes INTEGER, created {time}, outline TEXT);
        CREATE TABLE IF NOT EXISTS chunks (doc_id TEXT, idx INTEGER, heading TEXT, text TEXT, tokens INTEGER,
            line INTEGER, part TEXT, PRIMARY KEY (doc_id, idx));
    """
    TIME: ClassVar[dict[str, str]] = {"sqlite": "REAL", "postgres": "DOUBLE PRECISION"}  # PostgreSQL's REAL has 4 bytes

    def __init__(self, path: Path, storage: Storage | None = None, namespace: str = ""):
        """`path`: the SQLite file; `storage` may put the store on PostgreSQL instead."""
        storage = storage or Storage()
        schema = self.SCHEMA.format(time=self.TIME["postgres" if storage.shared else "sqlite"])
        self.index = storage.search_index(path, "documents", namespace, "chunk_index", ("doc", "idx"), schema)
        self.sql = STATEMENTS[self.index.engine]
        self.db = self.index.db
        self.lock = self.index.lock
        self.damaged_note = ""
        if self.index.recovered_from is not None:
            self.damaged_note = (
                f"the documents index was damaged and moved to {self.index.recovered_from.name}; documents "
                "ingested before must be ingested again (doc_ingest)"
            )

    def get(self, doc_id: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(self.sql.get, (doc_id,)).fetchone()
        if row is None:
            return None
        keys = ("doc_id", "title", "source", "sha", "kind", "chunks", "tokens", "bytes", "outline")
        out = dict(zip(keys, row, strict=True))
        out["outline"] = json.loads(out["outline"] or "[]")
        return out

    def put(self, doc_id: str, title: str, source: str, text: str, kind: str) -> dict[str, Any]:
        sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        existing = self.get(doc_id)
        if existing and existing["sha"] == sha:
            return existing | {"unchanged": True}
        outline: list[str] = []
        chunks = tokens = 0
        # made before the store is locked, so searches go on meanwhile; a large document comes in two
        # batches, and the first is stored while the second is still being made
        batches = chunk_batches(text, kind)
        first = next(batches)
        # keyed by the document: another ingest of it (another replica's too) commits first, and is seen
        with self.lock, self.index.transaction(bulk=True, key=doc_id):
            existing = self.get(doc_id)
            if existing and existing["sha"] == sha:
                return existing | {"unchanged": True}
            self.forget(doc_id)
            for batch in itertools.chain([first], batches):
                if batch is None:  # start over (see `chunk_batches`)
                    self.forget(doc_id)
                    outline, chunks, tokens = [], 0, 0
                    continue
                made, extras = batch
                self.db.executemany(
                    self.sql.add_chunk,
                    ((doc_id, chunks + i, c.heading, c.text, c.tokens, c.line, c.part) for i, c in enumerate(made)),
                )
                self.index.insert(
                    (f"{doc_id}:{chunks + i}", index_text(c), (doc_id, chunks + i), extra)
                    for i, (c, extra) in enumerate(zip(made, extras, strict=True))
                )
                for c in made:
                    if c.heading and c.heading not in outline and len(outline) < 40:
                        outline.append(c.heading)
                chunks += len(made)
                tokens += sum(c.tokens for c in made)
            self.db.execute(
                self.sql.add_doc,
                (
                    doc_id,
                    title,
                    source,
                    sha,
                    kind,
                    chunks,
                    tokens,
                    len(text),
                    time.time(),
                    json.dumps(outline, ensure_ascii=False),
                ),
            )
        return self.get(doc_id) | {"unchanged": False, "replaced": existing is not None}

    def forget(self, doc_id: str) -> bool:
        with self.lock:
            found = self.get(doc_id) is not None
            self.db.execute(self.sql.forget_chunks, (doc_id,))
            self.db.execute(self.sql.forget_doc, (doc_id,))
            self.index.delete({"doc": doc_id})
        return found

    def chunks(self, doc_id: str, start: int, end: int) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(self.sql.chunks, (doc_id, start, end)).fetchall()
        return [
            {"doc_id": doc_id, "index": i, "heading": h, "text": t, "tokens": n, **({"part": p} if p else {})}
            for i, h, t, n, p in rows
        ]

    def list(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(
                "SELECT doc_id, title, source, chunks, tokens FROM docs ORDER BY created DESC"
            ).fetchall()
        return [dict(zip(("doc_id", "title", "source", "chunks", "tokens"), r, strict=True)) for r in rows]


class DocumentsSettings(BaseModel):
    """`[plugins.documents]`"""

    model_config = ConfigDict(extra="forbid")
    ingest_roots: list[Path] = Field(default_factory=list)  # doc_ingest may read only below these

    @field_validator("ingest_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):  # CTX_INGEST_ROOTS="a:b" (os.pathsep) or a JSON list
            value = json.loads(value) if value.startswith("[") else [v for v in value.split(os.pathsep) if v]
        return [Path(os.path.expanduser(str(v))) for v in value]


class DocumentsPlugin(Plugin):
    name = "documents"
    order = 300
    settings_model = DocumentsSettings

    def __init__(self) -> None:
        self.ctx: GatewayContext | None = None
        self.stores: dict[str, DocumentStore] = {}  # one per namespace
        self._opening = threading.Lock()
        self.settings = DocumentsSettings()

    async def start(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        await shares.store_pool().run("", self._store, "")  # a damaged index is found (and moved aside) at start

    async def stop(self) -> None:
        for store in self.stores.values():
            store.index.close()

    def status(self, session_id: str) -> dict[str, Any]:
        notes = [f"{ns or 'default'}: {store.damaged_note}" for ns, store in self.stores.items() if store.damaged_note]
        return {"warning": "; ".join(notes)} if notes else {}

    def tools(self) -> list[PluginTool]:
        doc = {"doc_id": {"type": "string"}}  # where ids come from is said once, in doc_search
        handle = lambda fn: guarded(fn, (IngestError, StoreError, StorageError))  # noqa: E731
        return [
            tool(
                "doc_ingest",
                "Split a document (file_path under the ingest roots, a file or a folder of text files; or text) "
                "into searchable chunks by heading; unchanged files re-ingest instantly.",
                handle(self.ingest),
                {"file_path": {"type": "string"}, "text": {"type": "string"}, "title": {"type": "string"}},
            ),
            tool(
                "doc_search",
                "Chunks of ingested documents that best match query, within max_tokens.",
                handle(self.search),
                {
                    "query": {"type": "string"},
                    "doc_id": doc["doc_id"] | {"description": "from doc_ingest/doc_list, or a resp_ id"},
                    "limit": integer(default=5),
                    "max_tokens": integer("default: half the budget"),
                },
                ["query"],
            ),
            tool(
                "doc_window",
                "Read consecutive chunks start..end of a document.",
                handle(self.window),
                {**doc, "start": integer("from 0"), "end": integer("default: start")},
                ["doc_id", "start"],
            ),
            tool("doc_list", "List ingested documents.", handle(self.list)),
            tool("doc_forget", "Remove an ingested document and its chunks.", handle(self.forget), doc, ["doc_id"]),
        ]

    def _budget(self, session_id: str | None = None) -> int:
        assert self.ctx is not None
        return self.ctx.window.budget(session_id)

    def _store(self, namespace: str) -> DocumentStore:
        assert self.ctx is not None, "documents plugin not started"
        path = self.ctx.namespace_dir(namespace) / "documents" / "index.sqlite"
        with self._opening:  # store threads: one store per namespace
            return self._open(namespace, path)

    def _open(self, namespace: str, path: Path) -> DocumentStore:
        assert self.ctx is not None
        store = self.stores.get(namespace)
        if store is not None and not self.ctx.storage.shared and not path.exists():
            # its folder was removed under it: writes would go to an unlinked file and vanish at restart
            log.warning("%s was removed while the gateway ran; the documents index starts afresh", path)
            store.index.close()
            store = None
        if store is None:
            store = self.stores[namespace] = DocumentStore(path, self.ctx.storage, namespace)
        return store

    # -- ingest ----------------------------------------------------------------------------------

    async def ingest(self, args: Args, call: ToolCall) -> dict[str, Any]:
        assert self.ctx is not None
        file_path = args.str("file_path")
        text = args.str("text", max_len=MAX_FILE_BYTES)
        title = args.str("title", max_len=300)
        if (file_path is None) == (text is None):
            raise ToolInputError("doc_ingest: give either file_path or text")
        if file_path is not None and not file_path.strip():
            raise ToolInputError("doc_ingest: `file_path` is empty; give a file or folder below an ingest root")
        if text is not None:
            if not text.strip():
                raise ToolInputError("doc_ingest: `text` is empty")
            doc_id = "doc_" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
            name = title or text.strip().splitlines()[0][:80]
            kind = kind_of(title or "", text)
            result = await self._ingesting(call, self._put, call.namespace, doc_id, name, "inline", text, kind)
            return self._ingested(result)
        roots = self.settings.ingest_roots
        real, folder = await self._run(call, self._resolved, file_path, roots)
        if folder:
            return await self._ingest_dir(real, roots, call)
        result = await self._ingesting(call, self._put_file, call.namespace, real, title or real.name)
        return self._ingested(result)

    async def _run(self, call: ToolCall, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` off the event loop, within the caller's share of the store threads."""
        return await shares.store_pool().run(call.namespace, fn, *args)

    async def _ingesting(self, call: ToolCall, fn: Callable[..., T], *args: Any) -> T:
        """An ingest's chunking and indexing: one at a time per caller (`shares.ingest_pool`), then on
        the store threads like every other document call."""
        async with shares.ingest_pool().slot(call.namespace):
            return await self._run(call, fn, *args)

    def _put(self, namespace: str, doc_id: str, title: str, source: str, text: str, kind: str) -> dict[str, Any]:
        return self._store(namespace).put(doc_id, title, source, text, kind)

    def _put_file(self, namespace: str, real: Path, title: str) -> dict[str, Any]:
        body = read_text_file(real)
        return self._put(namespace, _file_id(real), title, str(real), body, kind_of(real.name, body))

    def _resolved(self, file_path: str, roots: list[Path]) -> tuple[Path, bool]:
        """The path asked for, checked against the roots, and whether it is a folder (file system calls:
        off the loop)."""
        real = resolve_ingest_path(file_path, roots, self._private())
        return real, real.is_dir()

    def _files_below(self, folder: Path, private: list[Path]) -> list[Path]:
        """The files a folder ingest reads (hidden ones and the gateway's own paths left out): a walk of
        the file system, so it runs off the loop, and stops at MAX_DIR_FILES files or MAX_DIR_FOLDERS
        folders (a tree of empty folders is no cheaper to walk than one of files)."""
        files: list[Path] = []
        for folders, (base, dirs, names) in enumerate(os.walk(folder, followlinks=False), 1):
            if len(files) > MAX_DIR_FILES or folders > MAX_DIR_FOLDERS:
                raise IngestError(
                    f"{folder} holds more than {MAX_DIR_FILES} files or {MAX_DIR_FOLDERS} folders; "
                    "ingest a smaller folder"
                )
            dirs[:] = sorted(
                d
                for d in dirs
                if not d.startswith(".")
                and not any(_same_or_below(Path(os.path.realpath(Path(base) / d)), p) for p in private)
            )
            files.extend(Path(base) / name for name in sorted(names) if not name.startswith("."))
        if len(files) > MAX_DIR_FILES:
            raise IngestError(f"{folder} holds more than {MAX_DIR_FILES} files; ingest a smaller folder")
        return files

    async def _ingest_dir(self, folder: Path, roots: list[Path], call: ToolCall) -> dict[str, Any]:
        private = self._private()
        files = await self._run(call, self._files_below, folder, private)
        done, skipped = [], []
        for i, path in enumerate(files):
            await call.report_progress(i, len(files), f"ingesting {path.name}")
            try:
                real = await self._run(call, resolve_ingest_path, str(path), roots, private)
                result = await self._ingesting(call, self._put_file, call.namespace, real, real.name)
            except IngestError as exc:
                skipped.append({"file": str(path.relative_to(folder)), "reason": str(exc)})
                continue
            done.append(
                {
                    "doc_id": result["doc_id"],
                    "file": str(path.relative_to(folder)),
                    "chunks": result["chunks"],
                    "unchanged": result["unchanged"],
                }
            )
        await call.report_progress(len(files), len(files), "done")
        return {"folder": str(folder), "ingested": done, "skipped": skipped, "chunks": sum(d["chunks"] for d in done)}

    def _private(self) -> list[Path]:
        """The gateway's own paths, never ingested: the workspace (every namespace's data), the config file
        and the tokens file (bearer tokens), resolved as the paths asked for are."""
        assert self.ctx is not None
        settings = self.ctx.settings
        own = [settings.gateway.workspace, settings.config_path]
        if settings.auth.tokens_file:
            own.append(Path(os.path.expanduser(expand_vars(settings.auth.tokens_file))))
        return [Path(os.path.realpath(p)) for p in own if p is not None]

    def _ingested(self, result: dict[str, Any]) -> dict[str, Any]:
        return {
            "doc_id": result["doc_id"],
            "title": result["title"],
            "chunks": result["chunks"],
            "tokens": result["tokens"],
            "unchanged": result.get("unchanged", False),
            "replaced": result.get("replaced", False),
            "outline": result["outline"][:25],
            "next": f"doc_search(query='...', doc_id='{result['doc_id']}') or doc_window(doc_id="
            f"'{result['doc_id']}', start=0)",
        }

    def _ensure(self, doc_id: str, namespace: str) -> dict[str, Any]:
        """A known document, or an offloaded response ingested on first use."""
        found = self._store(namespace).get(doc_id)
        if found is not None:
            return found
        if ID_PATTERN.match(doc_id):
            assert self.ctx is not None
            path = self.ctx.responses_for(namespace).resolve(doc_id)
            if saved_kind(path) == "json":
                if path.stat().st_size > MAX_JSON_AS_TEXT:
                    raise IngestError(f"{doc_id} is a large JSON result; use response_search / response_slice on it")
                text = json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=1, ensure_ascii=False)
                kind = "code"
            elif saved_kind(path) == "text":
                text = read_text_file(path)
                kind = kind_of(path.name, text)
            else:
                raise IngestError(f"{doc_id} is binary; it cannot be read as a document")
            return self._store(namespace).put(doc_id, path.name, str(path), text, kind)
        known = ", ".join(d["doc_id"] for d in self._store(namespace).list()[:10]) or "none yet"
        raise IngestError(f"unknown doc_id {doc_id!r}; known documents: {known}")

    # -- reading -----------------------------------------------------------------------------------

    async def search(self, args: Args, call: ToolCall) -> dict[str, Any]:
        query = args.str("query", required=True, max_len=2000)
        doc_id = args.str("doc_id")
        limit = args.int("limit", 5, lo=1, hi=50)
        max_tokens = args.int("max_tokens", self._budget(call.session_id) // 2, lo=50, hi=1_000_000)
        hits, results, used, left = await self._run(call, self._find, call.namespace, query, doc_id, limit, max_tokens)
        out: dict[str, Any] = {"query": query, "results": results, "tokens": used}
        if not hits:
            out["note"] = (
                "no chunk matched; try other words, or doc_window to read in order"
                if any(ch.isalnum() for ch in query)
                else "the query has no searchable words"
            )
        if left:
            out["left_out"] = left
            out["hint"] = "raise max_tokens or limit, or read around a hit with doc_window"
        return out

    def _find(
        self, namespace: str, query: str, doc_id: str | None, limit: int, max_tokens: int
    ) -> tuple[list[Any], list[dict[str, Any]], int, int]:
        """The hits of a search, the chunks shown of them (packed into `max_tokens`), their tokens, and
        how many were left out."""
        store = self._store(namespace)
        if doc_id:
            self._ensure(doc_id, namespace)
        hits = store.index.search(query, limit * 3, {"doc": doc_id} if doc_id else None)
        results: list[dict[str, Any]] = []
        used = left = 0
        for hit in hits:
            if len(results) >= limit:
                left += 1
                continue
            did, _, idx = hit.key.rpartition(":")
            chunk = store.chunks(did, int(idx), int(idx))[0]
            if used + chunk["tokens"] > max_tokens:
                left += 1
                continue
            results.append(chunk | {"score": round(hit.score, 3)})
            used += chunk["tokens"]
        return hits, results, used, left

    async def window(self, args: Args, call: ToolCall) -> dict[str, Any]:
        doc_id = args.str("doc_id", required=True)
        start = args.int("start", required=True, lo=0)
        end = args.int("end", start, lo=0)
        if end < start:
            raise ToolInputError(f"doc_window: end {end} is before start {start}")
        total, chunks = await self._run(call, self._window, call.namespace, doc_id, start, end)
        if start >= total:
            raise ToolInputError(
                f"doc_window: {doc_id} has {total} chunks (0..{total - 1}); start {start} is past the end"
            )
        budget = self._budget(call.session_id) // 2
        shown, used = [], 0
        for chunk in chunks:
            if used + chunk["tokens"] > budget and shown:
                break
            shown.append(chunk)
            used += chunk["tokens"]
        last = shown[-1]["index"]
        out: dict[str, Any] = {
            "doc_id": doc_id,
            "total_chunks": total,
            "chunks": shown,
            "next": last + 1 if last + 1 < total else None,
        }
        if last < min(end, total - 1):
            out["note"] = f"stopped at chunk {last} to stay within {budget} tokens; continue with start={last + 1}"
        return out

    def _window(self, namespace: str, doc_id: str, start: int, end: int) -> tuple[int, list[dict[str, Any]]]:
        """A document's chunk count, and its chunks start..end (none when start is past its end)."""
        total = self._ensure(doc_id, namespace)["chunks"]
        return total, self._store(namespace).chunks(doc_id, start, min(end, total - 1)) if start < total else []

    async def list(self, args: Args, call: ToolCall) -> dict[str, Any]:
        store = await self._run(call, self._store, call.namespace)
        out: dict[str, Any] = {"documents": await self._run(call, store.list)}
        if store.damaged_note:
            out["note"] = store.damaged_note
        return out

    async def forget(self, args: Args, call: ToolCall) -> dict[str, Any]:
        doc_id = args.str("doc_id", required=True)
        if not await self._run(call, lambda: self._store(call.namespace).forget(doc_id)):
            raise ToolInputError(f"doc_forget: unknown doc_id {doc_id!r}")
        return {"forgotten": doc_id}


def _file_id(path: Path) -> str:
    return "doc_" + hashlib.sha1(str(path).encode("utf-8", "surrogatepass")).hexdigest()[:10]
