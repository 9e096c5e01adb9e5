"""Real public files of every shape, through the gateway in front of the npm filesystem server: answers
computed from the files themselves (csv, json), never typed in.

Fixtures (tests/fixtures/real/): penguins-raw.csv (palmerpenguins, R's NA, quoted commas, dates),
birdstrikes-head.csv (vega-datasets, CRLF line ends, empty fields), package-lock.json (npm's own output:
a map keyed by path whose first key is ""), sts-service-2.json (botocore's API model: maps of shapes and
operations), dpkg-head.log (a Debian dpkg log).
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest
from conftest import call, inproc, make_settings, outline_with_tables, text_of
from npm_servers import npm_bin

pytestmark = pytest.mark.anyio
REAL = Path(__file__).parent / "fixtures" / "real"
NA = ("", "NA")


def _rows(name: str) -> list[dict[str, str]]:
    with open(REAL / name, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
async def gateway(tmp_path: Path) -> Any:
    filesystem = npm_bin("mcp-server-filesystem")
    data = tmp_path / "data"
    shutil.copytree(REAL, data)
    settings = make_settings(
        tmp_path, {"fs": {"command": filesystem, "args": [str(data)]}}, plugins=["offload"], max_response_size=1024
    )
    async with inproc(settings) as (_, session):

        class Host:
            async def read(self, name: str) -> dict[str, Any]:
                result = await call(session, "fs__read_text_file", {"path": str(data / name)})
                return json.loads(text_of(result))

            async def tool(self, name: str, **args: Any) -> dict[str, Any]:
                result = await call(session, name, args)
                assert not result.is_error, text_of(result)
                return result.structured_content

            async def error(self, name: str, **args: Any) -> str:
                result = await call(session, name, args)
                assert result.is_error
                return text_of(result)

            async def outline(self, rid: str, **args: Any) -> dict[str, Any]:
                return await outline_with_tables(session, rid, **args)

            async def sql(self, rid: str, sql: str, **kw: Any) -> list[list[Any]]:
                return (await self.tool("response_query", path=rid, sql=sql, **kw))["rows"]

        yield Host()


async def test_csv_with_r_missing_values_is_typed(gateway: Any) -> None:
    rows = _rows("penguins-raw.csv")
    ref = await gateway.read("penguins-raw.csv")
    header = list(rows[0])
    # the header whole (not cut at 120 characters): the columns a first query can use, named at once
    # (the fileRef never waits for the tables: until they exist its own header line names them)
    tables = ref["outline"]["tables"]
    if isinstance(tables, dict):
        assert tables["items"] == f"{len(rows)} rows: " + ", ".join(header)
    else:
        assert ref["outline"]["columns"] == header and "being prepared" in tables
    rid = ref["fileRef"]["id"]

    outline = await gateway.outline(rid)
    items = outline["tables"][0]
    assert outline["type"] == "table" and items["table"] == "items" and items["rows"] == len(rows)
    types = {c["name"]: c["type"] for c in items["columns"]}
    assert types["Delta 15 N (o/oo)"] == "DOUBLE" and types["Body Mass (g)"] == "BIGINT"
    assert types["Date Egg"] == "DATE" and types["Stage"] == "VARCHAR"
    nulls = {c["name"]: c["nulls"] for c in items["columns"]}
    assert nulls["Delta 15 N (o/oo)"] == sum(r["Delta 15 N (o/oo)"] in NA for r in rows)
    assert not any("LIKE '%ERROR%'" in h for h in outline["compressionHints"])  # no log hints for a table

    measured = [r for r in rows if r["Delta 15 N (o/oo)"] not in NA]
    top = max(measured, key=lambda r: float(r["Delta 15 N (o/oo)"]))
    answer = await gateway.sql(
        rid, 'SELECT "Individual ID", "Delta 15 N (o/oo)" FROM items ORDER BY 2 DESC NULLS LAST LIMIT 1'
    )
    assert answer == [[top["Individual ID"], float(top["Delta 15 N (o/oo)"])]]  # never a row of "NA"
    mean = statistics.mean(float(r["Delta 15 N (o/oo)"]) for r in measured)
    assert (await gateway.sql(rid, 'SELECT avg("Delta 15 N (o/oo)") FROM items'))[0][0] == pytest.approx(mean)
    quoted = await gateway.sql(rid, "SELECT count(*) FROM items WHERE Stage = 'Adult, 1 Egg Stage'")
    assert quoted == [[sum(r["Stage"] == "Adult, 1 Egg Stage" for r in rows)]]


async def test_crlf_line_numbers_agree_everywhere(gateway: Any) -> None:
    raw = (REAL / "birdstrikes-head.csv").read_bytes()
    assert raw.count(b"\r\n") > 1000
    lines = raw.decode().split("\n")  # grep -n numbering: a line ends at \n
    needle = next(i for i, line in enumerate(lines, 1) if i > 700 and "Turkey vulture" in line)
    ref = await gateway.read("birdstrikes-head.csv")
    rid = ref["fileRef"]["id"]
    hits = await gateway.sql(rid, f"SELECT n FROM lines WHERE text LIKE '%Turkey vulture%' AND n >= {needle} LIMIT 1")
    assert hits == [[needle]]
    count = await gateway.sql(rid, "SELECT count(*), max(n) FROM lines")
    assert count == [[len(lines) - 1, len(lines) - 1]]  # the final \n ends the last line, as grep counts
    sliced = await gateway.tool("response_slice", path=rid, start_line=needle, end_line=needle)
    assert sliced["lines"] == [lines[needle - 1].rstrip("\r")] and sliced["total_lines"] == len(lines) - 1
    text = await gateway.sql(rid, f"SELECT text FROM lines WHERE n = {needle}")
    assert text == [[lines[needle - 1].rstrip("\r")]]  # no \r left on the text

    rows = _rows("birdstrikes-head.csv")
    cost = [int(r["Cost Total $"]) for r in rows if r["Cost Total $"] not in NA]
    total = await gateway.sql(rid, 'SELECT sum("Cost Total $"), count("Speed IAS in knots") FROM items')
    assert total == [[sum(cost), sum(r["Speed IAS in knots"] not in NA for r in rows)]]


async def test_object_keyed_by_name_is_a_table(gateway: Any) -> None:
    lock = json.loads((REAL / "package-lock.json").read_text())
    packages = lock["packages"]
    ref = await gateway.read("package-lock.json")
    rid = ref["fileRef"]["id"]
    assert ref["outline"]["itemCount"]["packages"] == len(packages)

    outline = await gateway.outline(rid, max_tokens=600)
    assert outline["itemCount"]["packages"] == len(packages)
    items = outline["tables"][0]
    assert items["table"] == "items" and items["from"] == "packages" and items["keyColumn"] == "key"
    assert await gateway.sql(rid, "SELECT count(*) FROM items") == [[len(packages)]]
    mit = sum(p.get("license") == "MIT" for p in packages.values())
    assert await gateway.sql(rid, "SELECT count(*) FROM items WHERE license = 'MIT'") == [[mit]]
    root = await gateway.sql(rid, "SELECT key, cardinality(dependencies) FROM items WHERE key = ''")
    assert root == [["", len(packages[""]["dependencies"])]]

    # the empty key is addressable, and is not the root
    assert (await gateway.tool("response_slice", path=rid, json_path='packages[""]'))["value"] == packages[""]
    some = next(k for k in packages if "/" in k and "." in k)
    sliced = await gateway.tool("response_slice", path=rid, json_path=f"packages[{json.dumps(some)}].version")
    assert sliced["value"] == packages[some]["version"]

    # a wildcard over the map: every match counted, and the next step it names works
    versions = await gateway.tool("response_slice", path=rid, json_path="$.packages[*].version")
    wanted = [p["version"] for p in packages.values() if "version" in p]
    assert versions["total"] == len(wanted) and versions["value"] == wanted[: versions["shown"]]
    if versions["shown"] < versions["total"]:
        nxt = versions["note"].split("the rest: ")[1]
        sql = nxt.split("sql='")[1].rsplit("')", 1)[0]
        assert len(await gateway.sql(rid, sql)) > 0

    keys = await gateway.tool("response_compress", path=rid, mode="keys_only", json_path="packages")
    assert keys  # a map answers keys_only without error


async def test_api_model_maps_and_doc(gateway: Any) -> None:
    model = json.loads((REAL / "sts-service-2.json").read_text())
    ref = await gateway.read("sts-service-2.json")
    rid = ref["fileRef"]["id"]
    outline = await gateway.outline(rid)
    by_source = {t["from"]: t for t in outline["tables"]}
    shapes, operations = by_source["shapes"]["table"], by_source["operations"]["table"]
    assert shapes == "items"  # the largest map
    assert await gateway.sql(rid, f"SELECT count(*) FROM {shapes}") == [[len(model["shapes"])]]
    structures = sum(s["type"] == "structure" for s in model["shapes"].values())
    assert await gateway.sql(rid, "SELECT count(*) FROM items WHERE type = 'structure'") == [[structures]]
    inputs = sorted((k, v["input"]["shape"]) for k, v in model["operations"].items() if "input" in v)
    got = await gateway.sql(rid, f"SELECT key, input.shape FROM {operations} WHERE input IS NOT NULL ORDER BY 1")
    assert [tuple(r) for r in got] == inputs
    # arrays inside the records: reachable, and the outline shows how
    assert any("unnest(" in h for h in outline["compressionHints"])
    needs_role = sum("RoleArn" in s.get("required", []) for s in model["shapes"].values())
    assert await gateway.sql(rid, "SELECT count(*) FROM items WHERE list_contains(required, 'RoleArn')") == [
        [needs_role]
    ]
    members = sum(len(s.get("members", {})) for s in model["shapes"].values())
    unnested = "SELECT count(*) FROM (SELECT unnest(map_keys(members)) FROM items WHERE members IS NOT NULL)"
    got_members = await gateway.sql(rid, unnested)
    assert got_members == [[members]]
    # what no table holds, doc answers with DuckDB's JSON functions
    version = await gateway.sql(rid, "SELECT json->>'$.metadata.apiVersion' FROM doc")
    assert version == [[model["metadata"]["apiVersion"]]]


async def test_log_outline_and_search_agree(gateway: Any) -> None:
    lines = (REAL / "dpkg-head.log").read_text().split("\n")[:-1]
    ref = await gateway.read("dpkg-head.log")
    rid = ref["fileRef"]["id"]
    outline = await gateway.tool("response_outline", path=rid)
    assert outline["lines"] == len(lines)
    assert all("ERROR" not in h for h in outline["compressionHints"])  # dpkg logs have no levels
    first = next(i for i, line in enumerate(lines, 1) if " configure " in line)
    found = await gateway.tool("response_search", path=rid, query="configure", limit=50)
    assert first in [m["line"] for m in found["matches"]]
    assert await gateway.sql(rid, "SELECT min(n) FROM lines WHERE text LIKE '% configure %'") == [[first]]
