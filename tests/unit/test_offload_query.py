"""response_query's answers: every row saved when they do not fit, and never more than a reply may read."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import plugins.offload.explore as explore
import plugins.offload.query as query
import plugins.offload.sql_worker as sql_worker
from gateway.args import Args, ToolInputError
from gateway.services import shares
from gateway.services.files import temp_beside
from gateway.services.responses import ResponseStore
from plugins.offload.explore import Explorer
from plugins.offload.json_file import SMALL_FILE
from plugins.offload.paths import PathError


@pytest.fixture
def explorer(tmp_path: Path) -> tuple[Explorer, str]:
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i} for i in range(10)]), "json")
    return Explorer(store), saved.id


def _ask(explorer: tuple[Explorer, str], sql: str, max_tokens: int = 300) -> dict:
    tool, rid = explorer
    return tool.query(Args({"path": rid, "sql": sql, "max_tokens": max_tokens}, "t"), max_tokens)


def test_rows_beyond_the_budget_are_all_saved(explorer: tuple[Explorer, str]) -> None:
    answer = _ask(explorer, "SELECT i, i * 2 AS twice FROM range(20000) t(i) -- a comment at the end")
    assert answer["row_count"] == 20000 and len(answer["rows"]) < 100
    tool, _ = explorer
    saved = _ask((tool, answer["fileRef"]["id"]), "SELECT count(*), max(i), sum(twice) FROM items")
    assert saved["rows"] == [[20000, 19999, 2 * sum(range(20000))]]


def test_huge_rows_stop_at_the_answer_cap(explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query, "ANSWER_BYTES", 4_000_000)
    answer = _ask(explorer, "SELECT i, repeat('x', 500000) AS s FROM range(1000) t(i)")
    assert str(answer["row_count"]).startswith("more than ") and "larger than 4.0 MB" in answer["note"]
    saved = Path(answer["fileRef"]["path"])
    assert saved.stat().st_size < 6 * 1024 * 1024  # 1,000 rows of 0.5 MB were never all read


def test_a_conversions_temp_files_survive_another_gateways_start(tmp_path: Path) -> None:
    """Temp files of a conversion carry this process's id: a second gateway starting on the same
    workspace (its sweep of stale temp files) leaves a live one's alone, and removes a dead one's."""
    result = tmp_path / "r.json"
    live = temp_beside(result, "duckdb")
    live.write_bytes(b"being written")
    dead = tmp_path / ".r.json.duckdb.999999999.1.tmp"
    dead.write_bytes(b"left by a gateway that died")
    ResponseStore(tmp_path).remove_stale_temp_files()
    assert live.exists() and not dead.exists()


def test_a_conversion_needing_more_than_the_small_limit_still_gets_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion starts with a small memory limit (its worker stays small) and raises it once for a
    statement that needs more: long records still become a table."""
    monkeypatch.setattr(query, "BUILD_MEMORY_LIMIT", "8MB")
    store = ResponseStore(tmp_path)
    rows = [{"id": i, "body": "가나다 " * 30_000 if i % 50 == 0 else "short"} for i in range(400)]
    saved = store.save_text("t", json.dumps(rows), "json")
    answer = _ask((Explorer(store), saved.id), "SELECT count(*), max(length(body)) FROM items")
    assert answer.get("rows") == [[400, len("가나다 " * 30_000)]], answer


def test_saved_rows_name_each_column_once_and_read_back(explorer: tuple[Explorer, str]) -> None:
    """A long column name is written once, not once a row (20,000 rows of one integer were 380 MB)."""
    name = "n" * 2000
    answer = _ask(explorer, f'SELECT i AS "{name}" FROM range(20000) t(i)')
    assert answer["row_count"] == 20000
    assert Path(answer["fileRef"]["path"]).stat().st_size < 1024 * 1024  # was 40 MB
    tool, _ = explorer
    saved = _ask((tool, answer["fileRef"]["id"]), f'SELECT count(*), sum("{name}") AS s FROM items')
    assert saved["rows"] == [[20000, sum(range(20000))]]
    nxt = answer["fileRef"]["next"].split("sql='", 1)[1].rstrip("')")
    assert _ask((tool, answer["fileRef"]["id"]), nxt, 2000)["rows"][0][1] == len(answer["rows"])


