"""A newcomer's mistakes, run as a user runs them: one line that says what to do, exit status 2, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import PY, free_port, gateway_env, probe, run_cli, serving, write_config


def failed(out, *expected: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    for text in expected:
        assert text in out.stderr + out.stdout, out.stderr + out.stdout
    return out.stderr


def test_port_in_use_and_out_of_range(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli("serve", "--config", str(cfg), "--transport", "http", "--port", str(port), timeout=30)
        failed(out, f"port {port} on 127.0.0.1 is already in use", "--port")
    out = run_cli("serve", "--config", str(cfg), "--transport", "http", "--port", "70000", timeout=30)
    failed(out, "port 70000 is out of range: give a port between 1 and 65535")


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('command = "echo"\ncwd = "no/such/dir"\n', "cwd 'no/such/dir' is not a directory (relative to"),
        (f'command = "{PY}"\nargs = ["server.py"]\n', "the script 'server.py' does not exist relative to"),
        ('command = "echo"\ncomand = "x"\n', "unknown key 'comand' (did you mean 'command'?)"),
        ("command = npx\n", 'a text value needs quotes: command = "npx"'),
        ('command = "C:\\Users\\me\\npx.cmd"\n', "write it in 'single quotes' or with /"),
    ],
)
def test_config_mistakes(tmp_path: Path, table: str, expected: str) -> None:
    cfg = write_config(tmp_path, {})
    cfg.write_text(cfg.read_text() + "\n[servers.x]\n" + table)
    err = failed(run_cli("inspect", "--config", str(cfg)), expected)
    assert len(err.strip().splitlines()) <= 3  # the message, and at most the key it is about


def test_jsonc_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{\n  // my servers\n  "mcpServers": {"e": {"command": "echo", "args": ["x"],},},\n}\n')
    out = run_cli("stats", "--config", str(path), "--workspace", str(tmp_path / "ws"))
    assert out.returncode == 0, out.stderr


def test_command_not_on_path_is_found_by_inspect(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"fs": {"command": "npx-not-installed", "args": ["-y", "x"]}})
    out = run_cli("inspect", "--config", str(cfg))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "fs: failed: command not found: npx-not-installed" in " ".join(out.stdout.split())


def test_a_server_that_exits_at_once_shows_its_stderr(tmp_path: Path) -> None:
    script = "import sys; sys.stderr.write('missing API key FOO_TOKEN\\n'); sys.exit(1)"
    cfg = write_config(tmp_path, {"dies": {"command": PY, "args": ["-c", script]}})
    out = run_cli("inspect", "--config", str(cfg))
    text = " ".join(out.stdout.split())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "dies: failed: the server exited during start-up; its stderr says: missing API key FOO_TOKEN" in text


def test_unknown_command_and_help(tmp_path: Path) -> None:
    failed(run_cli("inpsect"), "unknown command 'inpsect' (did you mean 'inspect'?")
    top = run_cli("--help")
    assert top.returncode == 0 and "--config" in top.stdout and "runs `serve`" in top.stdout
    clean = run_cli("clean", "--help").stdout
    assert "--workspace" in clean and "--budget" not in clean and "--port" not in clean
    serve = run_cli("serve", "--help").stdout
    assert "(default 8808; [gateway] port, CTX_PORT)" in " ".join(serve.split())


def test_a_wrong_flag_or_variable_is_named_not_the_file(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    flag = failed(run_cli("inspect", "--config", str(cfg), "--max-response-size", "10"), "--max-response-size 10")
    assert str(cfg) not in flag  # the file holds nothing wrong
    host = failed(run_cli("serve", "--config", str(cfg), "--transport", "http", "--host", "0.0.0.0"), "--host 0.0.0.0")
    assert "\n  :" not in host  # no empty key name
    env = failed(run_cli("inspect", "--config", str(cfg), CTX_BUDGET="-5"), "CTX_BUDGET=-5 (gateway.budget)")
    assert str(cfg) not in env


def test_help_says_on_off_and_every_default() -> None:
    serve = " ".join(run_cli("serve", "--help").stdout.split())
    assert "(default False" not in serve and "(default True" not in serve and "(default off;" in serve
    assert "(default all)" in " ".join(run_cli("stats", "--help").stdout.split())


def test_import_of_no_servers_says_so_and_names_an_absolute_command(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text('{"mcpServers": {}}')
    out = run_cli("import", str(empty))
    assert out.returncode == 1 and "lists no servers" in out.stderr and out.stdout == ""
    one = tmp_path / "one.json"
    one.write_text('{"mcpServers": {"fs": {"command": "npx", "args": ["-y", "x"]}}}')
    header = run_cli("import", str(one)).stdout
    entry = next(line for line in header.splitlines() if '"context-gateway"' in line)
    command = entry.split('"command": "')[1].split('"')[0]
    assert Path(command).is_absolute(), entry


def test_a_bare_demo_uses_the_bundled_server_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out = run_cli("demo", timeout=120, TMPDIR=str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "the demo server that ships with the package" in out.stdout and "saved to a file" in out.stdout
    assert list(tmp_path.iterdir()) == []  # the temporary workspace is gone


def test_a_normal_http_start_is_no_warning(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(tmp_path, {"p": probe("p")})
    log = tmp_path / "stderr.txt"
    argv = [PY, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--port", str(port)]
    with open(log, "w") as err, serving(argv, f"http://127.0.0.1:{port}/nothing", gateway_env(), stderr=err):
        pass
    text = log.read_text()
    assert f"serving Streamable HTTP at http://127.0.0.1:{port}/mcp" in text and "WARNING" not in text, text


def test_an_unset_variable_is_one_line_at_start(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"x": probe("x", env={"API_KEY": "${CTX_TEST_UNSET_KEY}"})})
    for command in ("inspect", "serve"):
        err = failed(run_cli(command, "--config", str(cfg), timeout=30), "server 'x': ${CTX_TEST_UNSET_KEY}")
        assert len(err.strip().splitlines()) == 1, err


@pytest.mark.anyio
async def test_a_server_whose_variable_is_unset_fails_once_and_says_fix_the_config(tmp_path: Path) -> None:
    """Reached without the start-up check (settings built in-process): no restart loop, the calls say why."""
    from conftest import call, eventually, inproc, make_settings, text_of

    settings = make_settings(tmp_path, {"x": probe("x", env={"API_KEY": "${CTX_TEST_UNSET_KEY}"})})
    async with inproc(settings) as (gateway, session):
        up = gateway.upstreams["x"]
        await eventually(lambda: up.state == "failed")
        assert up.next_retry_at is None
        text = text_of(await call(session, "x__add", {"a": 1, "b": 2}))
        assert "fix the config: ${CTX_TEST_UNSET_KEY} is used in the config" in text, text
        assert "Try again" not in text and "restarts it" not in text, text


def test_import_keeps_a_variable_unset_in_this_shell(tmp_path: Path) -> None:
    import json
    import tomllib

    path = tmp_path / "mcp.json"
    entry = {"command": "echo", "env": {"API_KEY": "${CTX_TEST_UNSET_KEY}"}}
    path.write_text(json.dumps({"mcpServers": {"a": entry}}))
    out = run_cli("import", str(path))
    assert out.returncode == 0, out.stderr
    assert tomllib.loads(out.stdout)["servers"]["a"]["env"] == {"API_KEY": "${CTX_TEST_UNSET_KEY}"}
    assert "Traceback" not in out.stderr


NPM_404 = """import sys
for line in ["npm error code E404", "npm error 404 Not Found - GET https://registry.npmjs.org/nope", "npm error 404",
             "npm error 404  The requested resource 'nope@*' could not be found", "npm error 404",
             "npm error 404 Note that you can also install from a", "npm error 404 tarball, folder, http url, or git url.",
             "npm error A complete log of this run can be found in: /root/.npm/_logs/x-debug-0.log"]:
    print(line, file=sys.stderr)
