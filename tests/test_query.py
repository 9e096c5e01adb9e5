"""response_query: SQL over whole offloaded results from a real upstream (the npm filesystem server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import call, inproc, make_settings, outline_with_tables, text_of
from npm_servers import npm_bin

pytestmark = pytest.mark.anyio
CITIES = ["Seoul", "Busan", "Berlin"]


def _files(data: Path) -> None:
    orders = [
        {
            "id": i,
            "status": "refunded" if i % 7 == 0 else "paid",
            "total": round(10 + i * 1.25, 2),
            "customer": {"name": f"customer {i}", "city": CITIES[i % 3]},
            "tags": ["gift"] if i % 5 == 0 else ["standard"],
        }
        for i in range(4000)
    ]
    orders[1234]["customer"]["name"] = "needle-9f3a"
    (data / "orders.json").write_text(json.dumps({"data": orders, "meta": {"warnings": [{"code": 7}]}}))
    (data / "sales.csv").write_text(
        "id,city,amount\n" + "\n".join(f"{i},{CITIES[i % 3]},{i * 2.5}" for i in range(3000))
    )
    (data / "events.jsonl").write_text(
        "\n".join(json.dumps({"id": i, "level": "error" if i % 4 == 0 else "info", "ms": i % 90}) for i in range(4000))
    )
    (data / "app.log").write_text(
        "\n".join(
            f"2026-11-30T10:00:{i % 60:02d}Z {'ERROR' if i % 10 == 0 else 'INFO'} comp{i % 4} req {i}"
            for i in range(6000)
        )
    )


async def test_sql_over_real_results(tmp_path: Path) -> None:
    filesystem = npm_bin("mcp-server-filesystem")
    data = tmp_path / "data"
    data.mkdir()
    _files(data)
    secret = tmp_path / "secret.txt"
    secret.write_text("top-secret-value-31337")
    settings = make_settings(
        tmp_path, {"fs": {"command": filesystem, "args": [str(data)]}}, plugins=["offload"], max_response_tokens=2000
    )
    before = {p for p in tmp_path.rglob("*") if "ws" not in p.parts}
    async with inproc(settings) as (_, session):

        async def ref(name: str) -> str:
            result = await call(session, "fs__read_text_file", {"path": str(data / name)})
            return json.loads(text_of(result))["fileRef"]["id"]

        async def sql(rid: str, query: str, **kw: object) -> dict:
            result = await call(session, "response_query", {"path": rid, "sql": query, **kw})
            assert not result.is_error, text_of(result)
            return result.structured_content

        orders, sales, log = await ref("orders.json"), await ref("sales.csv"), await ref("app.log")
        outline = await outline_with_tables(session, orders)
        assert [(t["table"], t["from"]) for t in outline["tables"]][:2] == [
            ("items", "data"),
            ("meta_warnings", "meta.warnings"),
        ]
        assert any("response_query" in h for h in outline["compressionHints"])

        refunded = await sql(orders, "SELECT count(*) FROM items WHERE status = 'refunded'")
        assert refunded["rows"] == [[len([i for i in range(4000) if i % 7 == 0])]]
        by_city = await sql(
            orders, "SELECT customer.city, count(*), round(avg(total), 2) FROM items GROUP BY 1 ORDER BY 1"
        )
        assert [r[0] for r in by_city["rows"]] == sorted(CITIES) and sum(r[1] for r in by_city["rows"]) == 4000
        gifts = await sql(orders, "SELECT count(*) FROM items WHERE list_contains(tags, 'gift')")
        assert gifts["rows"] == [[800]]
        needle = await sql(orders, "SELECT id FROM items WHERE customer.name = 'needle-9f3a'")
        assert needle["rows"] == [[1234]]
        assert (await sql(orders, "SELECT code FROM meta_warnings"))["rows"] == [[7]]
        everything = await sql(orders, "SELECT * FROM items", max_tokens=500)
        assert everything["row_count"] == 4000 and len(everything["rows"]) < 4000 and "fileRef" in everything
        saved = await sql(everything["fileRef"]["id"], "SELECT count(*), max(id) FROM items")
        assert saved["rows"] == [[4000, 3999]]  # every row is in the fileRef, not the first 5,000

        events = await ref("events.jsonl")
        levels = await sql(events, "SELECT level, count(*) FROM items GROUP BY 1 ORDER BY 1")
        assert levels["rows"] == [["error", 1000], ["info", 3000]]
        per_city = await sql(sales, "SELECT city, sum(amount) FROM items GROUP BY 1 ORDER BY 1")
        assert [r[0] for r in per_city["rows"]] == sorted(CITIES)
        errors = await sql(
            log,
            "SELECT split_part(text, ' ', 3) AS comp, count(*) FROM lines WHERE text LIKE '%ERROR%' GROUP BY 1 ORDER BY 1",
        )
        assert sum(r[1] for r in errors["rows"]) == 600

        syntax = await call(session, "response_query", {"path": orders, "sql": "SELEC count(*) FROM items"})
        assert syntax.is_error and "syntax error" in text_of(syntax) and "Tables: items(" in text_of(syntax)
        for refused in [
            f"SELECT * FROM read_text('{secret}')",
            f"SELECT * FROM read_csv('{secret}')",
            f"COPY (SELECT * FROM items) TO '{tmp_path / 'out.csv'}'",
            f"ATTACH '{tmp_path / 'x.db'}'",
            "INSTALL httpfs",
            "SET enable_external_access = true",
            "EXPORT DATABASE '/tmp/exported'",
        ]:
            result = await call(session, "response_query", {"path": orders, "sql": refused})
            assert result.is_error and "top-secret" not in text_of(result), refused
    after = {p for p in tmp_path.rglob("*") if "ws" not in p.parts}
    assert after == before  # nothing written outside the workspace