def test_a_saved_answer_is_cut_at_its_byte_cap(explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(explore, "SAVED_BYTES", 3 * 1024 * 1024)
    answer = _ask(explorer, "SELECT i, repeat('x', 1000) AS s FROM range(20000) t(i)")
    assert str(answer["row_count"]).startswith("more than ") and "saved rows stop at" in answer["note"]
    assert Path(answer["fileRef"]["path"]).stat().st_size < 5 * 1024 * 1024


def test_a_cache_miss_reuses_the_tables_beside_the_result(explorer: tuple[Explorer, str]) -> None:
    """Another process (or a full cache) finds the DuckDB file and its profile: no second conversion."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    tables = query.build(result, "json")
    before = query.db_path(result).stat()
    query._TABLES.clear()
    assert query.build(result, "json") == tables
    after = query.db_path(result).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert _ask(explorer, "SELECT count(*) FROM items")["rows"] == [[10]]


def test_a_row_batch_never_grows_past_its_bytes(explorer: tuple[Explorer, str]) -> None:
    """A tiny first row then wide ones: no line of hundreds of MB reaches the gateway."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    sql = "SELECT CASE WHEN i = 0 THEN '' ELSE repeat('x', 100000) END AS s FROM range(500) t(i)"
    longest, count = 0, 0
    with query.execute(result, "json", sql) as (_, rows):
        for _ in rows:
            count += 1
            longest = max(longest, rows.worker.size)
    assert count == 500 and longest < 16 * 1024 * 1024  # was one line of 50 MB
    with pytest.raises(query.QueryError, match="one row of the answer is"):
        with query.execute(result, "json", "SELECT repeat('x', 20000000) AS s") as (_, rows):
            list(rows)
    # bytes, not characters: 4 M Korean characters are 12 MB as written, over a row's 8 MB
    with pytest.raises(query.QueryError, match="one row of the answer is 11 MB"):
        with query.execute(result, "json", "SELECT repeat('한', 4000000) AS s") as (_, rows):
            list(rows)


def test_copy_and_attach_are_refused_and_spill_files_are_the_querys_own(
    explorer: tuple[Explorer, str], tmp_path: Path
) -> None:
    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.build(result, "json")
    spill = result.with_name(f".{result.name}.duckdb.tmp")
    for sql in (
        f"COPY (SELECT 1) TO '{spill}/x.csv'",
        f"ATTACH '{tmp_path}/other.db'",
        "INSTALL httpfs",
        "UPDATE EXTENSIONS",  # a statement type the binding cannot name: refused, not a crash
    ):
        with pytest.raises(ToolInputError, match="not allowed"):
            _ask(explorer, sql)
    assert not (spill / "x.csv").exists() and not (tmp_path / "other.db").exists()
    _ask(explorer, "SELECT count(*) FROM items")
    query.stop_all()
    assert not list(Path(tempfile.gettempdir()).glob(f"ctx-sql-{os.getpid()}-*"))  # removed with its process


def test_the_time_limit_counts_the_computation_not_the_reading(
    explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that reads (saves) slowly still gets every row: its own reading is not the query's time."""
    monkeypatch.setattr(query, "QUERY_SECONDS", 2.0)
    tool, rid = explorer
    result = tool.store.resolve(rid)
    count = 0
    with query.execute(result, "json", "SELECT i, repeat('y', 5000) FROM range(4000) t(i)") as (_, rows):
        for i, _row in enumerate(rows):
            count += 1
            if i % 500 == 0:
                time.sleep(0.5)  # a slow disk while the rows are saved
    assert count == 4000
    with pytest.raises(query.QueryError, match="ran longer than 2 s"):
        with query.execute(result, "json", "SELECT count(*) FROM range(100000000) a, range(1000) b") as (_, rows):
            list(rows)


def test_a_recursive_json_path_over_a_large_result_runs_in_a_worker(tmp_path: Path) -> None:
    """`data..*` over 6 MB built ~90 MB of Python objects in the gateway (931 MB for a larger result)."""
    store = ResponseStore(tmp_path)
    data = {"data": [{"id": i, "tags": ["a", "b"], "text": "x" * 100} for i in range(40_000)]}
    saved = store.save_text("t", json.dumps(data), "json")
    assert saved.size > SMALL_FILE
    tool = Explorer(store)
    tracemalloc.start()
    try:
        answer = tool.slice(Args({"path": saved.id, "json_path": "data..*"}, "t"), 500)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert answer["total"] == 240_000 and answer["shown"] < answer["total"] and "the rest" in answer["note"]
    assert peak < 20 * 1024 * 1024  # the worker's memory, not this process's
    with pytest.raises(PathError, match="invalid JSONPath"):  # said as in the gateway's own process
        tool.slice(Args({"path": saved.id, "json_path": "data[?(@.id =="}, "t"), 500)


def _pid_of(result: Path, sql: str, namespace: str = "") -> int:
    """The process that answered the query (its rows read to the end)."""
    with query.execute(result, "json", sql, namespace) as (_, rows):
        list(rows)
        return rows.worker.proc.pid


def test_queries_of_one_namespace_share_a_warm_worker_and_never_anothers(explorer: tuple[Explorer, str]) -> None:
    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.stop_all()  # no warm workers left by other tests: the two callers' are all the pool keeps
    first = _pid_of(result, "SELECT count(*) FROM items", "alice")
    assert _pid_of(result, "SELECT max(id) FROM items", "alice") == first  # no new process per query
    other = _pid_of(result, "SELECT min(id) FROM items", "bob")
    assert other != first  # a worker serves one namespace only
    assert _pid_of(result, "SELECT sum(id) FROM items", "alice") == first
    assert _pid_of(result, "SELECT sum(id) FROM items", "bob") == other


def test_a_worker_keeps_the_database_open_yet_each_query_starts_clean(explorer: tuple[Explorer, str]) -> None:
    """The warm worker keeps the file its last query read open (opening it was most of a small query's
    time), but each query has a connection of its own: what one made is gone for the next; and a file
    built again in its place is read anew, not from what the worker kept."""
    import duckdb

    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.stop_all()
    pids: list[int] = []

    def ask(sql: str) -> list[Any]:
        with query.execute(result, "json", sql) as (_, rows):
            answer = list(rows)
            pids.append(rows.worker.proc.pid)
            return answer

    assert ask("SELECT count(*) FROM items") == [[10]]
    assert ask("CREATE TEMP TABLE scratch AS SELECT 42 AS x") == [[1]]  # allowed: it writes no file
    with pytest.raises(query.QueryError, match="scratch does not exist"):
        ask("SELECT x FROM scratch")
    rebuilt = temp_beside(result, "duckdb")
    with duckdb.connect(str(rebuilt)) as conn:
        conn.execute("CREATE TABLE items AS SELECT range AS id FROM range(99)")
    os.replace(rebuilt, query.db_path(result))
    assert ask("SELECT count(*) FROM items") == [[99]]
    assert len(set(pids)) == 1 and len(pids) == 3  # one worker answered them all
    query.db_path(result).unlink()  # gone (a damaged file removed): built again, as without a kept one
    assert ask("SELECT count(*) FROM items") == [[10]]


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the worker's memory in /proc (Linux)")
def test_a_worker_keeps_no_database_open_that_a_query_left_large(explorer: tuple[Explorer, str]) -> None:
    """DuckDB keeps what a query used until its database closes: a worker waiting with it open would
    hold hundreds of MB (185 MB after this GROUP BY, 76 MB before it)."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.stop_all()

    def resident(pid: int) -> int:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    small = _pid_of(result, "SELECT count(*) FROM items")
    before = resident(small)
    grouped = "SELECT count(*) FROM (SELECT range % 3000000 AS g, count(*) FROM range(6000000) GROUP BY g)"
    assert _pid_of(result, grouped) == small
    deadline = time.monotonic() + 10  # it closes the database once its answer is sent
    while resident(small) >= before + 48 * 1024 * 1024:
        assert time.monotonic() < deadline, f"the idle worker holds {resident(small) // 2**20} MB"
        time.sleep(0.05)


def test_a_result_holding_anothers_bytes_finds_its_database_open_under_a_neutral_name(tmp_path: Path) -> None:
    """Two results with the same bytes share one DuckDB file (a link): the second's query finds the file
    the first's left open (no new database: ~15 ms), and every result's database is named `result`, so
    no query sees another result's name; no link made for the open is left."""
    store = ResponseStore(tmp_path)
    text = json.dumps([{"id": i} for i in range(10)])
    first, again = store.save_text("t", text, "json"), store.save_text("t", text, "json")
    query.stop_all()
    names = []
    for saved in (first, again):
        with query.execute(saved.path, "json", "SELECT current_database()") as (_, rows):
            [row] = list(rows)  # read to the end: the worker stays warm
            names.append(row[0])
    assert names == ["result", "result"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".result.")]

    kept, duckdb = sql_worker._Kept(), __import__("duckdb")
    request = {"threads": 1, "memory": "64MB", "temp": "64MB"}
    _, closing = kept.cursor({**request, "db": str(query.db_path(first.path))}, duckdb)
    opened = kept.conn
    assert closing is None and opened is not None
    _, closing = kept.cursor({**request, "db": str(query.db_path(again.path))}, duckdb)
    assert closing is None and kept.conn is opened  # the twin: the same database, still open
    rebuilt = query.db_path(again.path)
    copy = rebuilt.with_name(rebuilt.name + ".copy")
    copy.write_bytes(rebuilt.read_bytes())
    copy.replace(rebuilt)  # built again: another file at the same path
    _, closing = kept.cursor({**request, "db": str(rebuilt)}, duckdb)
    assert kept.conn is not opened
    kept.close()


def test_a_worker_started_ahead_while_the_gateway_stops_is_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []
    spawn = query._SPAWNER.start

    def stopped_meanwhile(**how: Any) -> Any:
        started.append(proc := spawn(**how))
        query.stop_all()
        return proc

    monkeypatch.setattr(query._SPAWNER, "start", stopped_meanwhile)
    query.start_ahead()
    assert not query._AHEAD and started[0].poll() is not None


def test_one_worker_is_started_ahead_per_run_of_the_gateway() -> None:
    """`serve` starts it beside its imports and the plugin's start asks again: one worker, not two; a
    gateway stopped and started again (a reload) gets a new one."""
    query.stop_all()
    query.start_ahead()
    query.start_ahead()
    assert len(query._AHEAD) == 1
    first = query._AHEAD[0][1]
    query.stop_all()
    query.start_ahead()
    assert len(query._AHEAD) == 1 and query._AHEAD[0][1] is not first
    query.stop_all()


def test_a_worker_started_ahead_serves_the_first_caller_only(explorer: tuple[Explorer, str]) -> None:
    """The worker the gateway starts with (so that a first conversion need not wait for Python and
    DuckDB's import) goes to the first caller that needs one, and to no other caller after it."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.stop_all()
    query.start_ahead()
    ahead = query._AHEAD[0][1].pid
    assert _pid_of(result, "SELECT count(*) FROM items", "alice") == ahead
    assert not query._AHEAD
    assert _pid_of(result, "SELECT count(*) FROM items", "bob") != ahead
    query.stop_all()
    query.start_ahead()  # a caller kept warm (its result read again: no conversion) is given it too
    ahead = query._AHEAD[0][1].pid
    query._keep_one_warm("carol")
    assert [proc.pid for _, proc in query._IDLE["carol"]] == [ahead] and not query._AHEAD
    query.stop_all()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the worker's CPU time in /proc (Linux)")
def test_a_worker_killed_mid_query_or_while_idle_is_replaced(explorer: tuple[Explorer, str]) -> None:
    tool, rid = explorer
    result = tool.store.resolve(rid)
    warm = _pid_of(result, "SELECT 1")
    killed: list[int] = []

    def cpu(pid: int) -> int:
        return sum(int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])

    def kill_it() -> None:  # once the slow query runs in the warm worker (its CPU time grows)
        idle, deadline = cpu(warm), time.monotonic() + 30
        while cpu(warm) < idle + 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        killed.append(warm)
        os.kill(warm, 9)

    killer = threading.Thread(target=kill_it)
    killer.start()
    with pytest.raises(query.QueryError, match=r"needed more memory|ended"):
        with query.execute(result, "json", "SELECT count(*) FROM range(100000000) a, range(1000) b") as (_, rows):
            list(rows)
    killer.join()
    assert killed == [warm]
    fresh = _pid_of(result, "SELECT count(*) FROM items")
    assert fresh != warm
    assert _ask(explorer, "SELECT count(*) FROM items")["rows"] == [[10]]
    os.kill(fresh, 9)  # an idle warm worker killed from outside: the next query does not notice
    assert _ask(explorer, "SELECT count(*) FROM items")["rows"] == [[10]]


def test_the_outline_answers_before_the_tables_exist_and_names_them_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion held back (a slow or huge one): the fileRef and the outline answer at once, saying the
    tables are being prepared; once they exist, the outline lists them with their profiles."""

    from plugins.offload.fileref import inline_outline

    held = threading.Event()

    class Held(query._Worker):
        def __init__(self, *args: object, **kw: object) -> None:
            held.wait(60)
            super().__init__(*args, **kw)

    monkeypatch.setattr(query, "_Worker", Held)
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps({"data": [{"id": i, "city": "Seoul"} for i in range(500)]}), "json")
    tool = Explorer(store)
    answers: list[dict] = []

    def look() -> None:
        answers.append(inline_outline(saved, ""))
        answers.append(tool.outline(Args({"path": saved.id}, "t"), 2000))

    try:
        looking = threading.Thread(target=look, daemon=True)
        looking.start()
        looking.join(30)
        assert len(answers) == 2, "the first look waited for the tables"
    finally:
        held.set()
    ref, first = answers
    assert "being prepared" in ref["tables"] and ref["type"] == "object"
    assert "being prepared" in first["tables"] and first["itemCount"] == {"data": 500}
    deadline = time.monotonic() + 60
    while not isinstance((later := tool.outline(Args({"path": saved.id}, "t"), 2000))["tables"], list):
        assert time.monotonic() < deadline, later["tables"]
        time.sleep(0.05)
    items = later["tables"][0]
    assert items["table"] == "items" and items["rows"] == 500
    assert {c["name"]: c["distinct"] for c in items["columns"]} == {"id": 500, "city": 1}


