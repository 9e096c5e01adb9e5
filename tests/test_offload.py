"""Offload: oversized results become files; the exploration tools answer in small pieces."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import token_corpus
from conftest import call, eventually, inproc, make_settings, probe, run_cli, text_of, write_config
from mcp import MCPError

from plugins.offload import json_file

pytestmark = pytest.mark.anyio


def ref_of(result: types.CallToolResult) -> dict[str, Any]:
    reply = json.loads(text_of(result))
    assert "fileRef" in reply, reply
    return reply


def cl100k(text: str) -> int:
    return len(token_corpus.tokenizers()["cl100k"].encode(text))


def offload_settings(tmp_path: Path, **server: Any):
    return make_settings(tmp_path, {"p": probe("p", **server)}, plugins=["offload"])


async def test_big_json_is_replaced_by_a_small_file_reference(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path, max_response_size=262144)) as (_, session):
        result = await call(session, "p__big", {"size": 2_000_000})
        assert not result.is_error and len(result.content) == 2
        assert isinstance(result.content[1], types.ResourceLink)  # the same file, for hosts that show links
        reply = ref_of(result)
        ref = reply["fileRef"]
        assert ref["id"].startswith("resp_") and ref["kind"] == "json"
        path = Path(ref["path"])
        assert path.parent == tmp_path / "ws" / "responses" and path.name.startswith("p__big-")
        assert path.suffix == ".json" and ref["size"] == path.stat().st_size > 1_900_000
        assert ref["sizeHint"].endswith("MB") and "262.1 kB" in ref["maxSizeHint"]
        assert ref["tokens"] > 400_000 and ref["openCmd"].endswith(str(path))
        assert reply["outline"]["keys"] == ["data", "meta"] and reply["outline"]["itemCount"]["data"] == 25000
        assert reply["next"] == f"response_outline(path='{ref['id']}')"
        # the reply is small whatever the input, measured with a real tokenizer
        assert cl100k(text_of(result)) <= 300
        body = json.loads(path.read_text())
        assert len(body["data"]) == 25000 and body["data"][7]["name"] == "item-7"


@pytest.mark.parametrize("tokenizer", ["auto", "cl100k"])
async def test_the_tokenizer_setting_decides_what_is_offloaded(tmp_path: Path, tokenizer: str) -> None:
    """A log whose estimate for the widest tokenizer is above the limit and whose cl100k estimate is
    below it: offloaded under `auto`, passed whole to a host that counts in cl100k (and the cl100k
    estimate is still above the real count, so that host's window is not overrun)."""
    from gateway.services.tokens import TokenEstimator

    line = "2026-11-30T10:00:00Z INFO request handled path=/api/items status=200\n"  # the probe's `text`
    size = 40_000
    text = (line * (size // len(line) + 1))[:size]
    narrow, wide = TokenEstimator("cl100k").estimate(text), TokenEstimator("auto").estimate(text)
    assert cl100k(text) <= narrow < wide
    limit = (narrow + wide) // 2
    settings = make_settings(
        tmp_path, {"p": probe("p", max_response_tokens=limit)}, plugins=["offload"], tokenizer=tokenizer
    )
    async with inproc(settings) as (_, session):
        result = await call(session, "p__big", {"size": size, "kind": "text"})
    if tokenizer == "auto":
        assert ref_of(result)["fileRef"]["tokens"] == wide
    else:
        assert text_of(result) == text


async def test_small_results_pass_untouched_and_token_limit_applies(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path, max_response_tokens=1000)) as (_, session):
        echo = await call(session, "p__echo", {"text": "short"})
        assert text_of(echo) == "short"
        add = await call(session, "p__add", {"a": 1, "b": 2})
        assert add.structured_content == {"sum": 3.0}
        # 30 KB of log text is far under the byte limit but over 1000 tokens
        log = await call(session, "p__big", {"size": 30_000, "kind": "text"})
        ref = ref_of(log)["fileRef"]
        assert ref["kind"] == "text" and ref["path"].endswith(".txt") and ref["size"] == 30_000


async def test_output_schemas_are_hidden_only_when_offload_is_on(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path)) as (_, session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert tools["p__add"].output_schema is None
        assert {"response_outline", "response_compress", "response_slice", "response_search"} <= set(tools)
    async with inproc(make_settings(tmp_path, {"p": probe("p")}, plugins=[])) as (_, session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert tools["p__add"].output_schema is not None


async def test_images_blobs_multi_block_structured_and_errors(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path, max_response_size=4096)) as (_, session):
        image = ref_of(await call(session, "p__big", {"size": 20_000, "kind": "image"}))["fileRef"]
        assert image["kind"] == "binary" and image["mime"] == "image/png" and image["path"].endswith(".png")
        assert image["fileSize"] == 20_000  # the PNG on disk
        assert image["size"] == 26_668 and image["tokens"] == 1600  # the base64 in the result; an image's cost
        outline = await call(session, "response_outline", {"path": image["id"]})
        assert outline.structured_content["type"] == "binary"
        sliced = await call(session, "response_slice", {"path": image["id"], "start_line": 1, "end_line": 2})
        assert sliced.is_error and "binary" in text_of(sliced)

        # structuredContent that repeats the text is saved once; structured-only content is saved as JSON
        both = ref_of(await call(session, "p__big", {"size": 50_000, "kind": "structured"}))
        assert "files" not in both and both["fileRef"]["kind"] == "json"
        only = ref_of(await call(session, "p__big", {"size": 50_000, "kind": "structured-only"}))
        parts = {f["part"]: f for f in only["files"]}
        assert parts["structuredContent"]["kind"] == "json" and parts["content[0]"]["kind"] == "text"

        err = await call(session, "p__big", {"size": 10_000, "kind": "error"})
        assert err.is_error and ref_of(err)["fileRef"]["kind"] == "text" and "error output" in text_of(err)

    # several blocks: one file per block, all listed
    async with inproc(offload_settings(tmp_path, max_response_size=256)) as (_, session):
        multi = ref_of(await call(session, "p__multi", {"pad": 300}))
        kinds = [(f["part"].split()[0], f["kind"]) for f in multi["files"]]
        assert kinds == [("content[0]", "text"), ("content[1]", "binary"), ("content[2]", "binary")]
        blob_id = multi["files"][2]["id"]
        blob = next((tmp_path / "ws" / "responses").glob(f"*-{blob_id[5:]}.*"))
        assert blob.read_bytes() == b"\x00\x01binary"
        png = next((tmp_path / "ws" / "responses").glob(f"*-{multi['files'][1]['id'][5:]}.png"))
        assert png.read_bytes() == base64.b64decode(
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
        )


# the large file only has to be past SMALL_FILE (4 MiB) to be streamed, not parsed whole: 5 MB (it was
# 9 MB, twice the time for the same paths)
@pytest.mark.parametrize("size", [400_000, 5_000_000], ids=["parsed-small-file", "streamed-large-file"])
async def test_json_exploration(tmp_path: Path, size: int) -> None:
    assert (size > json_file.SMALL_FILE) == (size == 5_000_000)
    async with inproc(offload_settings(tmp_path, max_response_size=262144)) as (_, session):
        ref = ref_of(await call(session, "p__big", {"size": size}))["fileRef"]
        rid = ref["id"]
        assert (Path(ref["path"]).stat().st_size > json_file.SMALL_FILE) == (size == 5_000_000)
        n = size // 80

        outline = (await call(session, "response_outline", {"path": rid})).structured_content
        assert outline["type"] == "object" and outline["keys"] == ["data", "meta"]
        assert outline["itemCount"]["data"] == n
        assert outline["structure"]["meta.n"] == {"type": "number", "value": n}
        assert outline["samples"]["data"][0]["name"] == "item-0"
        # every hint is a ready-to-send call that works
        for hint in outline["compressionHints"]:
            tool, _, rest = hint.partition("(")
            if "<" in rest:
                continue
            args = eval(f"dict({rest[:-1]})")  # the hints are Python-style keyword calls
            assert not (await call(session, tool, args)).is_error, hint

        first = (await call(session, "response_slice", {"path": rid, "json_path": "data.3.name"})).structured_content
        assert first["value"] == "item-3"
        last = (await call(session, "response_slice", {"path": rid, "json_path": "$.data[-1]"})).structured_content
        assert last["value"]["id"] == n - 1 and last["json_path"] == f"data.{n - 1}"
        item = (await call(session, "response_slice", {"path": rid, "json_path": "data.10"})).structured_content
        assert item["next_path"] == "data.11" and item["prev_path"] == "data.9"
        end = (await call(session, "response_slice", {"path": rid, "json_path": f"data.{n - 1}"})).structured_content
        assert end["next_path"] is None
        wild = await call(session, "response_slice", {"path": rid, "json_path": "$.data[0].tags[*]"})
        assert wild.structured_content["value"] == ["a", "b"]
        names = (await call(session, "response_slice", {"path": rid, "json_path": "$.data[*].name"})).structured_content
        assert names["value"][:3] == ["item-0", "item-1", "item-2"]
        assert names["total"] == n and names["shown"] == len(names["value"]) < n  # the total, not "more"
        assert f"{names['shown']} of {n} matches shown" in names["note"]
        cheap = await call(session, "response_slice", {"path": rid, "json_path": "$.data[?(@.id == 7)].name"})
        assert cheap.structured_content["value"][0] == "item-7"
        whole = (await call(session, "response_slice", {"path": rid, "json_path": "data"})).structured_content
        assert "cut to the token budget" in whole["note"] and "data.0" in whole["note"]

        out_of_range = await call(session, "response_slice", {"path": rid, "json_path": f"data.{n + 5}"})
        assert out_of_range.is_error and f"has {n} items" in text_of(out_of_range)
        no_key = await call(session, "response_slice", {"path": rid, "json_path": "dta.0"})
        assert no_key.is_error
        bad = await call(session, "response_slice", {"path": rid, "json_path": "$.data[?(@.x >"})
        assert bad.is_error and "Traceback" not in text_of(bad)

        sample = (
            await call(
                session,
                "response_compress",
                {
                    "path": rid,
                    "mode": "sample_array",
                    "json_path": "data",
                    "array_head": 2,
                    "array_tail": 1,
                },
            )
        ).structured_content["value"]
        assert [x["id"] for x in sample[:2]] == [0, 1] and sample[3]["id"] == n - 1
        assert sample[2] == f"…({n - 3} items omitted)"
        firsts = (
            await call(session, "response_compress", {"path": rid, "mode": "first_of_array", "json_path": "data"})
        ).structured_content["value"]
        assert firsts[0]["tags"] == ["a", "…(+1 more items)"] and firsts[1] == f"…(+{n - 1} more items)"
        keys = (await call(session, "response_compress", {"path": rid, "mode": "keys_only"})).structured_content
        assert "data" in json.dumps(keys["value"])
        picked = await call(
            session, "response_compress", {"path": rid, "mode": "select_keys", "json_path": "data", "keys": ["id"]}
        )
        value = picked.structured_content.get("value")
        if value is None:  # too large even so: saved as a new file with a hint
            assert picked.structured_content["fileRef"]["id"].startswith("resp_")
            assert "narrow json_path" in picked.structured_content["hint"]
            saved = json.loads(Path(picked.structured_content["fileRef"]["path"]).read_text())
            assert len(saved) == n and saved[-1] == {"id": n - 1}
        else:
            assert value[0] == {"id": 0}
        truncated = (
            await call(
                session,
                "response_compress",
                {"path": rid, "mode": "truncate_strings", "json_path": "data.5", "max_length": 3},
            )
        ).structured_content
        assert truncated["value"]["name"] == "ite…(+3)"

        found = (
            await call(session, "response_search", {"path": rid, "query": "item-77", "limit": 3})
        ).structured_content
        assert found["matches"][0]["path"] == "data.77" and found["matches"][0]["matches"] == {"name": "item-77"}
        junk = await call(session, "response_search", {"path": rid, "query": "((( *** )))"})
        assert junk.is_error and "no searchable words" in text_of(junk)


async def test_text_exploration_and_korean(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path, max_response_size=4096)) as (_, session):
        rid = ref_of(await call(session, "p__big", {"size": 200_000, "kind": "text"}))["fileRef"]["id"]
        outline = (await call(session, "response_outline", {"path": rid})).structured_content
        total = outline["lines"]
        assert total == 200_000 // 69 + 1 and outline["levels"] == {"INFO": total}
        assert outline["commonShapes"][0]["shape"].startswith("#-#-#T#:#:#Z INFO")
        part = (
            await call(session, "response_slice", {"path": rid, "start_line": 10, "end_line": 14})
        ).structured_content
        assert len(part["lines"]) == 5 and part["next"] == {"start_line": 15, "end_line": 19}
        assert part["prev"] == {"start_line": 5, "end_line": 9}
        past = await call(session, "response_slice", {"path": rid, "start_line": total + 10, "end_line": total + 20})
        assert past.is_error and f"{total} lines" in text_of(past)
        backwards = await call(session, "response_slice", {"path": rid, "start_line": 9, "end_line": 3})
        assert backwards.is_error
        hits = (
            await call(session, "response_search", {"path": rid, "query": "status=200", "limit": 2})
        ).structured_content
        assert hits["total"] == total - 1 and len(hits["matches"]) == 2 and hits["next_offset"] == 2
        jsonpath_on_text = await call(session, "response_slice", {"path": rid, "json_path": "a.b"})
        assert jsonpath_on_text.is_error and "start_line" in text_of(jsonpath_on_text)

        korean = "\n".join(token_corpus.korean(40)) + "\n세션을 저장하지 못했습니다: 오류 E1234\n"
        await call(session, "p__echo", {"text": "warm"})
        ko = ref_of(await call(session, "p__echo", {"text": korean}))["fileRef"]["id"]
        found = (await call(session, "response_search", {"path": ko, "query": "세션 E1234"})).structured_content
        assert "E1234" in found["matches"][0]["text"] and found["matches"][0]["score"] == 2


async def test_bad_paths_and_broken_files(tmp_path: Path) -> None:
    async with inproc(offload_settings(tmp_path, max_response_size=4096)) as (_, session):
        rid = ref_of(await call(session, "p__big", {"size": 10_000}))["fileRef"]["id"]
        for bad in ["/etc/passwd", "../../etc/passwd", "resp_deadbeef", "", "x\x00y"]:
            result = await call(session, "response_outline", {"path": bad})
            assert result.is_error, bad
            assert "Traceback" not in text_of(result)
        assert rid in text_of(await call(session, "response_outline", {"path": "resp_deadbeef"}))
        outside = tmp_path / "secret.json"
        outside.write_text("{}")
        link = tmp_path / "ws" / "responses" / "link-0000aaaa.json"
        link.symlink_to(outside)
        escaped = await call(session, "response_outline", {"path": str(link)})
        assert escaped.is_error and "outside the response workspace" in text_of(escaped)
        wrong_type = await call(session, "response_slice", {"path": rid, "start_line": "ten"})
        assert wrong_type.is_error and "whole number" in text_of(wrong_type)
        missing = await call(session, "response_compress", {"path": rid})
        assert missing.is_error and "`mode` is required" in text_of(missing)
        broken = tmp_path / "ws" / "responses" / "p__x-0badc0de.json"
        broken.write_text('{"data": [1, 2, ')
        result = await call(session, "response_outline", {"path": "resp_0badc0de"})
        assert result.is_error and "not valid JSON" in text_of(result)
        # search still works on a broken JSON file, as text
        assert not (await call(session, "response_search", {"path": "resp_0badc0de", "query": "data"})).is_error


def test_ttl_cleanup_at_start_and_clean_command(tmp_path: Path) -> None:
    responses = tmp_path / "ws" / "responses"
    responses.mkdir(parents=True)
    old, new = responses / "a__b-00000001.json", responses / "a__b-00000002.json"
    old.write_text("{}")
    new.write_text("{}")
    three_days_ago = time.time() - 3 * 86400
    os.utime(old, (three_days_ago, three_days_ago))
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload"])
    out = run_cli("inspect", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert not old.exists() and new.exists()
    spilled = tmp_path / "ws" / "spill" / "999999999-3.txt"  # left by a gateway killed mid-reply
    spilled.parent.mkdir(parents=True, exist_ok=True)
    spilled.write_text("partial")
    out = run_cli("clean", "--config", str(cfg))
    assert out.returncode == 0 and "removed 1 files" in out.stdout and not new.exists()
    assert not spilled.exists()


async def test_a_full_workspace_gets_is_error_never_the_oversized_result(tmp_path: Path) -> None:
    """The gateway runs with a 2 MB file size limit (RLIMIT_FSIZE, as a full disk would stop it)."""
    from conftest import PY, gateway_env
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client

    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload", "memory"])
    limited = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000)); "
        "from gateway.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    responses = tmp_path / "ws" / "responses"
    with open(tmp_path / "gw.err", "wb") as errlog:
        async with (
            linear_stdio_client(PY, ["-c", limited, "--config", str(cfg)], gateway_env(), None, errlog) as streams,
            ClientSession(*streams) as session,
        ):
            await session.initialize()
            big = await call(session, "p__big", {"size": 5_000_000, "kind": "text"})
            assert big.is_error and "could not be saved to the workspace" in text_of(big)
            assert "mcp-context-gateway clean" in text_of(big) and len(text_of(big)) < 1000
            assert not (list(responses.iterdir()) if responses.exists() else [])  # no partial or temp file
            small = await call(session, "p__big", {"size": 600_000, "kind": "text"})
            assert "fileRef" in text_of(small)  # the gateway keeps serving; what fits is offloaded
            note = await call(session, "context_append", {"session_id": "full", "text": "still writable"})
            assert not note.is_error


