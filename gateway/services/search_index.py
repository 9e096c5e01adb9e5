"""Keyword search for memory, documents and the tool catalog: SQLite FTS5 with BM25.

Each indexed text has two columns: `body` (the text, identifiers kept whole) and `extra`
(identifier splits: `getUserName` -> `get user name`, and CJK bigrams: `세션을` -> `세션 션을`),
so that "user name" finds `getUserName` and "세션" finds "세션을". Queries are reduced to
quoted terms, so FTS5 syntax in user input can never raise an error.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any

from gateway.services.files import move_aside
from gateway.services.text import CJK_CLASS

log = logging.getLogger("gateway.search_index")

_CJK = CJK_CLASS
_WORD = re.compile(rf"[{_CJK}]+|[^\W_]+(?:[_\-.][^\W_]+)*", re.UNICODE)
_CJK_RUN = re.compile(f"^[{_CJK}]+$")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_SEPARATORS = re.compile(r"[_\-./\\:]+")
MAX_QUERY_TERMS = 32
# FTS5 writes its pending terms out as a new segment (later merged) whenever they pass this many
# bytes; SQLite's 1 MB default makes a 30 MB ingest build and merge ~60 segments (~20 % of its inserts)
HASH_BYTES = 16 * 2**20
# a bulk commit's settings (`SearchIndex.transaction`): no sync, no checkpoint inside the commit
_BULK_SETTINGS = {"synchronous": 1, "wal_autocheckpoint": 0}  # 1 = NORMAL


def identifier_parts(word: str) -> list[str]:
    """`getUserName` -> get, user, name; `snake_case-name.v2` -> snake, case, name, v2."""
    parts: list[str] = []
    for piece in _SEPARATORS.split(word):
        if not piece:
            continue
        split = _CAMEL.findall(piece)
        parts.extend(s.lower() for s in (split if len(split) > 1 else [piece]))
    return parts


def cjk_bigrams(run: str) -> list[str]:
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def words(text: str) -> list[str]:
    return _WORD.findall(text)


_SPLITTABLE = re.compile(
    rf"[{_CJK}]+"  # CJK runs: bigrams
    r"|[A-Za-z0-9]*[a-z0-9][A-Z][A-Za-z0-9]*"  # camelCase / PascalCase humps
    r"|[A-Z]{2,}[a-z][A-Za-z0-9]*"  # HTTPServer
    r"|\w*[_\-./\\:][\w\-./\\:]*\w"  # snake_case, kebab-case, dotted.names, paths
)


def expand(text: str) -> str:
    """The `extra` column: identifier splits and CJK bigrams. Each distinct whitespace-separated token
    is looked at once per process (`_expanded`), and the text is mapped through what was found without
    a Python loop per token: a document repeats its words, and the per-token work was most of an
    ingest's time after the parse."""
    tokens = text.split()
    known = _EXPANDED
    if len(known) > EXPANDED_KEEP:  # bounded: a stream of distinct tokens starts afresh
        known.clear()
    for token in set(tokens).difference(known):
        known[token] = _expanded(token)
    return " ".join(chain.from_iterable(filter(None, map(known.__getitem__, tokens))))


EXPANDED_KEEP = 500_000  # tokens remembered (~60 MB at most)
_EXPANDED: dict[str, tuple[str, ...]] = {}


def _expanded(token: str) -> tuple[str, ...]:
    """What one token adds to the `extra` column (nothing for a plain word, most of any text)."""
    if token.isalpha() and token.isascii() and (token.islower() or token.isupper() or token.istitle()):
        return ()
    out: list[str] = []
    for word in _SPLITTABLE.findall(token):
        if _CJK_RUN.match(word):
            out.extend(cjk_bigrams(word))
        else:
            parts = _word_parts(word)
            if len(parts) > 1:
                out.extend(parts)
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _word_parts(word: str) -> tuple[str, ...]:
    """`identifier_parts`, remembered: tokens differ more than the identifiers in them
    (`run_step_3('install`, `run_step_3('cache`), a third of `_expanded`'s time on generated code."""
    return tuple(identifier_parts(word))


