"""An array's table read by DuckDB from the array's own bytes (`table_json._load_raw`): the same table
as the Python path's, and the Python path wherever the bytes cannot be taken as they are."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

import plugins.offload.table_json as table_json


def _load(path: Path, tmp: Path, name: str) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(tmp / f"{name}.duckdb")) as conn:
        tables = table_json.load(conn, path, tmp / f"{name}.scratch", threading.Event())
        main = tables[0].name
        columns = [c[0] for c in conn.execute(f'DESCRIBE "{main}"').fetchall()]
        return [tuple(columns), *conn.execute(f'SELECT * FROM "{main}"').fetchall()]


def _both(path: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, raw: bool) -> list[tuple[Any, ...]]:
    """The main table by the raw path (which must, or must not, have made it) and by the Python path:
    they must be the same."""
    taken: list[bool] = []
    real = table_json._load_raw

    def watched(*args: Any) -> Any:
        table = real(*args)
        taken.append(table is not None)
        return table

    monkeypatch.setattr(table_json, "_load_raw", watched)
    fast = _load(path, tmp, "fast")
    assert taken[:1] == [raw]
    monkeypatch.setattr(table_json, "_load_raw", lambda *args: None)
    assert _load(path, tmp, "slow") == fast
    return fast


def _records(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"n{i}", "tags": [{"id": i, "t": "x"}, {"id": -i}], "score": i / 3} for i in range(n)]


@pytest.mark.parametrize(
    "doc",
    [
        _records(300),
        {"items": _records(300)},
        {"note": "[not this one", "meta": {"list": [1, 2]}, "items": _records(300), "more": [1, {"a": "]"}]},
        {"items": _records(300), "after": {"x": "a ] b"}, "last": []},
    ],
    ids=["root", "only-key", "between", "first-key"],
)
def test_an_array_at_the_root_or_a_key_is_read_from_its_bytes(
    doc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_json, "RAW_PIECE", 2048)  # many pieces, each cut between two records
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc, indent=1))
    rows = _both(path, tmp_path, monkeypatch, raw=True)
    assert rows[0] == ("id", "name", "tags", "score") and len(rows) == 301 and rows[300][0] == 299


@pytest.mark.parametrize(
    ("items", "raw"),
    [
        # cuts tried inside a record (a nested array of objects; a string with brackets of its own) are
        # seen to leave brackets open and passed over
        ([{"id": i, "kids": [{"id": 2 * i}, {"id": 2 * i + 1}]} for i in range(200)], True),
        ([{"id": i, "t": "a{}, {[" * (i % 3)} for i in range(200)], True),
        # a string whose brackets happen to close at a `},{` of its own: DuckDB refuses the piece
        ([{"id": i, "text": json.dumps([{"id": 1}, {"id": 2}])[1:-1] + '},{"id": 3'} for i in range(200)], False),
        ([{"id": 1}, 5, {"id": 2}], False),  # an item that is not an object
        ([{"id": 1, "id ": 2}, {"id": 3}], True),
    ],
    ids=["nested", "string-brackets", "string-balanced", "not-a-record", "plain"],
)
def test_records_are_cut_between_or_given_to_the_python_path(
    items: list[Any], raw: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(table_json, "RAW_PIECE", 256)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"items": items}, separators=(",", ":")))
    rows = _both(path, tmp_path, monkeypatch, raw=raw)
    assert len(rows) - 1 == sum(isinstance(i, dict) for i in items)


def test_a_record_twice_keyed_goes_to_the_python_path_which_keeps_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"items": [{"id": 1, "id": 7}, {"id": 2}, {"id": 3}, {"id": 4}]}')
    rows = _both(path, tmp_path, monkeypatch, raw=False)
    assert rows == [("id",), (7,), (2,), (3,), (4,)]


def test_an_array_not_at_the_top_is_left_to_the_python_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"data": {"rows": _records(50)}}))
    rows = _both(path, tmp_path, monkeypatch, raw=False)
    assert len(rows) == 51