def test_json_lines_beyond_a_megabyte_are_converted_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """DuckDB's line reader needs more than the small limit for a few MB of JSON Lines: the conversion
    starts at the larger one instead of running a statement twice."""
    import logging

    store = ResponseStore(tmp_path)

    def finding(i: int) -> dict[str, Any]:  # the shape of a linter's JSON Lines report (ruff's)
        where = {"column": i % 80, "row": i}
        edit = {"content": '"x"', "end_location": where, "location": where}
        fix = {"applicability": "safe", "edits": [edit], "message": "Replace"} if i % 3 == 0 else None
        return {"code": f"E{i % 97}", "end_location": where, "filename": f"src/m{i % 400}.py", "fix": fix,
                "location": where, "message": "Missing docstring in public function", "noqa_row": i}  # fmt: skip

    lines = [json.dumps(finding(i)) for i in range(12_000)]
    saved = store.save_text("t", "\n".join(lines) + "\n", "text")
    assert saved.size > 2 << 20
    with caplog.at_level(logging.INFO, "plugins.offload"):
        answer = _ask((Explorer(store), saved.id), "SELECT count(*), count(DISTINCT code) FROM items")
    assert answer.get("rows") == [[12_000, 97]], answer
    assert not [r for r in caplog.records if "needed more than" in r.getMessage()]