async def test_offload_policies_per_tool(tmp_path: Path) -> None:
    """`offload_tools`: never (inline whatever the size; outputSchema kept), always (a file even when
    small), auto (the size rule) for the rest."""
    policies = {"add": "never", "echo": "never", "big": "always"}
    settings = make_settings(
        tmp_path,
        {"p": probe("p", offload_tools=policies), "q": probe("q")},
        plugins=["offload"],
        max_response_size=65536,
    )
    async with inproc(settings) as (_, session):
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert listed["p__add"].output_schema is not None and listed["q__add"].output_schema is None
        text = "세션 " * 60_000  # ~480 KB
        assert text_of(await call(session, "p__echo", {"text": text})) == text
        assert "fileRef" in json.loads(text_of(await call(session, "q__echo", {"text": text})))
        small = json.loads(text_of(await call(session, "p__big", {"size": 100, "kind": "text"})))
        assert small["fileRef"]["size"] == 100 and "as every result of this tool is" in small["fileRef"]["message"]
        assert Path(small["fileRef"]["path"]).read_text().startswith("2026-11-30T10:00:00Z INFO")


async def test_the_resource_link_reads_the_saved_result_in_pieces(tmp_path: Path) -> None:
    """The fileRef's resource_link is served by resources/read on the gateway, 64 KB at a time, each
    piece cut at a character boundary, with the next piece's URI in `_meta`."""
    async with inproc(offload_settings(tmp_path, max_response_size=65536)) as (_, session):
        text = "세션 기록 " * 40_000  # 560 KB of 3-byte characters: pieces must not split one
        result = await call(session, "p__echo", {"text": text})
        link = next(b for b in result.content if isinstance(b, types.ResourceLink))
        assert link.size == len(text.encode()) and link.mime_type == "text/plain"
        pieces, uri = [], str(link.uri)
        while uri:
            read = await session.read_resource(uri)
            piece = read.contents[0]
            assert len(piece.text.encode()) <= 65536 and "\ufffd" not in piece.text
            pieces.append(piece.text)
            uri = (piece.meta or {}).get("next")
        assert "".join(pieces) == text and len(pieces) > 8
        middle = await session.read_resource(f"{link.uri}?offset=99989&length=10")  # inside a character
        assert middle.contents[0].meta["offset"] == 99991 and middle.contents[0].text in text
        with pytest.raises(MCPError, match="no offloaded response has the id"):
            await session.read_resource("gateway-response://resp_00000000")


