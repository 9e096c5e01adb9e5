"""Third-party MCP servers from the npm registry, installed once per test run.

`.ci/run` installs them into `.ci/npm`; a developer's first test run does the same. Tests that
need them are skipped (with the reason printed) only when npm itself is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NPM_DIR = Path(os.environ.get("CTX_TEST_NPM_DIR", ROOT / ".ci" / "npm"))
PACKAGES = [
    "@modelcontextprotocol/server-everything@2026.8.31",
    "@modelcontextprotocol/server-filesystem@2026.8.31",
    "@modelcontextprotocol/server-memory@2026.8.31",
]
LOOPBACK_PRELOAD = Path(__file__).parent / "servers" / "loopback.cjs"


def npm_bin(name: str) -> str:
    """Path of an installed npm server binary; installs the packages if needed, skips if npm is missing."""
    path = NPM_DIR / "node_modules" / ".bin" / name
    if not path.exists():
        if shutil.which("npm") is None or shutil.which("node") is None:
            pytest.skip("npm/node not installed: third-party npm MCP servers cannot run here")
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(NPM_DIR), *PACKAGES],
            check=True,
            timeout=600,
        )
    return str(path)
