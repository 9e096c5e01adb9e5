"""The loaders of response_query, one per shape, on real DuckDB files: typing, names, keys, lines."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

import plugins.offload.json_outline as json_outline
import plugins.offload.loaders as loaders
import plugins.offload.query as query
import plugins.offload.sql_worker as sql_worker
import plugins.offload.table_csv as table_csv
from plugins.offload.json_values import resolve
from plugins.offload.tables import quote


def _tables(path: Path, kind: str) -> dict[str, query.Table]:
    return {t.name: t for t in query.build(path, kind)}


def _sql(path: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(query.db_path(path)), read_only=True) as conn:
        return conn.execute(sql).fetchall()


def test_csv_missing_spellings_types_and_a_flagged_text_column(tmp_path: Path) -> None:
    path = tmp_path / "r.txt"
    path.write_text(
        "id,score,when,zip,note,price,ok\r\n"
        '1,3.5,2024-01-02,00501,"a, quoted",12,true\r\n'
        "2,NA,2024-01-03,10001,N/A,n/a,false\r\n"
        "3,,2024-01-04,02134,None,about 7,TRUE\r\n"
        "4,-,NaN,90210,x,8,\r\n"
        "5,4,null,30301,y,9,false\r\n"
    )
    tables = _tables(path, "text")
    types = {c["name"]: c["type"] for c in tables["items"].columns}
    assert types == {
        "id": "BIGINT",
        "score": "DOUBLE",
        "when": "DATE",
        "zip": "VARCHAR",  # leading zeros: an identifier, not a number
        "note": "VARCHAR",
        "price": "VARCHAR",  # "about 7" keeps it text...
        "ok": "BOOLEAN",
    }
    assert any('"price" is text' in n and "TRY_CAST" in n for n in tables["items"].notes)  # ...and says so
    assert _sql(path, 'SELECT count(score), avg(score), count("when") FROM items') == [(2, 3.75, 3)]
    assert _sql(path, "SELECT note FROM items ORDER BY id") == [("a, quoted",), (None,), ("None",), ("x",), ("y",)]
    assert _sql(path, "SELECT zip FROM items WHERE id = 1") == [("00501",)]


# values on both sides of each shortcut in the CSV typing scan: whole numbers, signs, white space, the
# words DuckDB reads as dates or numbers, dates and times in many spellings, text (Korean too)
TRICKY = [
    "0",
    "7",
    "-5",
    "+1",
    "00",
    "007",
    "-0",
    "2015",
    "20150101",
    "9223372036854775807",
    "9223372036854775808",
    "1.5",
    ".5",
    "5.",
    "1e5",
    "1.5E-3",
    "-1e400",
    "0x10",
    "1_000",
    "1,000",
    "0.1",
    "01.5",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "-INFINITY",
    "+infinity",
    "epoch",
    "EPOCH",
    "-epoch",
    "nan",
    "NaN",
    "2015-01-01",
    "2015/1/2",
    "2015 01 01",
    "2015\\01\\01",
    "15-01-01",
    "-2015-01-01",
    "2015-01-01 BC",
    "2015-01-01 10:00",
    "2015-01-01T10:00:00Z",
    "2015-13-01",
    "2015.01.01",
    "01-02-2015",
    "Jan 1 2015",
    "10:00",
    "\t2015-01-01",
    "\v2015-01-01",
    "\vinf",
    " \vepoch",
    "\f2015-01-01 10:00",
    "\t5",
    "\n7",
    "true",
    "False",
    "TRUE",
    "t",
    "yes",
    "e",
    "i",
    "E5",
    "ie",
    "서울",
    "１２",
    "٣",
    "- 5",
    "--",
    "a2015-01-01",
    "2015-01-01x",
]


def test_the_csv_typing_shortcuts_give_every_value_the_mask_of_the_full_checks() -> None:
    """The typing scan skips checks that cannot pass (a whole number's, a date cast of a value that cannot
    be one); each value's mask must be what every check of `TYPES` makes of it."""
    conn = duckdb.connect()
    full = " | ".join(
        f"(({check.format(v='v')})::INTEGER << {bit})" for bit, (_, check) in enumerate(table_csv.TYPES, 1)
    )
    for value in TRICKY:
        conn.execute("CREATE OR REPLACE TEMP TABLE raw_csv AS SELECT ?::VARCHAR AS c", [value])
        _, present, castable, numbers, _ = conn.execute(table_csv._typing_scan(["c"])).fetchone()
        if not present:  # a missing spelling: no checks at all
            continue
        expected = conn.execute(f"SELECT 1 | {full} FROM (SELECT trim(?) AS v)", [value]).fetchone()[0]
        assert (castable, numbers) == (expected, int(expected & table_csv._DOUBLE_BIT > 0)), value