def test_a_result_of_long_records_is_converted(tmp_path: Path) -> None:
    """200 records of 200 KB: the table's commit could not pin its blocks within the conversion's first
    memory limit (a TransactionException, not an out-of-memory one), and the query failed."""
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps({"data": [{"id": i, "s": "y" * 200_000} for i in range(200)]}), "json")
    tool = Explorer(store)
    answer = tool.query(Args({"path": saved.id, "sql": "SELECT count(*), sum(length(s)) FROM items"}, "t"), 300)
    assert answer["rows"] == [[200, 200 * 200_000]]


def test_a_small_results_file_ref_names_its_tables_without_waiting_for_their_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fileRef names the tables and their columns as soon as a query can use them; the column
    profiles (held back here) are the outline's, and come later."""

    from plugins.offload.fileref import inline_outline

    held = threading.Event()

    class ProfilesHeld(query._Worker):
        def __init__(self, request: dict[str, Any], *args: Any, **kw: Any) -> None:
            if request["op"] == "profile":
                held.wait(60)
            super().__init__(request, *args, **kw)

    monkeypatch.setattr(query, "_Worker", ProfilesHeld)
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps({"data": [{"id": i, "city": "Seoul"} for i in range(500)]}), "json")
    try:
        ref = inline_outline(saved, "")
        assert ref["tables"] == {"items": "500 rows from data: id, city", "doc": "1 rows: json"}, ref["tables"]
        outline = Explorer(store).outline(Args({"path": saved.id}, "t"), 2000)
        assert "profiles are being computed" in outline["tables"]  # the outline's profiles: not yet
    finally:
        held.set()