async def test_what_a_crash_left_in_the_responses_folder_never_turns_offload_off(tmp_path: Path) -> None:
    """A query's spill folder left by a stop at its time limit, a conversion's scratch pieces and DuckDB
    folder of a gateway killed mid-way, and an entry nothing can remove: the gateway starts, removes what
    it can, says in one line what it cannot, and offloads as before."""
    import subprocess

    from conftest import PY, gateway_env
    from mcp import ClientSession

    from gateway.proxy.upstream_stdio import linear_stdio_client
    from gateway.services.files import writer_tag

    responses = tmp_path / "ws" / "responses"
    responses.mkdir(parents=True)
    spill = responses / ".p__big-0000beef.json.duckdb.tmp"  # a query stopped at its time limit
    spill.mkdir()
    (spill / "duckdb_temp_storage-0.tmp").write_bytes(b"\0" * 4096)
    child = subprocess.Popen(["true"])
    child.wait()
    dead = f"{child.pid}~{writer_tag().split('~')[1]}"  # a gateway of this host that is gone
    scratch = responses / f".p__big-0000beef.json.scratch.{dead}.140.tmp"
    for piece in (scratch, scratch.with_name(scratch.name + ".1")):
        piece.write_text("partial")
    convert_spill = responses / f".p__big-0000beef.json.duckdb.{dead}.140.tmp.tmp"
    (convert_spill / "inner").mkdir(parents=True)
    stuck = responses / f".p__big-0000cafe.json.duckdb.{dead}.141.tmp.tmp"
    stuck.mkdir()
    (stuck / "pinned").write_text("x")
    pinned = subprocess.run(["chattr", "+i", str(stuck / "pinned")], capture_output=True).returncode == 0
    hour_ago = time.time() - 3600
    os.utime(spill, (hour_ago, hour_ago))
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload"])
    errlog = tmp_path / "gw.err"
    try:
        with open(errlog, "wb") as err:
            async with (
                linear_stdio_client(PY, ["-m", "gateway", "--config", str(cfg)], gateway_env(), None, err) as streams,
                ClientSession(*streams) as session,
            ):
                await session.initialize()
                assert "response_outline" in {t.name for t in (await session.list_tools()).tools}
                big = await call(session, "p__big", {"size": 300_000, "kind": "json"})
                rid = ref_of(big)["fileRef"]["id"]
                assert not (await call(session, "response_outline", {"path": rid})).is_error
    finally:
        if pinned:
            subprocess.run(["chattr", "-i", str(stuck / "pinned")])
    assert not any(p.exists() for p in (spill, scratch, convert_spill))
    log = errlog.read_text()
    assert "Traceback" not in log
    if pinned:
        said = [line for line in log.splitlines() if "pinned" in line]
        assert len(said) == 1 and "remove it by hand" in said[0], log


