"""Where the stores keep what they keep: SQLite files in the workspace (the default, one gateway) or
PostgreSQL (`[storage] backend = "postgres"`, several replicas sharing it; `postgres.py`).

A store asks for a search index (`search_index`) or for its append-only logs (`logs`) by its name
and namespace, and gets the same calls from either backend. Offloaded results stay files in the
workspace on both: replicas share that folder.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.services.jsonl_log import JsonlLog
from gateway.services.search_index import SearchIndex
from gateway.services.storage_error import StorageError

if TYPE_CHECKING:
    from gateway.settings import StorageSettings


def _postgres() -> Any:
    """The PostgreSQL backend's module (it imports psycopg, an extra of its own)."""
    try:
        import gateway.services.postgres as postgres
    except ImportError as exc:
        raise StorageError(
            f'[storage] backend = "postgres" needs psycopg ({exc}): install the extra `postgres` '
            '(pip install -e ".[postgres]" in a checkout) or pip install "psycopg[binary]" psycopg-pool'
        ) from None
    return postgres


class Logs:
    """The append-only logs of one store of one namespace, by name (a memory session each)."""

    def __init__(self, folder: Path, pg: tuple[Any, threading.RLock] | None = None):
        self.folder = folder
        self._pg = pg

    def log(self, name: str) -> Any:
        """A `JsonlLog` (`<folder>/<name>.jsonl`) or a `postgres.PgLog`: append, read, exists, touch, where."""
        if self._pg is None:
            return JsonlLog(self.folder / f"{name}.jsonl")
        return _postgres().PgLog(*self._pg, name)

    def close(self) -> None:
        if self._pg is not None:
            self._pg[0].close()

    def names(self) -> list[str]:
        if self._pg is None:
            return sorted(p.stem for p in self.folder.glob("*.jsonl"))
        return _postgres().names(*self._pg)


class Storage:
    """The backend the settings chose. Stores of the SQLite backend are files below `folder`s the caller
    gives; on PostgreSQL each (store, namespace) is a schema of its own."""

    def __init__(self, settings: StorageSettings | None = None):
        self.backend = settings.backend if settings is not None else "sqlite"
        self.dsn = settings.dsn if settings is not None else ""

    @property
    def shared(self) -> bool:
        return self.backend == "postgres"

    def search_index(
        self, path: Path, store: str, namespace: str, table: str, columns: Sequence[str] = (), schema: str = ""
    ) -> Any:
        """A `SearchIndex` in the SQLite file `path`, or a `postgres.PgSearchIndex` (the same calls)."""
        if not self.shared:
            return SearchIndex(path, table=table, columns=columns, schema=schema)
        postgres = _postgres()
        return postgres.PgSearchIndex(self.dsn, postgres.schema_name(store, namespace), table, columns, schema)

    def logs(self, folder: Path, store: str, namespace: str) -> Logs:
        if not self.shared:
            folder.mkdir(parents=True, exist_ok=True)
            return Logs(folder)
        db = self.database(store, namespace)
        db.executescript(_postgres().PgLog.schema())
        return Logs(folder, (db, threading.RLock()))

    def database(self, store: str, namespace: str = "") -> Any:
        """A `postgres.PgDatabase` on the schema of one store (PostgreSQL backend only): its statements are
        PostgreSQL's (`%s` placeholders)."""
        postgres = _postgres()
        return postgres.PgDatabase(self.dsn, postgres.schema_name(store, namespace))

    def describe(self) -> str:
        """The backend in a few words, without reaching it (the dsn's password left out)."""
        return f"postgres at {_redacted(self.dsn)}" if self.shared else "sqlite (files in the workspace)"

    def check(self) -> str:
        """`describe` with the server's version, for `inspect`; raises `StorageError` when it cannot be used."""
        if not self.shared:
            return self.describe()
        with _postgres().connect(self.dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        return f"postgres {version[0] if version else '?'} at {_redacted(self.dsn)}"


def _redacted(dsn: str) -> str:
    """The dsn without its password."""
    import re

    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", re.sub(r"password=\S+", "password=***", dsn))
