"""A gateway with only the memory plugin, in this process, talking to a model endpoint (for bench/real_model.py
and tests/test_real_model.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from common import inproc_session
from mcp import ClientSession


@asynccontextmanager
async def gateway_session(workspace: Path, base_url: str) -> AsyncIterator[ClientSession]:
    workspace.mkdir(parents=True, exist_ok=True)
    config = workspace / "gateway.toml"
    config.write_text(
        f'[gateway]\nworkspace = "{workspace / "ws"}"\nplugins = ["memory"]\nbudget = 4000\n'
        f'[llm]\nbase_url = "{base_url}"\ntimeout_seconds = 300\n'
    )
    async with inproc_session(config) as session:
        yield session
