"""Roots: an upstream's roots/list reaches the host (the real filesystem server, as it would directly)."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from conftest import call, inproc, make_settings, text_of
from mcp import ClientSession
from npm_servers import npm_bin

pytestmark = [pytest.mark.anyio, pytest.mark.npm]


async def allowed(session: ClientSession) -> str:
    return text_of(await call(session, "fs__list_allowed_directories"))


async def test_the_hosts_roots_reach_the_filesystem_server(tmp_path: Path) -> None:
    """Started with folder b, the filesystem server asks its client for roots: through the gateway it
    gets the roots of the host (folder a), as when the host runs it directly, and asks again when the host
    says its roots changed (folder c). A host without roots leaves b in force."""
    a, b, c = (tmp_path / n for n in "abc")
    for folder in (a, b, c):
        folder.mkdir()
    settings = make_settings(tmp_path, {"fs": {"command": npm_bin("mcp-server-filesystem"), "args": [str(b)]}})
    roots = [a]

    async def list_roots(context: object) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=p.resolve().as_uri(), name=p.name) for p in roots])

    async with inproc(settings, list_roots_callback=list_roots) as (_, session):
        with anyio.fail_after(20):
            while str(a.resolve()) not in await allowed(session):
                await anyio.sleep(0.1)
        assert str(b.resolve()) not in await allowed(session)
        roots[:] = [c]
        await session.send_roots_list_changed()
        with anyio.fail_after(20):
            while str(c.resolve()) not in await allowed(session):
                await anyio.sleep(0.1)
    async with inproc(settings) as (_, session):  # a host without roots: the server keeps its own folder
        text = await allowed(session)
        assert str(b.resolve()) in text and str(a.resolve()) not in text
