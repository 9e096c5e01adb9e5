"""Faults a hostile afternoon found (bad input, damaged files, odd config): each answered, nothing lost."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from conftest import (
    call,
    gateway_process,
    inproc,
    make_settings,
    probe,
    run_cli,
    stdio_gateway,
    text_of,
    write_config,
)

pytestmark = pytest.mark.anyio


async def test_a_lone_surrogate_fails_only_its_own_call(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, {"p": probe("p")}, tool_mode="catalog")
    async with inproc(settings) as (_, session):
        results: dict[str, object] = {}

        async def slow() -> None:
            results["slow"] = await call(session, "tool_call", {"name": "p__slow", "arguments": {"seconds": 1}})

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            bad = await call(session, "p__echo", {"text": "\ud800"})
            via_catalog = await call(session, "tool_call", {"name": "p__echo", "arguments": {"text": "a\udfffb"}})
        assert bad.is_error and "`text`" in text_of(bad) and "Nothing was sent" in text_of(bad)
        assert via_catalog.is_error and "`text`" in text_of(via_catalog)
        assert text_of(results["slow"]) == "slept"  # the call in flight on the same upstream was not hurt
        assert text_of(await call(session, "p__echo", {"text": "안녕"})) == "안녕"


async def test_invalid_host_requests_on_stdio_are_answered(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    process = await gateway_process(cfg, tmp_path / "gw.err")
    async with process:
        assert process.stdin is not None and process.stdout is not None
        buffer = b""

        async def send(obj: object) -> None:
            await process.stdin.send((obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n")

        async def receive() -> dict:
            nonlocal buffer
            with anyio.fail_after(20):
                while b"\n" not in buffer:
                    buffer += await process.stdout.receive()
            line, _, buffer = buffer.partition(b"\n")
            return json.loads(line)

        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        await send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        assert (await receive())["id"] == 1
        await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await send({"jsonrpc": "2.0", "id": 901, "method": "tools/call", "params": "x"})
        bad_params = await receive()
        await send([{"jsonrpc": "2.0", "id": 3, "method": "ping"}])
        batch = await receive()
        await send({"jsonrpc": "2.0", "id": 902})
        no_method = await receive()
        await send("this is not json")
        not_json = await receive()
        await send({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        listed = await receive()
        await process.stdin.aclose()
    assert bad_params["id"] == 901 and bad_params["error"]["code"] == -32602
    assert batch["id"] is None and batch["error"]["code"] == -32600
    assert no_method["id"] == 902 and no_method["error"]["code"] == -32600
    assert not_json["id"] is None and not_json["error"]["code"] == -32700
    assert listed["id"] == 4 and "tools" in listed["result"]  # and it keeps serving
    log = (tmp_path / "gw.err").read_text()
    assert "the host sent" in log and "upstream wrote" not in log


async def test_every_way_of_naming_a_file_is_confined_and_temp_files_never_served(tmp_path: Path) -> None:
    responses = tmp_path / "ws" / "responses"
    responses.mkdir(parents=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    os.symlink(secret, responses / "evil-deadbeef.txt")
    stale = responses / ".p__big-0badc0de.txt.999999999.1.tmp"  # a writer process that is gone
    stale.write_text("half a result")
    live = responses / f".p__big-0badc0df.txt.{os.getpid()}.1.tmp"  # a write still in progress
    live.write_text("being written")
    settings = make_settings(tmp_path, {}, plugins=["offload", "documents"])
    async with inproc(settings) as (_, session):
        for tool, args in [
            ("response_outline", {"path": "resp_deadbeef"}),
            ("response_search", {"path": "resp_deadbeef", "query": "password"}),
            ("doc_search", {"query": "password", "doc_id": "resp_deadbeef"}),
            ("response_outline", {"path": live.name}),
        ]:
            result = await call(session, tool, args)
            assert result.is_error and "hunter2" not in text_of(result) and "being written" not in text_of(result)
    assert not stale.exists() and live.exists()  # removed at start, unless its writer still runs


@pytest.mark.parametrize(
    ("gateway", "extra", "message"),
    [
        ({"workspace": "relative/ws"}, "", "is a relative path"),
        ({"budget": -1}, "", "budget: Input should be greater than or equal to 0"),
        ({"context_window": -5}, "", "context_window: Input should be greater than or equal to 0"),
        ({"port": 70000}, "", "port 70000 is out of range: give a port between 1 and 65535"),
        (
            {"plugins": ["offload"]},
            "[plugins.offload]\nresponse_ttl_hours = -1\n",
            "response_ttl_hours: Input should be greater than 0",
        ),
        ({}, "[servers.x]\ncommand = 'echo'\ncwd = '/no/such/dir'\n", "cwd '/no/such/dir' is not a directory"),
    ],
)
def test_wrong_config_values_are_one_line_errors(tmp_path: Path, gateway: dict, extra: str, message: str) -> None:
    cfg = write_config(tmp_path, {}, **gateway)
    cfg.write_text(cfg.read_text() + "\n" + extra)
    result = run_cli("inspect", "--config", str(cfg))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (Path("/") / "relative").exists()


def test_unreadable_config_and_unwritable_workspace_are_one_line_errors(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("[gateway]\nbudget = 4000 # caf\xe9\n".encode("latin-1"))
    result = run_cli("inspect", "--config", str(latin1))
    assert result.returncode == 2 and "is not UTF-8 text" in result.stderr and "Traceback" not in result.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cfg = write_config(tmp_path, {}, workspace=str(blocker / "ws"))
    result = run_cli("inspect", "--config", str(cfg))
    assert result.returncode == 2 and "is not writable" in result.stderr and "Traceback" not in result.stderr


async def test_small_input_holes(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "a.md").write_text("# A\n\ntext")
    settings = make_settings(
        tmp_path, {}, plugin_settings={"documents": {"ingest_roots": [str(root)]}}, plugins=["documents", "memory"]
    )
    async with inproc(settings) as (_, session):
        empty = await call(session, "doc_ingest", {"file_path": ""})
        assert empty.is_error and "`file_path` is empty" in text_of(empty)  # not the whole root
        newline = await call(session, "context_append", {"session_id": "x\n", "text": "t"})
        assert newline.is_error and "session_id" in text_of(newline)
    assert not [p for p in (tmp_path / "ws").rglob("*") if "\n" in p.name]


# A parent that names itself "x한글한글한" (16 bytes: Linux keeps 15, cutting the last character in half),
# then runs the gateway as its child on the same stdio.
_CUT_NAME_PARENT = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, ctypes.c_char_p("x한글한글한".encode()), 0, 0, 0)  # PR_SET_NAME
sys.stderr.buffer.write(b"parent comm: " + open("/proc/self/comm", "rb").read())
sys.stderr.flush()
sys.exit(subprocess.call([sys.executable, "-m", "gateway", "--config", sys.argv[1]]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_NAME and /proc are Linux")
async def test_a_stdio_gateway_starts_under_a_parent_whose_name_is_not_utf8(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")})
    errlog_path = tmp_path / "gw.err"
    with anyio.fail_after(30):
        async with stdio_gateway(cfg, errlog_path, ["-c", _CUT_NAME_PARENT, str(cfg)]) as session:
            assert text_of(await call(session, "p__echo", {"text": "안녕"})) == "안녕"
    err = errlog_path.read_bytes()
    assert b"parent comm: " + "x한글한글한".encode()[:15] + b"\n" in err  # the parent's name really was cut
    assert b"Traceback" not in err and b"UnicodeDecodeError" not in err, err.decode("utf-8", "replace")
