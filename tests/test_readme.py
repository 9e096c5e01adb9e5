"""The README's minimal gateway.toml as a new user copies it: its paths pointed at a folder of the test's,
it loads, and (where npm exists) `inspect` starts every server in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from gateway.settings import load_settings

README_USER = "/home/me"  # the README's example home: every path in the block lives below it


def readme_minimal_config(tmp_path: Path) -> tuple[Path, str]:
    """The README's first ```toml block, its `/home/me` paths moved below `tmp_path`; (file, text)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^```toml\n(\[gateway\]\n.*?)^```", readme, re.S | re.M)
    assert found, "README.md has no ```toml block starting with [gateway]"
    block = found.group(1)
    assert "[servers.fs]" in block and "server-filesystem" in block, block
    assert block.count("\n") <= 20, "the minimal config should stay about a dozen lines"
    projects = tmp_path / "projects"
    projects.mkdir()
    (projects / "notes.md").write_text("# notes\n", encoding="utf-8")
    text = block.replace(README_USER, str(tmp_path))
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return path, text


def test_the_readme_minimal_config_loads(tmp_path: Path) -> None:
    path, _ = readme_minimal_config(tmp_path)
    settings = load_settings(path, environ={})
    assert set(settings.servers) == {"fs", "demo"}
    assert settings.gateway.workspace == tmp_path / ".local/share/mcp-context-gateway"
    assert settings.gateway.budget == 4000
    assert settings.servers["fs"].args[-1] == str(tmp_path / "projects")  # an absolute path, as the README says
    assert settings.servers["demo"].max_response_size == 262144


@pytest.mark.npm
def test_the_readme_minimal_config_starts_every_server(tmp_path: Path) -> None:
    """`inspect` on the block: the filesystem server is the pinned npm one the tests install (npx would
    fetch whatever is newest), everything else as written."""
    from npm_servers import npm_bin

    _, text = readme_minimal_config(tmp_path)
    npx = 'command = "npx"\nargs = ["-y", "@modelcontextprotocol/server-filesystem", '
    assert npx in text, text
    path = tmp_path / "pinned.toml"
    path.write_text(text.replace(npx, f'command = "{npm_bin("mcp-server-filesystem")}"\nargs = ['), encoding="utf-8")
    out = run_cli("inspect", "--config", str(path), timeout=120, CTX_LLM_BASE_URL="http://127.0.0.1:9/v1")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.strip()}
    assert rows["fs"][2] == "ok" and int(rows["fs"][3]) > 5, out.stdout
    assert rows["demo"][2:4] == ["ok", "3"], out.stdout
