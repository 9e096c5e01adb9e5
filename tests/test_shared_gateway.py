"""A shared gateway that an unlucky operator or a server's gap cannot bring down: real upstream processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PY, call, inproc, make_settings, run_cli, text_of

pytestmark = pytest.mark.anyio
RAW = str(Path(__file__).parent / "servers" / "raw_server.py")


async def test_a_server_without_resource_templates_is_available(tmp_path: Path) -> None:
    """It declares resources but answers -32601 to resources/templates/list: an empty list, not a
    reason to restart it forever."""
    settings = make_settings(tmp_path, {"raw": {"command": PY, "args": [RAW, "--resources"]}})
    async with inproc(settings) as (gateway, session):
        result = await call(session, "raw__legacy_echo", {"text": "hi"})
        assert not result.is_error and text_of(result) == "legacy_echo:hi"
        assert gateway.upstreams["raw"].state == "ok"
        listed = await session.list_resources()
        assert [r.name for r in listed.resources] == ["one"]


def test_token_names_that_differ_by_case_are_refused(tmp_path: Path) -> None:
    """`Alice` and `alice` would share one folder on macOS and Windows: the gateway does not start."""
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        f'[gateway]\nworkspace = "{tmp_path / "ws"}"\ntransport = "http"\n\n'
        '[[auth.tokens]]\nname = "Alice"\ntoken = "a-token-of-alice-0123456789"\n\n'
        '[[auth.tokens]]\nname = "alice"\ntoken = "another-token-of-alice-0123"\n'
    )
    done = run_cli("--config", str(cfg), timeout=30)
    assert done.returncode != 0 and "ignoring case" in done.stderr and "Alice, alice" in done.stderr
    assert "Traceback" not in done.stderr