def test_a_worker_waits_warm_for_the_first_query_while_the_tables_are_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result's conversion (and its profiles) run in one of the caller's workers; another waits warm
    beside it, so the caller's first query starts no process (Python and DuckDB's import, ~0.15 s)."""
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i, "name": f"n{i}"} for i in range(300_000)]), "json")
    result = store.resolve(saved.id)
    query.stop_all()
    converting = query.warm(result, "json", "dora")
    deadline = time.monotonic() + 30
    while not query._IDLE.get("dora") and converting.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert converting.is_alive(), "the conversion ended before a worker waited beside it"
    started: list[int] = []  # the threads that started a process (the conversion's may start a spare)
    spawn = query._SPAWNER.start
    monkeypatch.setattr(query._SPAWNER, "start", lambda: started.append(threading.get_ident()) or spawn())
    _pid_of(result, "SELECT count(*) FROM items", "dora")
    assert threading.get_ident() not in started  # the query ran in a warm worker, whichever it found
    converting.join(60)


def test_one_callers_spare_never_ends_another_callers_warm_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every idle place taken by other callers, a conversion starts no spare, and the worker it
    gives back ends one other caller's worker at most (the one holding the most, else the oldest)."""

    started: list[Any] = []

    def sleeper() -> Any:
        started.append(proc := query._Process(["sleep", "60"]))
        return proc

    query.stop_all()
    monkeypatch.setattr(query._SPAWNER, "start", sleeper)
    places = sum(p.total for p in (shares.worker_pool(), shares.conversion_pool()))  # idle ones in all
    others = [f"tenant{i}" for i in range(places)]
    for name in others:
        query._give(name, sleeper())
    started.clear()
    try:
        query._keep_one_warm("alice")
        assert not started  # the idle places are full: no process is started only to end another's
        query._give("alice", sleeper())  # her conversion's worker, back
        kept = [name for name in others if query._IDLE.get(name)]
        assert len(kept) == len(others) - 1 and len(query._IDLE["alice"]) == 1
    finally:
        query.stop_all()


def test_a_query_and_its_notes_never_wait_for_the_column_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ResponseStore(tmp_path)
    rows = [{"title": "Up" if i % 2 else 1984, "gross": i} for i in range(50)]
    saved = store.save_text("t", json.dumps(rows), "json")

    def profiles(*_: Any) -> None:
        raise AssertionError("the query waited for the column profiles")

    monkeypatch.setattr(query, "build", profiles)
    answer = _ask((Explorer(store), saved.id), "SELECT title FROM items ORDER BY gross DESC LIMIT 1")
    assert answer["rows"] == [["Up"]] and "mixes strings and numbers" in answer["note"]


def _worker_ops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The op of every request a worker is given from now on (convert, profile, query), in order."""
    ops: list[str] = []

    class Counted(query._Worker):
        def __init__(self, request: dict[str, Any], *args: Any, **kw: Any) -> None:
            ops.append(request["op"])
            super().__init__(request, *args, **kw)

    monkeypatch.setattr(query, "_Worker", Counted)
    return ops


def test_a_result_holding_an_earlier_ones_bytes_is_not_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same file read twice (a log fetched again): the second result is answered from the first one's
    tables, with no worker converting or profiling it; one of the same size but other bytes is converted,
    and the second still answers once the first is removed (the TTL)."""
    ops = _worker_ops(monkeypatch)
    store = ResponseStore(tmp_path)
    text = json.dumps({"data": [{"id": i, "city": "Seoul"} for i in range(500)]})
    first = store.save_text("t", text, "json")
    tables = query.build(first.path, "json")
    assert ops == ["convert", "profile"]
    again = store.save_text("t", text, "json")
    ops.clear()
    assert query.build(again.path, "json") == tables
    assert ops == []  # neither converted nor profiled
    other = store.save_text("t", text.replace("Seoul", "Busan"), "json")
    assert other.size == again.size
    query.build(other.path, "json")
    assert ops == ["convert", "profile"]
    first.path.unlink()
    query.db_path(first.path).unlink()
    ops.clear()
    answer = Explorer(store).query(Args({"path": again.id, "sql": "SELECT count(*) FROM items"}, "t"), 300)
    assert answer["rows"] == [[500]] and ops == ["query"]


def test_a_twins_unreadable_tables_are_built_anew(tmp_path: Path) -> None:
    """The earlier result's DuckDB file damaged: the later one's query finds it unreadable and builds its
    own, once, instead of sharing the damaged file again."""
    store = ResponseStore(tmp_path)
    text = json.dumps([{"id": i} for i in range(50)])
    first = store.save_text("t", text, "json")
    query.build(first.path, "json")
    db = query.db_path(first.path)
    keep = db.stat()
    with open(db, "r+b") as fh:  # damaged in place, its size and time kept: the record still matches it
        fh.write(b"\0" * 4096)
    os.utime(db, ns=(keep.st_atime_ns, keep.st_mtime_ns))
    again = store.save_text("t", text, "json")
    answer = Explorer(store).query(Args({"path": again.id, "sql": "SELECT count(*) FROM items"}, "t"), 300)
    assert answer["rows"] == [[50]]
    assert query.db_path(again.path).stat().st_ino != db.stat().st_ino


