"""A fleet of real third-party MCP servers (npm and PyPI) for catalog-mode tests and the bench."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from npm_servers import npm_bin


def git_repo(folder: Path) -> Path:
    repo = folder / "repo"
    if (repo / ".git").exists():
        return repo
    repo.mkdir(parents=True, exist_ok=True)
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
    }
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    (repo / "a.txt").write_text("one\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "first"], check=True, env=env)
    (repo / "a.txt").write_text("one\ntwo\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True, env=env)
    return repo


def python_bin(name: str) -> str:
    found = Path(sys.executable).parent / name
    return str(found) if found.exists() else (shutil.which(name) or name)


def fleet(tmp_path: Path) -> dict[str, dict[str, Any]]:
    data = tmp_path / "files"
    data.mkdir(exist_ok=True)
    return {
        "everything": {"command": npm_bin("mcp-server-everything"), "args": ["stdio"]},
        "fs": {"command": npm_bin("mcp-server-filesystem"), "args": [str(data)]},
        "memory": {"command": npm_bin("mcp-server-memory"), "env": {"MEMORY_FILE_PATH": str(tmp_path / "mem.jsonl")}},
        "time": {"command": python_bin("mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "git": {"command": python_bin("mcp-server-git"), "args": ["--repository", str(git_repo(tmp_path))]},
    }
