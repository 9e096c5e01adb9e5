"""A newcomer's mistakes, run as a user runs them: one line that says what to do, exit status 2, no traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import PY, run_cli, write_config


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
    assert "dies: failed: the server exited during start-up; its last stderr line: missing API key FOO_TOKEN" in text


def test_unknown_command_and_help(tmp_path: Path) -> None:
    failed(run_cli("inpsect"), "unknown command 'inpsect' (did you mean 'inspect'?")
    top = run_cli("--help")
    assert top.returncode == 0 and "--config" in top.stdout and "runs `serve`" in top.stdout
    clean = run_cli("clean", "--help").stdout
    assert "--workspace" in clean and "--budget" not in clean and "--port" not in clean
    serve = run_cli("serve", "--help").stdout
    assert "(default 8808; [gateway] port, CTX_PORT)" in " ".join(serve.split())