async def test_a_large_result_is_counted_off_the_event_loop_beside_its_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counting a few MB's tokens takes tens of milliseconds: a result over the size limit is offloaded
    without its count deciding it, and counted in the offload's thread once its conversion started;
    a mid-size one is counted in a thread too. Only a small result is counted on the event loop."""
    import threading

    import gateway.plugin
    import plugins.offload.query as query

    loop_thread = threading.current_thread()
    events: list[tuple[str, int, bool]] = []  # (what, size of the result's text, on the loop)
    real_cost, real_tables_now = gateway.plugin.result_cost, query.tables_now

    def result_cost(result: types.CallToolResult, *known: Any) -> Any:
        size = sum(len(b.text) for b in result.content if isinstance(b, types.TextContent))
        events.append(("count", size, threading.current_thread() is loop_thread))
        return real_cost(result, *known)

    def tables_now(path: Path, kind: str, namespace: str = "") -> Any:
        events.append(("convert", path.stat().st_size, threading.current_thread() is loop_thread))
        return real_tables_now(path, kind, namespace)

    monkeypatch.setattr(gateway.plugin, "result_cost", result_cost)
    monkeypatch.setattr(query, "tables_now", tables_now)
    settings = offload_settings(tmp_path, max_response_size=262144, max_response_tokens=100_000)
    async with inproc(settings) as (_, session):
        big = await call(session, "p__big", {"size": 2_000_000})
        assert ref_of(big)["fileRef"]["tokens"] > 400_000  # counted all the same
        counts = [e for e in events if e[0] == "count" and e[1] > 1_000_000]
        assert counts and not any(on_loop for _, _, on_loop in counts), events
        first = events.index(counts[0])
        assert any(e[0] == "convert" for e in events[:first]), events  # the count overlaps the conversion
        events.clear()
        middle = await call(session, "p__echo", {"text": "word " * 8_000})  # 40 KB: under the limits
        assert not middle.is_error and "fileRef" not in text_of(middle)
        counts = [e for e in events if e[0] == "count" and e[1] >= 40_000]
        assert counts and not any(on_loop for _, _, on_loop in counts), events


async def test_a_result_surely_over_the_token_limit_is_not_counted_before_its_offload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result under the size limit but far over the token limit (a 300 KB log against a few thousand
    tokens): its first few tens of KB tell it is over, so its conversion starts at once and the whole
    count (~0.1 s with the real tokenizers) is taken beside it, not before it."""
    import gateway.plugin
    import gateway.services.costs as costs
    import gateway.services.tokens as tokens
    import plugins.offload.query as query

    events: list[tuple[str, int]] = []
    real_cost, real_tables_now = gateway.plugin.result_cost, query.tables_now

    def result_cost(result: types.CallToolResult, *known: Any) -> Any:
        events.append(("count", sum(len(b.text) for b in result.content if isinstance(b, types.TextContent))))
        return real_cost(result, *known)

    def tables_now(path: Path, kind: str, namespace: str = "") -> Any:
        events.append(("convert", path.stat().st_size))
        return real_tables_now(path, kind, namespace)

    monkeypatch.setattr(gateway.plugin, "result_cost", result_cost)
    monkeypatch.setattr(query, "tables_now", tables_now)
    exact = tokens.TokenEstimator()  # as in a gateway a few seconds after its first long result
    assert exact.load_exact()
    monkeypatch.setattr(tokens, "ESTIMATOR", exact)
    monkeypatch.setattr(costs, "ESTIMATOR", exact)
    settings = offload_settings(tmp_path, max_response_size=1_048_576, max_response_tokens=2_000)
    async with inproc(settings) as (_, session):
        log = await call(session, "p__echo", {"text": "2026-12-07 status installed libfoo:amd64 1.2\n" * 6_000})
        assert ref_of(log)["fileRef"]["tokens"] > 2_000
        whole = [i for i, e in enumerate(events) if e[0] == "count" and e[1] > 200_000]
        assert whole and events[0][0] == "convert", events  # counted whole only once its conversion started