def test_a_query_naming_a_column_corrupt_is_a_mistake_not_a_damaged_file(
    explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query's own error that happens to contain "corrupt" is answered as the error it is: the tables are
    not thrown away and built again."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    query.build(result, "json")
    before = query.db_path(result).stat().st_ino
    ops = _worker_ops(monkeypatch)
    with pytest.raises(ToolInputError, match="corrupt"):
        _ask(explorer, "SELECT corrupt FROM items")
    assert ops == ["query"] and query.db_path(result).stat().st_ino == before


def test_a_csv_load_cut_by_the_time_limit_fails_the_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB interrupted by the conversion's clock while it reads a CSV: the conversion fails (and is
    tried again later), instead of being saved as a result that holds only `lines`."""
    import duckdb

    import plugins.offload.loaders as loaders
    import plugins.offload.table_csv as table_csv

    path = tmp_path / "t-00000001.txt"
    path.write_text("id,name\n" + "".join(f"{i},n{i}\n" for i in range(100)))

    def interrupted(*args: Any) -> Any:
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(table_csv, "load", interrupted)
    with duckdb.connect() as conn, pytest.raises(duckdb.InterruptException):
        loaders.load(conn, path, "text", tmp_path / "scratch", threading.Event())


def test_where_no_hard_link_can_be_made_a_result_read_again_is_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system without hard links: the later result is converted on its own, and the folder is not
    searched for twins again (no file is read twice for nothing)."""
    monkeypatch.setattr(query, "_NO_LINK", set())

    def no_link(*args: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    compared: list[Path] = []
    real_same = query.same_bytes
    monkeypatch.setattr(query.os, "link", no_link)
    monkeypatch.setattr(query, "same_bytes", lambda a, b: compared.append(a) or real_same(a, b))
    store = ResponseStore(tmp_path)
    text = json.dumps([{"id": i} for i in range(50)])
    query.build(store.save_text("t", text, "json").path, "json")
    for _ in range(2):
        again = store.save_text("t", text, "json")
        answer = Explorer(store).query(Args({"path": again.id, "sql": "SELECT count(*) FROM items"}, "t"), 300)
        assert answer["rows"] == [[50]] and query.db_path(again.path).stat().st_nlink == 1
    assert not compared and {str(tmp_path)} == query._NO_LINK


def test_a_wildcard_over_a_mid_sized_result_runs_in_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wildcard or filter walks the whole document: over 256 KB it runs in a worker process, never on the
    gateway's interpreter (over 3 MB it held it long enough to push another caller's p99 past 300 ms); a
    plain path into the same result is answered here, from the parsed document."""
    ops = _worker_ops(monkeypatch)
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps({"data": [{"id": i, "name": f"n{i}"} for i in range(20_000)]}), "json")
    assert explore.MATCHES_HERE < saved.size <= SMALL_FILE
    tool = Explorer(store)
    plain = tool.slice(Args({"path": saved.id, "json_path": "data.5.name"}, "t"), 500)
    assert not ops and plain["value"] == "n5", plain
    found = tool.slice(Args({"path": saved.id, "json_path": "$..name"}, "t"), 500)
    # the answer's note (the rest of the matches) starts the tables' conversion in the background: its
    # worker may have started by now too, beside the one slice
    assert [op for op in ops if op != "convert"] == ["slice"] and found["total"] == 20_000, found


@pytest.mark.parametrize("name", sorted(sql_worker._WARM_FILES))
def test_a_workers_warm_up_converts_and_leaves_nothing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An idle worker converts a few rows of each kind before a request needs it (its first conversion of
    a kind costs more); a warm-up that stopped converting would only say so on the worker's stderr."""
    import duckdb

    monkeypatch.setattr(sql_worker, "_TEMP", str(tmp_path))
    sql_worker._warm_up(duckdb, name, sql_worker._WARM_FILES[name])
    assert capsys.readouterr().err == "" and list(tmp_path.iterdir()) == []


