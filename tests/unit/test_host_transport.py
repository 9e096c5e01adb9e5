"""`ByPath`: the front's two endpoints are reached without Starlette's router; all else goes to it."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from gateway.proxy.host_transport import ByPath

MCP_METHODS = frozenset(("GET", "HEAD", "POST", "DELETE"))


class Recorder:
    def __init__(self, name: str, seen: list[str]):
        self.name, self.seen = name, seen

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append(self.name)


@pytest.mark.parametrize(
    ("path", "method", "root_path", "reached"),
    [
        ("/mcp", "POST", "", "mcp"),
        ("/mcp", "GET", "", "mcp"),
        ("/mcp", "DELETE", "", "mcp"),
        ("/metrics", "GET", "", "metrics"),
        ("/metrics", "POST", "", "starlette"),  # its 405
        ("/mcp", "PUT", "", "starlette"),
        ("/mcp/", "POST", "", "starlette"),  # its redirect
        ("/MCP", "POST", "", "starlette"),
        ("/other", "POST", "", "starlette"),
        ("/mcp", "POST", "/prefix", "starlette"),  # a root path: Starlette's own matching
    ],
)
def test_only_the_endpoints_own_requests_skip_starlette(path: str, method: str, root_path: str, reached: str) -> None:
    seen: list[str] = []
    app = ByPath(
        Recorder("starlette", seen),
        {"/mcp": (Recorder("mcp", seen), MCP_METHODS), "/metrics": (Recorder("metrics", seen), frozenset({"GET"}))},
    )
    scope = {"type": "http", "path": path, "method": method, "root_path": root_path, "headers": []}
    anyio.run(app, scope, None, None)
    assert seen == [reached]


def test_lifespan_and_websocket_scopes_go_to_starlette() -> None:
    seen: list[str] = []
    app = ByPath(Recorder("starlette", seen), {"/mcp": (Recorder("mcp", seen), MCP_METHODS)})
    anyio.run(app, {"type": "lifespan"}, None, None)
    anyio.run(app, {"type": "websocket", "path": "/mcp"}, None, None)
    assert seen == ["starlette", "starlette"]
