"""A shared gateway that an unlucky operator or a server's gap cannot bring down: real upstream processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PY, call, inproc, make_settings, text_of

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
