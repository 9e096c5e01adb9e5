"""The definitions ledger: a tool's first definition is remembered, a changed one is reported; on the
PostgreSQL backend two replicas share it and the first definition any of them saved wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from gateway.proxy.definitions import DefinitionLedger, fingerprint, wire
from gateway.services.storage import Storage
from gateway.settings import StorageSettings


def _tool(description: str, *args: str) -> types.Tool:
    schema = {"type": "object", "properties": {a: {"type": "string"} for a in args}}
    return types.Tool(name="fetch", description=description, input_schema=schema)


def test_a_changed_definition_is_reported_by_every_replica(tmp_path: Path, storage: Any) -> None:
    first = DefinitionLedger(tmp_path / "definitions.json", storage)
    assert first.check("web", _tool("Fetch a URL", "url")) == (None, "")
    first.flush()
    second = DefinitionLedger(tmp_path / "definitions.json", storage)  # another replica, or a restart
    known, change = second.check("web", _tool("Fetch a URL and send it elsewhere", "url", "exfil"))
    assert known is not None and known["description"] == "Fetch a URL"
    assert change == "description, input schema (+exfil)"
    assert second.check("web", _tool("Fetch a URL", "url")) == (None, "")


def test_the_first_definition_two_replicas_saved_wins(tmp_path: Path, postgres_dsn: str) -> None:
    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    a = DefinitionLedger(tmp_path / "definitions.json", storage)
    b = DefinitionLedger(tmp_path / "definitions.json", storage)
    a.check("web", _tool("original", "url"))
    b.check("web", _tool("changed", "url", "exfil"))
    b.flush()
    a.flush()  # a adopts what b saved first
    assert a.check("web", _tool("original", "url"))[1] == "description, input schema (-exfil)"


def _echo(description: str = "Echo the text back.") -> types.Tool:
    return types.Tool(name="echo", description=description, input_schema={"type": "object"})


GOOD = {"q": {"echo": {"sha": fingerprint(wire(_echo())), "definition": wire(_echo())}}}
BAD_SHAPES = [{"p": [1]}, {"p": {"echo": "garbage"}}, {"p": {"echo": {"sha": "x", "definition": "no"}}}]


@pytest.mark.parametrize("bad", BAD_SHAPES, ids=["list", "string-tool", "string-definition"])
def test_a_server_entry_of_the_wrong_shape_is_damaged_for_that_server_alone(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(bad | GOOD))
    ledger = DefinitionLedger(path)
    first, change = ledger.check("p", _echo(), frozen=True)  # fails closed, never raises
    assert first is None and "unknown" in change and "definitions.json" in change
    assert ledger.check("q", _echo(), frozen=True) == (None, "")  # the undamaged server is untouched
    assert ledger.check("q", _echo("changed"), frozen=True)[1] == "description"
    assert list(tmp_path.glob("definitions.json.damaged-*"))  # kept for a look
    assert "unknown" in DefinitionLedger(path).check("p", _echo(), frozen=True)[1]  # a restart still knows
    renewed = DefinitionLedger(path)  # freeze off: remembered anew, and the damage is gone
    assert renewed.check("p", _echo()) == (None, "")
    renewed.flush()
    assert DefinitionLedger(path).check("p", _echo(), frozen=True) == (None, "")


@pytest.mark.parametrize("bad", [{"_damaged": 1}, {"_damaged_servers": [1]}, [1]])
def test_a_ledger_of_the_wrong_shape_fails_closed_when_frozen(tmp_path: Path, bad: Any) -> None:
    path = tmp_path / "definitions.json"
    path.write_text(json.dumps(bad))
    assert "unknown" in DefinitionLedger(path).check("q", _echo(), frozen=True)[1]
    assert "unknown" in DefinitionLedger(path).check("q", _echo(), frozen=True)[1]  # and after a restart


def test_postgres_rows_of_the_wrong_shape_are_damaged_for_their_server_alone(tmp_path: Path, postgres_dsn: str) -> None:
    import psycopg

    storage = Storage(StorageSettings(backend="postgres", dsn=postgres_dsn))
    first = DefinitionLedger(tmp_path / "definitions.json", storage)
    first.check("q", _echo())
    assert first.flush()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO ctx_definitions.definitions VALUES ('p', 'echo', 'x', '\"garbage\"')")
    ledger = DefinitionLedger(tmp_path / "definitions.json", storage)
    assert "unknown" in ledger.check("p", _echo(), frozen=True)[1]
    assert ledger.check("q", _echo("changed"), frozen=True)[1] == "description"
    renewed = DefinitionLedger(tmp_path / "definitions.json", storage)
    assert renewed.check("p", _echo()) == (None, "")  # freeze off: remembered anew
    assert renewed.flush()
    assert DefinitionLedger(tmp_path / "definitions.json", storage).check("p", _echo(), frozen=True) == (None, "")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # the damaged row, kept for a look
        assert conn.execute("SELECT definition FROM ctx_definitions.definitions_damaged").fetchall() == [('"garbage"',)]