def test_a_worker_whose_warm_up_fails_still_serves(tmp_path: Path) -> None:
    """The warm-up runs while the worker waits for its first request; one that fails is said on its stderr
    and the worker serves as it would have without it."""
    import select
    import subprocess
    import sys

    import duckdb

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")  # its warm-up files cannot be written below it
    db = tmp_path / "r.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE items AS SELECT 41 AS n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugins.offload.sql_worker", "30", str(blocked), "warm-up"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=query._ROOT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    request = {"op": "query", "db": str(db), "sql": "SELECT n + 1 FROM items", "address_space": query.ADDRESS_SPACE}
    request |= {"seconds": 10, "wall": 20, "memory": "64MB", "temp": "64MB", "threads": 1}
    try:
        assert select.select([proc.stderr], [], [], 60)[0], "the worker said nothing about its warm-up"
        assert b"warm-up failed" in proc.stderr.readline()
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        assert proc.stdout.readline() == b'{"started": true}\n'
        assert json.loads(proc.stdout.readline()) == {"columns": ["(n + 1)"]}
        assert b"42" in proc.stdout.readline()  # the rows follow the columns
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads a process's priority from /proc (Linux)")
def test_a_worker_runs_below_the_gateway_from_its_start_and_only_so_much(tmp_path: Path) -> None:
    """Started under `nice` (its Python start and DuckDB's import yield to the gateway's own start), and
    not lowered a second time by itself: its queries run at the gateway's priority plus NICE."""
    import sys

    import duckdb

    def nice_of(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

    expected = min(19, nice_of(os.getpid()) + sql_worker.NICE)
    db = tmp_path / "r.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE items AS SELECT 1 AS n")
    proc = query._SPAWNER.start()
    assert proc.stdin is not None and proc.stdout is not None
    try:
        deadline = time.monotonic() + 30
        while (
            not Path(f"/proc/{proc.pid}/cmdline").read_text().startswith(sys.executable) and time.monotonic() < deadline
        ):
            time.sleep(0.001)  # `nice` runs first and becomes Python
        assert nice_of(proc.pid) == expected  # as Python starts
        request = {"op": "query", "db": str(db), "sql": "SELECT n FROM items", "address_space": query.ADDRESS_SPACE}
        request |= {"seconds": 10, "wall": 20, "memory": "64MB", "temp": "64MB", "threads": 1}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        assert proc.stdout.readline() == b'{"started": true}\n'
        assert nice_of(proc.pid) == expected  # and once it runs its own code
    finally:
        query._close(proc)