sys.exit(1)
"""


def test_failed_starts_say_why(tmp_path: Path) -> None:
    """npm's 404, a banner on stdout, a program that echoes, arguments in `command`: each problem names its cause."""
    servers = {
        "npm": {"command": PY, "args": ["-c", NPM_404]},
        "banner": {
            "command": PY,
            "args": ["-c", "import time; print('Starting server...', flush=True); time.sleep(60)"],
        },
        "cat": {"command": "/bin/cat"},
        "onestr": {"command": f"{PY} -m foo"},
    }
    servers["banner"]["init_timeout_seconds"] = 3
    out = run_cli("inspect", "--config", str(write_config(tmp_path, servers)), timeout=60)
    text = " ".join(out.stdout.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert "its stderr says: npm error 404 The requested resource 'nope@*' could not be found" in text, text
    assert "complete log" not in text, text
    assert "it wrote to stdout not JSON: 'Starting server...'" in text, text
    assert "cat: failed: it does not speak MCP" in text, text
    assert f'holds its arguments too: give them in args, one item each: command = "{PY}", args = ["-m", "foo"]' in text


def test_args_given_as_a_string(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    cfg.write_text(cfg.read_text() + f'\n[servers.x]\ncommand = "{PY}"\nargs = "-m foo"\n')
    failed(run_cli("inspect", "--config", str(cfg)), 'args is a list, one item per argument: args = ["-m", "foo"]')


def test_a_misspelt_option_a_folder_as_config_and_the_demo_workspace(tmp_path: Path) -> None:
    out = run_cli("inspect", "--confg", "x")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith("unrecognized arguments: --confg x (did you mean --config?)")
    assert "usage: mcp-context-gateway inspect" in out.stderr  # the command's usage, not the top level's
    failed(run_cli("inspect", "--config", str(tmp_path)), f"--config {tmp_path} is a folder: name a file in it")
    demo = " ".join(run_cli("demo", "--help").stdout.split())
    assert "a new temporary folder" in demo and ".local/share" not in demo, demo


def test_inspect_verbose_lists_each_tool_and_its_cost(tmp_path: Path) -> None:
    import re

    out = run_cli("inspect", "-v", "--config", str(write_config(tmp_path, {"p": probe("p")})))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^p\s+p__add\s+~\d+ tokens$", out.stdout, re.M), out.stdout
    assert re.search(r"^p\s+p__echo\s+~\d+ tokens$", out.stdout, re.M), out.stdout


def test_a_short_auth_token_is_refused(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {})
    out = run_cli("serve", "--config", str(cfg), "--transport", "http", "--auth-token", "change-me", timeout=30)
    err = failed(out, "auth_token must be at least 16 characters", "openssl rand -hex 24")
    assert len(err.strip().splitlines()) <= 2, err
