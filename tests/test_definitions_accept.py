"""Changed tool definitions accepted per server: `accept SERVER`, or an edited config entry for that server."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from conftest import eventually, inproc, make_settings, probe, run_cli, write_config

from gateway.proxy.reload import ConfigReloader
from gateway.settings import load_settings

pytestmark = pytest.mark.anyio
CHANGED = re.compile(r"changed: tool '(\w+)' of server '(\w+)'")


def mutating(tmp_path: Path, name: str, **cfg: object) -> dict[str, object]:
    """A probe whose echo tool changes while `<name>.mutated` exists: a server updated in place, its
    config entry untouched."""
    return probe(name, "--mutate-when", str(tmp_path / f"{name}.mutated"), **cfg)


def changed_servers(cfg: Path) -> tuple[set[str], str]:
    """The servers `inspect` reports a changed tool of, and its whole output (wrapping undone)."""
    out = run_cli("inspect", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    return {server for _, server in CHANGED.findall(out.stdout)}, " ".join((out.stdout + out.stderr).split())


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_accept_clears_one_server_and_an_edited_entry_is_taken_anew(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    servers = {"p": mutating(tmp_path, "p"), "q": mutating(tmp_path, "q")}
    storage = ""
    if backend == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        storage = f'\n[storage]\nbackend = "postgres"\ndsn = {json.dumps(dsn)}\n'
    cfg = write_config(tmp_path, servers)
    cfg.write_text(cfg.read_text() + storage)
    assert changed_servers(cfg)[0] == set()  # the first definitions, remembered

    for name in ("p", "q"):
        (tmp_path / f"{name}.mutated").touch()
    changed, text = changed_servers(cfg)
    assert changed == {"p", "q"}
    assert f"run `mcp-context-gateway accept p --config {cfg}` to accept" in text

    out = run_cli("accept", "p", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "p: echo: description, input schema (+exfil)" in out.stdout.splitlines()
    assert changed_servers(cfg)[0] == {"q"}  # p's change accepted; q's still warns

    # p's config entry edited (a tool filter): its current definitions are taken anew, said once
    (tmp_path / "p.mutated").unlink()  # p back to its old echo: against the accepted one, a change
    assert changed_servers(cfg)[0] == {"p", "q"}
    servers["p"] = mutating(tmp_path, "p", tools={"exclude": ["crash"]})
    cfg.write_text(write_config(tmp_path, servers).read_text() + storage)
    changed, text = changed_servers(cfg)
    assert changed == {"q"}
    assert text.count("server 'p': its config entry changed") == 1
    changed, text = changed_servers(cfg)
    assert changed == {"q"} and "config entry changed" not in text


async def test_an_entry_edited_while_running_is_taken_anew_on_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The config reloaded with p's entry edited: p's changed tool no longer counts as changed, q's does."""
    servers = {"p": mutating(tmp_path, "p"), "q": mutating(tmp_path, "q")}
    async with inproc(make_settings(tmp_path, servers)) as (gateway, _):
        await gateway.wait_ready()  # the first definitions
    for name in ("p", "q"):
        (tmp_path / f"{name}.mutated").touch()
    settings = make_settings(tmp_path, servers, freeze_definitions=True)
    async with inproc(settings) as (gateway, _):
        await gateway.wait_ready()
        assert set(gateway.routing.changed) == {"p__echo", "q__echo"}
        servers["p"] = mutating(tmp_path, "p", tools={"exclude": ["crash"]})
        cfg = write_config(tmp_path, servers, freeze_definitions=True)
        reloader = ConfigReloader(gateway, lambda: load_settings(cfg, environ={}))
        with caplog.at_level(logging.WARNING, "gateway.definitions"):
            await reloader.reload("test")
        await eventually(lambda: set(gateway.routing.changed) == {"q__echo"}, 20, "p taken anew")
        assert [r.message for r in caplog.records if "config entry changed" in r.message] == [
            "server 'p': its config entry changed, so its current tool definitions are taken as its first"
        ]
        assert "evil.example" in (gateway.routing.tools["p__echo"].description or "")  # served, not frozen


def test_accept_names_only_enabled_servers(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"p": probe("p")})
    out = run_cli("accept", "nope", "--config", str(cfg))
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "mcp-context-gateway accept: no enabled server named nope (servers: p)"
    ]