def query_terms(query: str) -> list[str]:
    """Search terms of a free-text query: words, identifier parts, CJK bigrams. May be empty."""
    terms: list[str] = []
    for word in words(query):
        if _CJK_RUN.match(word):
            terms.extend(cjk_bigrams(word))
        else:
            terms.append(word.lower())
            parts = identifier_parts(word)
            if len(parts) > 1:
                terms.extend(parts)
    # identifier parts of one character ("v2" -> "v", "2") match almost everything: keep them only alone
    useful = [t for t in terms if len(t) > 1 or _CJK_RUN.match(t)] or terms
    return list(dict.fromkeys(t for t in useful if t))[:MAX_QUERY_TERMS]


def match_expression(terms: Sequence[str]) -> str:
    """FTS5 MATCH text: every term quoted (so nothing in it is syntax), OR-ed; BM25 ranks by coverage."""
    quoted = []
    for term in terms:
        safe = term.replace('"', '""')
        quoted.append(f'"{safe}"*' if _CJK_RUN.match(term) and len(term) == 1 else f'"{safe}"')
    return " OR ".join(quoted)


def _row(key: str, text: str, values: Sequence[object], extra: str | None = None) -> tuple[object, ...]:
    """One table row: key, the caller's columns, the text and its `extra` column (made here unless given)."""
    return (key, *values, text, expand(text) if extra is None else extra)


@dataclass
class Hit:
    key: str
    score: float  # higher is better