def test_a_wide_csv_converts_within_the_first_memory_limit(tmp_path: Path) -> None:
    """A conversion starts with 48 MB and runs a statement again with more when it fails: a small CSV
    of 24 number columns (US employment by month, 17 KB) must not need that second run."""
    path = tmp_path / "r.txt"
    names = ["month", *(f"sector_{i}" for i in range(23))]
    rows = [
        ",".join([f"{2006 + m // 12}-{m % 12 + 1:02d}-01", *(str(1000 + 7 * m + i) for i in range(23))])
        for m in range(120)
    ]
    path.write_text(",".join(names) + "\n" + "\n".join(rows) + "\n")
    with duckdb.connect(
        str(tmp_path / "t.duckdb"), config={"threads": 1, "memory_limit": query.BUILD_MEMORY_LIMIT}
    ) as conn:
        table_csv.load(conn, path, ",")  # raised OutOfMemoryException before: each IN list took memory per column
        types = {name: kind for name, kind, *_ in conn.execute("DESCRIBE items").fetchall()}
        assert types == {"month": "DATE", **{f"sector_{i}": "BIGINT" for i in range(23)}}
        assert conn.execute("SELECT sum(sector_0) FROM items").fetchone()[0] == sum(1000 + 7 * m for m in range(120))


def _api_model(entries: int, names: int) -> dict:
    """Shapes of an API model: each has members named from a large vocabulary (the types DuckDB infers
    for them are wide)."""
    rng = random.Random(7)
    return {
        f"Shape{i}": {
            "type": "structure",
            "members": {f"Name{k}": {"shape": "String"} for k in rng.sample(range(names), 8)},
        }
        for i in range(entries)
    }


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({"version": "2.0", "shapes": _api_model(5000, 300)}, id="map-of-wide-records"),
        pytest.param(list(_api_model(5000, 300).values()), id="array-of-wide-records"),
        pytest.param(
            {"meta": {"a": 1}, "rows": [{"id": i, "name": f"n{i}"} for i in range(80_000)]}, id="2-MB-document"
        ),
    ],
)
def test_a_json_conversion_runs_each_statement_once(tmp_path: Path, doc: Any) -> None:
    """A conversion starts with 48 MB and runs a statement again with more when it fails; the loaders
    tell from the rows (their nested keys, the document's size) when to start with more, so none runs twice."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    raw = duckdb.connect(str(tmp_path / "t.duckdb"), config={"threads": 1, "memory_limit": query.BUILD_MEMORY_LIMIT})
    conn = sql_worker._Growing(raw, query.BUILD_MEMORY_CEILING)
    try:
        tables = loaders.load(conn, path, "json", tmp_path / "scratch", threading.Event())
        assert not conn.retried  # before: the table (or `doc`) failed at 48 MB and ran again
        assert raw.execute("SELECT count(*) FROM items").fetchone()[0] == (80_000 if "meta" in doc else 5000)
        assert "doc" in {t.name for t in tables}
    finally:
        raw.close()


def test_json_names_never_clash_and_items_is_the_largest(tmp_path: Path) -> None:
    doc = {
        "items": [{"v": 1}, {"v": 2}],
        "data": [{"v": i} for i in range(50)],
        "a.b": [{"w": 1}] * 3,
        "a_b": [{"w": 2}] * 4,
        "select": {f"k{i}": {"n": i, "key": "field named key"} for i in range(20)},
        "2024": {f"d{i}": i for i in range(15)},
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    tables = _tables(path, "json")
    by_source = {t.source: name for name, t in tables.items()}
    assert by_source["data"] == "items"  # the largest, not the key literally named items
    assert len({by_source[s] for s in ("items", '["a.b"]', "a_b", "select", '["2024"]')}) == 5
    counts = {s: _sql(path, f"SELECT count(*) FROM {quote(by_source[s])}")[0][0] for s in by_source if s != "$"}
    assert counts["items"] == 2 and counts['["a.b"]'] == 3 and counts["a_b"] == 4 and counts["select"] == 20
    select = tables[by_source["select"]]
    assert select.key_column == "_key"  # the values have a field named key: the entry's key gives way
    assert _sql(path, f'SELECT "_key", n, "key" FROM {quote(select.name)} WHERE n = 3') == [
        ("k3", 3, "field named key")
    ]
    assert _sql(path, f"SELECT sum(value) FROM {quote(by_source[chr(91) + chr(34) + '2024' + chr(34) + chr(93)])}")[0][
        0
    ] == sum(range(15))


def test_mixed_types_become_text_and_nothing_tabular_still_has_doc(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"title": "Up"}, {"title": 1776}, {"title": None}]))
    assert "items" in _tables(path, "json")
    assert _sql(path, "SELECT title FROM items") == [("Up",), ("1776",), (None,)]
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"name": "x", "version": "1.0", "nested": {"deep": [1, 2, 3]}}))
    assert list(_tables(flat, "json")) == ["doc"]
    assert _sql(flat, "SELECT json_array_length(json, '$.nested.deep') FROM doc") == [(3,)]


def test_a_map_whose_entries_are_unlike_or_differ_in_case_still_has_tables(tmp_path: Path) -> None:
    """A package.json's root (each key in one entry: DuckDB reads such rows as one map) and entries whose
    fields differ only in case (DuckDB's columns cannot): their table is one JSON value a row, and the
    other tables stand. Before, the whole conversion failed (no table at all, `doc` neither)."""
    package = {
        "name": "hono",
        "version": "4.6.0",
        "scripts": {f"build:{i}": f"tsx build {i}" for i in range(25)},
        "exports": {f"./sub{i}": {"import": f"./dist/sub{i}.js", "types": f"./dist/sub{i}.d.ts"} for i in range(40)},
        "devDependencies": {f"dep{i}": f"^{i}.0.0" for i in range(22)},
        "keywords": ["web", "framework"],
        **{f"field{i}": f"value {i}" for i in range(14)},
    }
    path = tmp_path / "package.json"
    path.write_text(json.dumps(package))
    tables = _tables(path, "json")
    assert {"items", "doc"} <= set(tables)
    assert _sql(path, "SELECT json->>'$.value' FROM items WHERE json->>'$.__ctx_entry_key__' = 'version'") == [
        ("4.6.0",)
    ]
    cases = {f"Op{i}": {"members": {"message": "a", **({"Message": "b"} if i == 3 else {})}} for i in range(30)}
    mixed = tmp_path / "cases.json"
    mixed.write_text(json.dumps({"shapes": cases, "list": [{"id": i} for i in range(3)]}))
    tables = _tables(mixed, "json")
    assert {"items", "list", "doc"} <= set(tables) and "differ only in case" in " ".join(tables["items"].notes)
    assert _sql(mixed, "SELECT count(*) FROM items")[0][0] == 30


@pytest.mark.parametrize("small", [True, False])
def test_outline_paths_with_odd_keys(tmp_path: Path, small: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not small:  # the streamed walk must see the same parts as the in-memory one
        monkeypatch.setattr(json_outline, "is_small", lambda _: False)
        import plugins.offload.json_values as json_values

        monkeypatch.setattr(json_values, "is_small", lambda _: False)
    doc = {"": {"root-package": True}, "a.b": {"c": 1}, "a": {"b": {"c": 2}}, "한글": [{"x": 1}]}
    path = tmp_path / f"odd{small}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    info = json_outline.outline(path)
    assert info["structure"]['[""]'] == {"type": "object", "keys": ["root-package"]}
    assert info["structure"]["$"]["keys"] == ["", "a.b", "a", "한글"]
    assert info["itemCount"] == {'["한글"]': 1}
    assert resolve(path, '[""].root-package')[0] is True
    assert resolve(path, '["a.b"].c')[0] == 1 and resolve(path, "a.b.c")[0] == 2


def test_map_outline_is_counted_and_collapsed(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"meta": {"n": 1}, "paths": {f"/p{i}": {"get": {"id": i}} for i in range(600)}}))
    info = json_outline.outline(path)
    assert info["itemCount"]["paths"] == 600
    assert info["structure"]["paths"]["entries"] == 600
    assert not any(k.startswith("paths[") for k in info["structure"])  # entries are rows, not parts
    assert len(json.dumps(info)) < 3000


def test_lines_are_numbered_as_grep_does(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"one\r\ntwo\rstill two\r\n\nfive\x1e\xff\n")
    query.build(path, "text")
    assert _sql(path, "SELECT n, text FROM lines ORDER BY n") == [
        (1, "one"),
        (2, "two\rstill two"),
        (3, ""),
        (4, "five\x1e\ufffd"),  # invalid UTF-8 as every other tool decodes it
    ]


def test_a_result_too_wide_for_a_table_is_one_json_column(tmp_path: Path) -> None:
    """Every object with keys no other has (a wide, sparse result): not a table of thousands of columns
    but one JSON value a row, still queryable."""
    path = tmp_path / "wide.json"
    path.write_text(json.dumps([{f"k{i}_{j}": j for j in range(5)} for i in range(400)]))
    items = _tables(path, "json")["items"]
    assert [c["name"] for c in items.columns] == ["json"] and items.rows == 400
    assert any("different keys" in n for n in items.notes)
    assert _sql(path, "SELECT count(*), sum((json->>'$.k7_3')::INT) FROM items") == [(400, 3)]
    lines = tmp_path / "wide.txt"
    lines.write_text("\n".join(json.dumps({f"k{i}_{j}": j for j in range(5)}) for i in range(400)))
    assert [c["name"] for c in _tables(lines, "text")["items"].columns] == ["json"]


def test_distinct_counts_are_exact_or_marked_and_a_maps_keys_are_unique(tmp_path: Path) -> None:
    """A distinct count above the row count, or short of it for a map's keys, reads as duplicates."""
    path = tmp_path / "r.json"
    models = {f"Model{i:05d}": {"size": i % 7} for i in range(3135)}
    people = [{"name": f"person-{i}", "team": f"t{i % 3}"} for i in range(7910)]
    path.write_text(json.dumps({"models": models, "people": people}))
    tables = _tables(path, "json")
    by_rows = {t.rows: t for t in tables.values()}
    people_cols = {c["name"]: c for c in by_rows[7910].columns}
    assert people_cols["name"]["distinct"] == 7910 and people_cols["name"].get("unique") is True
    assert people_cols["team"]["distinct"] == 3 and "unique" not in people_cols["team"]
    assert "distinctApprox" not in people_cols["name"]
    map_table = by_rows[3135]
    key = next(c for c in map_table.columns if c["name"] == map_table.key_column)
    assert key["distinct"] == 3135 and key["unique"] is True


def test_a_large_tables_distinct_count_is_marked_approximate_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    import plugins.offload.tables as tables

    monkeypatch.setattr(tables, "EXACT_DISTINCT_ROWS", 100)  # as a table of millions of rows is profiled
    with duckdb.connect() as conn:
        conn.execute("CREATE TABLE t AS SELECT 'name-' || i AS name, i % 5 AS team FROM range(7910) r(i)")
        cols = {c["name"]: c for c in tables.profile(conn, tables.Table("t", "test")).columns}
    assert cols["name"]["distinct"] <= 7910 and "HyperLogLog" in cols["name"]["distinctApprox"]
    assert cols["team"]["distinctApprox"] and "unique" not in cols["name"]


def _json_dates_typed(values: list[str], ensure_ascii: bool, folder: Path) -> list[tuple[str, str]]:
    """(value, type) of each value DuckDB's JSON detection types as something other than text."""
    typed = []
    for start in range(0, len(values), 100):  # up to 100 columns a file (more would be typed a MAP)
        chunk = values[start : start + 100]
        row = json.dumps({f"c{i}": v for i, v in enumerate(chunk)}, ensure_ascii=ensure_ascii)
        (folder / "t.jsonl").write_text(row + "\n" + row + "\n")
        described = duckdb.sql(
            f"DESCRIBE SELECT * FROM read_json_auto('{folder / 't.jsonl'}', format='newline_delimited', sample_size=-1)"
        ).fetchall()
        typed += [(v, str(d[1])) for v, d in zip(chunk, described, strict=True) if str(d[1]) != "VARCHAR"]
    return typed


def _date_like_values() -> list[str]:
    """Dates and times in many formats, with white space, signs and other characters before them."""
    import datetime

    moment = datetime.datetime(2021, 3, 7, 14, 5, 9, 123456)
    rng = random.Random(5)
    parts, seps = ["%Y", "%y", "%m", "%d", "%H", "%I", "%M", "%S", "%f", "%p", "%b", "%B", "%j", "%z"], "-/ :.T"
    formats = {"".join(rng.choice(parts) + rng.choice(seps) for _ in range(rng.randint(1, 6))) for _ in range(400)}
    values = sorted({moment.strftime(f).strip() for f in formats} | set(TRICKY) | {"14:05:09", "-infinity "})
    leads = ["", " ", "\t", "\n", "\v", "\f", "\r", "-", "+", "x", "\u00a0", "\x00"]
    return [lead + v for v in values for lead in leads]


@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_no_string_duckdb_types_a_date_passes_the_json_date_guard(tmp_path: Path, ensure_ascii: bool) -> None:
    """Where the guard says no string may be a date, one fixed format detects the same types: so each
    value DuckDB's detection types a date, time or timestamp must be caught by it, however escaped."""
    from plugins.offload.table_jsonl import may_hold_dates

    typed = _json_dates_typed(_date_like_values(), ensure_ascii, tmp_path)
    assert len(typed) > 50  # the values do hold what DuckDB types as dates
    missed = [(v, t) for v, t in typed if not may_hold_dates(json.dumps({"c": v}, ensure_ascii=ensure_ascii).encode())]
    assert not missed


def test_the_json_date_guard_reads_strings_not_what_is_inside_them(tmp_path: Path) -> None:
    from plugins.offload.table_jsonl import longest_line, may_hold_dates

    assert not may_hold_dates(b'{"a":"say \\"2021-01-01\\"","items":[1,2],"e":"exit"}')  # quoted inside a string
    assert may_hold_dates(b'{"a":"\\\\","b":"2021-01-01"}')  # after an escaped backslash a string starts
    assert may_hold_dates(b'{"a":" \\u000b2021-01-01"}') and may_hold_dates(b'{"2021":1}')  # escapes; a key
    # a string that starts at the end of a 1 MB block, its white space or its date in the next
    for gap in (1, 40, 200):
        head = b'{"pad":"' + b"x" * ((1 << 20) - 10 - gap) + b'","d":"'
        path = tmp_path / "t.jsonl"
        path.write_bytes(head + b" " * gap + b'2021-01-01"}\n{"pad":"y","d":"z"}\n')
        assert longest_line(path)[1], gap
    # a string that opens well before the end of a block, its escaped white space running into the next
    for lead in (b"\\t" * 100, b"\\n" + b" " * 200, b"\\u0020" + b"\\t" * 60 + b"\\u0031"):
        head = b'{"pad":"' + b"x" * ((1 << 20) - 100) + b'","d":"'
        path.write_bytes(head + lead + b'2021-01-01"}\n{"pad":"y","d":"z"}\n')
        assert longest_line(path)[1], lead[:8]
    path.write_bytes(b'{"pad":"' + b"x" * (1 << 21) + b'","d":"y"}\n')
    assert longest_line(path) == ((1 << 21) + 18, False)