async def test_a_result_to_count_never_waits_behind_the_callers_offloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's offloads may hold all its places in the offload share for seconds (a fileRef waits for
    its tables): a mid-size result, counted to decide, is answered meanwhile."""
    import threading

    import plugins.offload.fileref as fileref

    real_offload, release, holding = fileref.offload, threading.Event(), []

    def held_offload(*args: Any) -> Any:
        holding.append(1)
        release.wait(30)  # stands in for a slow conversion the fileRef waits for
        return real_offload(*args)

    monkeypatch.setattr(fileref, "offload", held_offload)
    settings = offload_settings(tmp_path, max_response_size=262144, max_response_tokens=100_000)
    async with inproc(settings) as (_, session), anyio.create_task_group() as tg:
        for _ in range(4):  # the caller's share of offloads
            tg.start_soon(call, session, "p__big", {"size": 400_000})
        await eventually(lambda: len(holding) == 4, what="four offloads under way")
        try:
            with anyio.fail_after(10):
                middle = await call(session, "p__echo", {"text": "word " * 8_000})  # 40 KB: counted, not offloaded
            assert "fileRef" not in text_of(middle)
        finally:
            release.set()


async def test_an_offload_that_fails_unexpectedly_never_passes_the_oversized_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import plugins.offload.fileref as fileref

    def broken(*args: Any) -> Any:
        raise ValueError("Error serializing to JSON: surrogates not allowed")  # as pydantic says of a lone surrogate

    monkeypatch.setattr(fileref, "offload", broken)
    async with inproc(offload_settings(tmp_path, max_response_size=262144)) as (_, session):
        result = await call(session, "p__big", {"size": 2_000_000})
        assert result.is_error and len(text_of(result)) < 1000, text_of(result)[:200]
        assert "too large for the context" in text_of(result) and "surrogates" in text_of(result)
