"""Which loader makes the tables of a result, by its shape (run in the conversion's own process)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import plugins.offload.table_csv as table_csv
import plugins.offload.table_json as table_json
import plugins.offload.table_jsonl as table_jsonl
import plugins.offload.table_lines as table_lines
from plugins.offload.json_file import BrokenJSON
from plugins.offload.tables import Table

log = logging.getLogger("plugins.offload")


def load(
    conn: Any, result: Path, kind: str, scratch: Path, stop: threading.Event, candidates: list[Any] | None = None
) -> list[Table]:
    """Every table of the result. `candidates`: the JSON parts that are tables, when the caller knows them."""
    import duckdb

    tables: list[Table] = []
    if kind == "json":
        try:
            return table_json.load(conn, result, scratch, stop, candidates)
        except BrokenJSON:  # several JSON values, one a line: JSON Lines saved as .json
            if not table_jsonl.detect(result):
                raise
    if table_jsonl.detect(result):
        tables.append(table_jsonl.load(conn, result))
    elif (sep := table_csv.dialect(result)) is not None:
        try:
            tables.append(table_csv.load(conn, result, sep))
        except duckdb.InterruptException:  # the conversion's time ran out: no sign the file is not a table
            raise
        except duckdb.Error as exc:  # not UTF-8, rows of other widths further down: lines still answer
            log.info("%s reads as CSV at first but not as a table: %s", result.name, str(exc).splitlines()[0])
    tables.append(table_lines.load(conn, result, scratch, stop))
    return tables