class IndexCalls:
    """What both search indexes (SQLite's `SearchIndex`, PostgreSQL's `PgSearchIndex`) do alike. A store
    that keeps tables of its own beside the index runs its statements on `db` in `engine`'s words."""

    engine: str  # "sqlite" or "postgres"
    table: str
    columns: list[str]
    lock: threading.RLock
    db: Any

    def condition(self, match: Mapping[str, object], mark: str) -> tuple[str, tuple[object, ...]]:
        """SQL that keeps the rows whose columns equal `match`'s values (every row when it is empty), with
        `mark` for each placeholder, and its parameters."""
        unknown = set(match) - {"key", *self.columns}
        if unknown:
            raise ValueError(f"no such column in {self.table}: {', '.join(sorted(unknown))}")
        if not match:
            return "TRUE", ()
        return " AND ".join(f"{column} = {mark}" for column in match), tuple(match.values())

    def transaction(self, bulk: bool = False, key: str = "") -> Any:
        """One transaction; with `key`, no other writer of the same key (another gateway's too) runs
        one at the same time, and what it committed before is seen in this one."""
        raise NotImplementedError

    def insert(self, rows: Iterable[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def add(self, rows: Iterable[tuple[str, str, Sequence[object]] | tuple[str, str, Sequence[object], str]]) -> None:
        """Rows of (key, text, extra column values), and optionally the text's `expand` when the caller
        made it already (documents do, in a worker process for large ones)."""
        with self.transaction():
            self.insert(rows)

    def settle(self) -> None:
        """Wait for the background work a large write started (benches measure what follows it)."""

    def delete(self, match: Mapping[str, object]) -> None:
        """The rows whose columns equal `match`'s values; every row when it is empty."""
        where, params = self.condition(match, "?")
        with self.lock:
            self.db.execute(f"DELETE FROM {self.table} WHERE {where}", params)


class SearchIndex(IndexCalls):
    """One FTS5 table in one SQLite file (or memory). Thread-safe; each call is short."""

    engine = "sqlite"

    def __init__(self, path: Path | str, table: str = "docs", columns: Sequence[str] = (), schema: str = ""):
        """`schema`: more SQL (tables of the caller's own) created in the same file."""
        self.table = table
        self.columns = list(columns)  # extra UNINDEXED columns stored with each row
        self.lock = threading.RLock()  # one connection, shared with callers that add tables of their own
        self.recovered_from: Path | None = None  # where a damaged file was moved before starting afresh
        self.path = str(path) if isinstance(path, Path) else None  # a file of its own (not memory)
        self._checkpointing: threading.Thread | None = None
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self._open(str(path), schema)
        except sqlite3.DatabaseError as exc:
            if not isinstance(path, Path):
                raise
            self.recovered_from = move_aside(path)
            log.warning(
                "%s could not be opened (%s): moved to %s and started afresh", path, exc, self.recovered_from.name
            )
            self.db = self._open(str(path), schema)

    def _open(self, path: str, schema: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA busy_timeout=5000")
            extra_cols = "".join(f", {c} UNINDEXED" for c in self.columns)
            db.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table} USING fts5(key UNINDEXED{extra_cols}, body, extra, "
                "tokenize = \"unicode61 remove_diacritics 2 tokenchars '_'\")"
            )
            if schema:
                db.executescript(schema)
            db.execute(f"SELECT count(*) FROM {self.table} LIMIT 1").fetchone()
            if db.execute(f"SELECT 1 FROM {self.table}_config WHERE k = 'hashsize'").fetchone() is None:
                db.execute(f"INSERT INTO {self.table} ({self.table}, rank) VALUES ('hashsize', ?)", (HASH_BYTES,))
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def insert(
        self, rows: Iterable[tuple[str, str, Sequence[object]] | tuple[str, str, Sequence[object], str]]
    ) -> None:
        """`add` inside the caller's `transaction`."""
        cols = ", ".join(["key", *self.columns, "body", "extra"])
        marks = ", ".join("?" * (len(self.columns) + 3))
        with self.lock:
            self.db.executemany(f"INSERT INTO {self.table} ({cols}) VALUES ({marks})", (_row(*row) for row in rows))

    @contextmanager
    def transaction(self, bulk: bool = False, key: str = "") -> Iterator[None]:
        """One transaction on the shared connection (its tables and the caller's), held under the lock;
        with `key`, it takes the file's write lock as it begins (another writer's commit comes first).

        `bulk`, for a large write of what can be made again (a document from its source): SQLite's
        COMMIT syncs the write-ahead log to disk and then copies it into the database file (a
        checkpoint), together about half as long again as the inserts of a large document. A bulk
        commit does neither: the checkpoint runs after it, in a thread of its own, and syncs the file
        then. What is committed is visible at once and survives the process either way; only a power
        loss in the moment before the checkpoint could roll it back."""
        with self.lock:
            if bulk:  # the safety level can be set only outside a transaction
                before = {name: self.db.execute(f"PRAGMA {name}").fetchone()[0] for name in _BULK_SETTINGS}
                for name, value in _BULK_SETTINGS.items():
                    self.db.execute(f"PRAGMA {name} = {value}")
            try:
                with self._begun("BEGIN IMMEDIATE" if key else "BEGIN"):
                    yield
            finally:
                if bulk:
                    for name, value in before.items():
                        self.db.execute(f"PRAGMA {name} = {int(value)}")
        if bulk:
            self._checkpoint_soon()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """A transaction no other writer of this file (another gateway's too) interleaves with: what is
        read in it is still true when it commits. `insert` and `delete`, not `add`, inside it."""
        with self.lock, self._begun("BEGIN IMMEDIATE"):
            yield

    @contextmanager
    def _begun(self, begin: str) -> Iterator[None]:
        self.db.execute(begin)
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise

    def _checkpoint_soon(self) -> None:
        if self.path is None or (self._checkpointing is not None and self._checkpointing.is_alive()):
            return
        self._checkpointing = threading.Thread(target=self._checkpoint, name="wal-checkpoint", daemon=True)
        self._checkpointing.start()

    def _checkpoint(self) -> None:
        """A passive checkpoint on a connection of its own: searches and writes go on meanwhile (what
        it cannot copy now, because a reader still needs it, the next commit's checkpoint copies)."""
        try:
            db = sqlite3.connect(self.path, timeout=5.0)
            try:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                db.close()
        except sqlite3.Error as exc:
            log.debug("checkpoint of %s after a large write: %s", self.path, exc)

    def search(self, query: str, limit: int = 10, match: Mapping[str, object] | None = None) -> list[Hit]:
        """The best `limit` rows for `query` by BM25, among those whose columns equal `match`'s values."""
        terms = query_terms(query)
        if not terms:
            return []
        where, params = self.condition(match or {}, "?")
        condition = f" AND {where}" if match else ""
        sql = (
            f"SELECT key, -bm25({self.table}, 0, {', '.join('0' for _ in self.columns) + ', ' if self.columns else ''}"
            f"1.0, 0.6) AS score FROM {self.table} WHERE {self.table} MATCH ?{condition} ORDER BY score DESC LIMIT ?"
        )
        with self.lock:
            rows = self.db.execute(sql, (match_expression(terms), *params, limit)).fetchall()
        return [Hit(key, score) for key, score in rows]

    def settle(self) -> None:
        """The checkpoint after a bulk commit, done."""
        if self._checkpointing is not None:
            self._checkpointing.join()

    def close(self) -> None:
        self.settle()
        with self.lock:
            self.db.close()
