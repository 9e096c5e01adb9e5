"""Start-up as a host sees it: the upstream processes start before the gateway loads the SDK, and the first
listing has every server's tools."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PY, gateway_env, probe, stdio_gateway, text_of, write_config
from fleet import python_bin

pytestmark = pytest.mark.anyio

# what `serve` must not have imported when it starts the upstream processes: the SDK (most of the gateway's
# own start-up) and what only some calls need
LAZY = (
    "mcp",
    "mcp_types",
    "httpx",
    "httpx2",
    "uvicorn",
    "starlette",
    "duckdb",
    "markdown_it",
    "psycopg",
    "prometheus_client",
    "watchfiles",
    "ijson",
    "jsonpath_ng",
)

# run as `python -c`: the first process the gateway starts reports which of LAZY were loaded by then
SPY = """
import json, sys, anyio
async def first_process(*args, **kwargs):
    loaded = sorted(name for name in LAZY if name in sys.modules)
    print(json.dumps(loaded), flush=True)
    import os
    os._exit(0)
anyio.open_process = first_process
from gateway.cli import main
main(["serve", "--config", sys.argv[1]])
"""


def _spied(spy: str, config: Path) -> Any:
    """What a `serve` run as `python -c spy` printed (one JSON value) before it ended itself."""
    done = subprocess.run(
        [PY, "-c", spy, str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=gateway_env(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_serve_starts_the_upstreams_before_it_loads_the_sdk(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"p": probe("p")}, plugins=["offload", "memory", "documents", "monitor"])
    spy = f"LAZY = {LAZY!r}\n{SPY}"
    assert _spied(spy, config) == [], "imported before the first upstream process started"


def test_import_of_the_command_line_loads_no_sdk() -> None:
    code = f"import sys, json, gateway.cli; print(json.dumps(sorted(n for n in {LAZY!r} if n in sys.modules)))"
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=gateway_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_hook_a_host_runs_after_every_tool_call_loads_no_sdk() -> None:
    """`hook` runs after each tool call of a host (Claude Code's PostToolUse): the SDK's import was most of
    its second."""
    code = (
        "import sys, json\nfrom gateway.cli import main\nmain(['hook'])\n"
        f"print(json.dumps(sorted(n for n in {LAZY!r} if n in sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([PY, "-c", code], input="{}", capture_output=True, text=True, timeout=60, env=gateway_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


# what the modules of a stdio start (the front, the server, every plugin) must leave to the calls that need it
CALL_ONLY = (
    "jsonschema",
    "duckdb",
    "markdown_it",
    "psycopg",
    "prometheus_client",
    "gateway.proxy.upstream_client",
    "jsonpath_ng",
)


def test_a_start_leaves_what_only_some_calls_need_unloaded() -> None:
    code = (
        "import sys, json, gateway.proxy.server, gateway.proxy.host_transport\n"
        "from gateway.pipeline import load_plugins\n"
        "assert len(load_plugins(['offload', 'memory', 'documents', 'monitor'])) == 4\n"
        f"print(json.dumps(sorted(n for n in {CALL_ONLY!r} if n in sys.modules)))"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=gateway_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


async def test_the_first_listing_has_every_servers_tools(tmp_path: Path) -> None:
    """A real gateway process fronting a quick probe, one slow to start (1.5 s) and the PyPI time server:
    the host's first tools/list, sent at once, has the tools of all three; each server was started once
    (the process started ahead is the one the gateway talks to)."""
    servers = {
        "quick": probe("quick"),
        "slow": probe("slow", "--start-delay", "1.5"),
        "time": {"command": python_bin("mcp-server-time"), "args": ["--local-timezone", "UTC"]},
    }
    config = write_config(tmp_path, servers, plugins=["offload", "memory", "documents", "monitor"])
    async with stdio_gateway(config, tmp_path / "gateway.log") as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"quick__echo", "slow__echo", "time__get_current_time", "context_guide"} <= names
        pid = int(text_of(await session.call_tool("slow__pid", {})))
    for name in ("quick", "slow"):
        starts = re.findall(r"probe \w+ starting \(pid (\d+)\)", (tmp_path / "ws" / "logs" / f"{name}.log").read_text())
        assert len(starts) == 1, f"{name} was started {len(starts)} times"
        if name == "slow":
            assert int(starts[0]) == pid


def test_servers_inherit_what_the_sdk_passes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The list of inherited variables is the SDK's (it is copied to start servers before the SDK loads)."""
    from mcp.client.stdio import get_default_environment

    from gateway.proxy.upstream_spawn import inherited_environment

    monkeypatch.setenv("TERM", "() { :; }")  # a shell function is never passed on
    assert inherited_environment() == get_default_environment()


def test_sighup_is_held_before_the_command_line_loads() -> None:
    """A host's SIGHUP in the first instant must not end the gateway: the entry point holds it before it
    imports anything of the command line (settings and pydantic take a good part of a second)."""
    code = (
        "import sys, gateway.proxy.sighup as s\n"
        "held = []\n"
        "s.hold = lambda: held.append('gateway.settings' in sys.modules or 'pydantic' in sys.modules)\n"
        "sys.argv = ['mcp-context-gateway', '--version']\n"
        "import gateway.launch\n"
        "try:\n    gateway.launch.main()\nexcept SystemExit:\n    pass\n"
        "print(held)\n"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, env=gateway_env())
    assert done.stdout.strip().splitlines()[-1] == "[False]", done.stdout + done.stderr


# run as `python -c`: reports which plugins' early work `serve` ran and whether a SQL worker was started by it
EARLY_SPY = """
import json, os, sys
import gateway.early as early
ran_early = early.run
def reporting(names, disabled):
    ran = ran_early(names, disabled)
    from plugins.offload import query
    print(json.dumps({"ran": ran, "workers": len(query._AHEAD)}), flush=True)
    os._exit(0)
early.run = reporting
from gateway.cli import main
main(["serve", "--config", sys.argv[1]])
"""


@pytest.mark.parametrize("disabled", [[], ["offload"]])
def test_serve_starts_the_sql_worker_beside_its_imports(tmp_path: Path, disabled: list[str]) -> None:
    """A fresh gateway's first conversion or query took a worker that was still starting (Python and
    DuckDB's import, ~0.2 s): `serve` starts it right after the upstreams, while the SDK loads, unless
    offload is disabled."""
    config = write_config(tmp_path, {"p": probe("p")}, plugins=None, disabled_plugins=disabled)
    expected = {"ran": [], "workers": 0} if disabled else {"ran": ["offload"], "workers": 1}
    assert _spied(EARLY_SPY, config) == expected


HEAP_SPY = """
import gc, json, os, sys
import gateway.services.heap as heap
froze = heap.started
def reporting():
    froze()
    print(json.dumps({"frozen": gc.get_freeze_count() > 50_000, "left": len(gc.get_objects()) < 20_000}), flush=True)
    os._exit(0)
heap.started = reporting
from gateway.cli import main
main(["serve", "--config", sys.argv[1]])
"""


def test_serve_puts_what_its_imports_made_out_of_the_collectors_sight(tmp_path: Path) -> None:
    """Before the first call: the first large results' passes walked every object of the imports."""
    config = write_config(tmp_path, {"p": probe("p")}, plugins=None)
    assert _spied(HEAP_SPY, config) == {"frozen": True, "left": True}


def test_a_gateway_that_fails_to_start_leaves_no_worker_folder(tmp_path: Path) -> None:
    """`serve` starts the SQL worker before the plugins are configured; a start that fails there (a key
    offload does not know) never stops the plugins: its exit ends the worker and removes its folder."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = write_config(tmp_path, {"p": probe("p")}, {"offload": {"no_such_key": 1}}, plugins=None)
    for _ in range(3):
        done = subprocess.run(
            [PY, "-m", "gateway", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env=gateway_env(TMPDIR=str(temp)),
        )
        assert done.returncode == 2 and "no_such_key" in done.stderr, done.stderr
    assert not list(temp.glob("ctx-sql-*")), [str(p) for p in temp.rglob("*")]