def _no_reading_nor_a_place(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read the files' bytes, or took a place for conversions, to compare them")

    monkeypatch.setattr(query, "same_bytes", refused)
    monkeypatch.setattr(query, "_slot", refused)


def test_a_result_read_again_is_told_by_digests_without_reading_or_a_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The responses store hashes each result as it writes it: a result read again shares the earlier
    one's tables without reading either file and without one of the caller's places for conversions (the
    earlier one's profiles may hold it: a re-read of a 2.6 MB API model waited ~0.5 s for them)."""
    from gateway.services import files

    store = ResponseStore(tmp_path)
    text = json.dumps([{"id": i, "name": f"n{i}"} for i in range(300)])
    first = store.save_text("t", text, "json")
    query.build(first.path, "json")
    _no_reading_nor_a_place(monkeypatch)
    again = store.save_text("t", text, "json")
    assert query._twin_tables(again.path) is not None
    assert query.db_path(again.path).stat().st_ino == query.db_path(first.path).stat().st_ino
    other = store.save_text("t", text.replace("n1", "m1"), "json")  # as long, other bytes
    assert other.size == first.size and query._twin_tables(other.path) is None
    files._DIGESTS.clear()  # a restart: the earlier result's record still names its digest
    files.remember_digest(again.path, hashlib.sha256(text.encode()).hexdigest())
    query.db_path(again.path).unlink()
    query.profile_path(again.path).unlink()
    assert query._twin_tables(again.path) is not None


def test_a_file_without_a_known_digest_is_compared_by_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.services import files

    store = ResponseStore(tmp_path)
    text = json.dumps([{"id": i} for i in range(300)])
    first = store.save_text("t", text, "json")
    query.build(first.path, "json")
    files._DIGESTS.clear()  # written before a restart, before records named digests
    record = json.loads(query.profile_path(first.path).read_bytes())
    record.pop("digest")
    query.profile_path(first.path).write_text(json.dumps(record))
    os.utime(query.profile_path(first.path))
    again = store.save_text("t", text, "json")
    compared: list[Path] = []
    real_same = query.same_bytes
    monkeypatch.setattr(query, "same_bytes", lambda a, b: compared.append(a) or real_same(a, b))
    assert query._twin_tables(again.path) is not None and compared == [first.path]


def test_the_first_query_after_a_background_conversion_gets_the_warm_worker(
    explorer: tuple[Explorer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh gateway has one warm worker (started ahead); the conversion uses it and a spare starts.
    The column profiles wait PROFILE_AFTER, so the query sent as the fileRef arrives takes the warm worker
    instead of waiting for the spare to start (0.1-0.2 s in a gateway started per task)."""
    tool, rid = explorer
    result = tool.store.resolve(rid)
    monkeypatch.setattr(query, "PROFILE_AFTER", 1.0)
    query.stop_all()
    query.start_ahead()
    ahead = query._AHEAD[0][1].pid
    converting = query.warm(result, "json", "erin")
    deadline = time.monotonic() + 30
    while query._LOADED.peek(result) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _pid_of(result, "SELECT count(*) FROM items", "erin") == ahead
    converting.join(60)
    query.stop_all()


def test_a_result_rewritten_in_place_is_not_taken_for_its_twin(tmp_path: Path) -> None:
    """A digest names the bytes its writer wrote: a file written again in place with the same size and
    modification time (within one clock tick, or its time set back) is compared anew, not trusted."""
    store = ResponseStore(tmp_path)
    text = "id,n\n" + "".join(f"{i},{10 * i}\n" for i in range(50))
    first = store.save_text("t", text, "text")
    query.build(first.path, "text")
    again = store.save_text("t", text, "text")
    kept = again.path.stat()
    again.path.write_text(text.replace("\n1,10\n", "\n1,99\n"))  # as long: one value changed
    os.utime(again.path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    answer = Explorer(store).query(Args({"path": again.id, "sql": "SELECT n FROM items WHERE id = 1"}, "t"), 300)
    assert answer["rows"] == [[99]]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads a process's priority from /proc (Linux)")
@pytest.mark.parametrize("with_nice", [True, False])
def test_a_worker_runs_at_its_gateways_priority_plus_nice(with_nice: bool) -> None:
    """From a gateway already below normal priority (3), with `nice` on PATH or without it."""
    import subprocess
    import sys

    script = (
        "import os, sys, json\n"
        "os.nice(3)\n"
        "from plugins.offload import query\n"
        + ("" if with_nice else "query._niced = lambda: []\n")
        + "proc = query._SPAWNER.start()\n"
        "request = {'op': 'slice', 'address_space': query.ADDRESS_SPACE, 'seconds': 5, 'wall': 10}\n"
        "proc.stdin.write((json.dumps(request) + '\\n').encode()); proc.stdin.flush()\n"
        "proc.stdout.readline()\n"  # started: it has run its own code
        "stat = open(f'/proc/{proc.pid}/stat').read().rsplit(')', 1)[1].split()\n"
        "print(stat[16])\n"
        "query._close(proc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=query._ROOT)
    assert out.stdout.strip() == str(min(19, 3 + sql_worker.NICE)), out.stderr


def _profiled_within(result: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while query._TABLES.peek(result) is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_background_conversions_profiles_wait_for_a_pause_between_calls(tmp_path: Path, host_calls: Any) -> None:
    """The profiles cost about what the conversion did: while the host's calls keep coming they wait (the
    tables answer queries meanwhile), and they are computed once the calls pause."""
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i, "city": "Seoul"} for i in range(500)]), "json")
    calls = host_calls(0.1)
    converting = query.warm(saved.path, "json", "erin")
    assert query.tables_within(saved.path, 30) is not None  # the tables: at once
    assert not _profiled_within(saved.path, 1.5), "the profiles ran while calls kept coming"
    calls.set()
    assert _profiled_within(saved.path, 30)
    converting.join(30)


def test_an_outline_that_asks_gets_the_profiles_without_a_pause(tmp_path: Path, host_calls: Any) -> None:
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i, "city": "Seoul"} for i in range(500)]), "json")
    host_calls(0.1)
    converting = query.warm(saved.path, "json", "erin")
    assert query.tables_within(saved.path, 30) is not None
    outline = Explorer(store).outline(Args({"path": saved.id}, "t"), 2000)
    assert "profiles are being computed" in outline["tables"]
    assert _profiled_within(saved.path, 30)
    outline = Explorer(store).outline(Args({"path": saved.id}, "t"), 2000)
    assert [t["table"] for t in outline["tables"]] == ["items", "doc"]
    converting.join(30)


def test_a_gateway_started_anew_gets_the_profiles_its_first_outline_asks_for(tmp_path: Path, host_calls: Any) -> None:
    """A gateway per task: the tables were made by an earlier one (no profiles: it ended first); the new
    one's first outline starts the profiles at once, though the host's calls keep coming."""
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i, "city": "Seoul"} for i in range(500)]), "json")
    query.loaded(saved.path, "json", "erin")
    for cache in (query._LOADED, query._TABLES):  # what a process that just started knows
        cache.clear()
    host_calls(0.1)
    outline = Explorer(store).outline(Args({"path": saved.id}, "t"), 2000)
    assert isinstance(outline["tables"], str)  # being prepared: not there yet
    assert _profiled_within(saved.path, 10)


def test_a_database_kept_open_where_no_links_can_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without hard links: the file is opened under its own name, and kept by its path."""
    store = ResponseStore(tmp_path)
    saved = store.save_text("t", json.dumps([{"id": i} for i in range(10)]), "json")
    query.loaded(saved.path, "json")

    def no_links(*_: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(sql_worker.os, "link", no_links)
    kept, duckdb = sql_worker._Kept(), __import__("duckdb")
    request = {"threads": 1, "memory": "64MB", "temp": "64MB", "db": str(query.db_path(saved.path))}
    kept.cursor(request, duckdb)
    opened = kept.conn
    _, closing = kept.cursor(request, duckdb)
    assert closing is None and kept.conn is opened is not None
    kept.close()


def test_the_link_that_opens_a_database_goes_in_the_workers_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its parent removes that folder with the worker: one killed while it opens leaves no link."""
    store = ResponseStore(tmp_path / "responses")
    saved = store.save_text("t", json.dumps([{"id": i} for i in range(10)]), "json")
    query.loaded(saved.path, "json")
    own = tmp_path / "worker"
    own.mkdir()
    monkeypatch.setattr(sql_worker, "_TEMP", str(own))
    db = query.db_path(saved.path)
    assert sql_worker._link_name(db, 1).parent == own
    kept = sql_worker._Kept()
    cursor, _ = kept.cursor({"threads": 1, "memory": "64MB", "temp": "64MB", "db": str(db)}, __import__("duckdb"))
    assert cursor.execute("SELECT current_database()").fetchone() == ("result",)
    assert not list(own.iterdir()) and db.stat().st_nlink == 1
    kept.close()
