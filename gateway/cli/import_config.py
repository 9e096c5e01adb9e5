"""`import`: a host `mcp.json` in, the equivalent `[servers.*]` TOML out."""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.settings import read_config_file, to_toml


def cmd_import(path: Path) -> int:
    if path.suffix.lower() != ".json":
        print(f"mcp-context-gateway: {path} is not a .json file", file=sys.stderr)
        return 2
    data = read_config_file(path)
    print("# converted from", path)
    print(to_toml(data["servers"]))
    return 0
