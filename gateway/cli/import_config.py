"""`import`: a host `mcp.json` in, a working gateway TOML out (on stdout); what needs a look on stderr."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import ValidationError

from gateway.settings import ConfigError, ServerConfig, format_validation_error, read_config_file, strip_jsonc, to_toml

HEADER = """\
# mcp-context-gateway configuration, converted from {path}
# In your host's config, replace those servers by one entry (absolute paths; on Windows use / or \\\\):
#   "context-gateway": {{"command": "{command}", "args": ["--config", "/absolute/path/gateway.toml"]}}
# Check it with: mcp-context-gateway inspect --config /absolute/path/gateway.toml
# The gateway reloads this file when you save it.

[gateway]
# The model's context window in tokens; 0 = learn it from the host or your model endpoint ([llm]).
# Set it for a local model (LM Studio, Ollama, llama.cpp):
# context_window = 16384
# Many servers? catalog lists three search tools instead of every definition; auto decides by size.
# tool_mode = "auto"
# workspace = "~/.local/share/mcp-context-gateway"

# [llm]
# base_url = "http://localhost:1234/v1"   # your OpenAI-compatible endpoint: window discovery, summaries

# Folders doc_ingest may read documents from (absolute paths):
# [plugins.documents]
# ingest_roots = ["/home/me/notes"]

"""


def _warnings(raw: dict[str, Any], servers: dict[str, dict[str, Any]]) -> list[str]:
    entries = raw.get("mcpServers", raw.get("servers")) or {}
    out = []
    for raw_name, (name, table) in zip(entries, servers.items(), strict=True):
        if raw_name != name:
            out.append(
                f"server {raw_name!r} is named {name!r} here (letters, digits, '-' and single '_'): its tools are "
                f"shown as {name}__<tool>"
            )
        url = table.get("url", "")
        if url and table.get("transport") != "sse" and urlparse(url).path.rstrip("/").endswith("/sse"):
            out.append(
                f"server {name!r}: its URL ends in /sse but its entry names no transport: it is written for "
                'Streamable HTTP; if the server speaks only the older SSE transport, add transport = "sse"'
            )
        try:
            cfg = ServerConfig.model_validate(table)
        except ValidationError as exc:
            detail = format_validation_error(exc, None).splitlines()[1:]
            out.append(f"server {name!r}: " + "; ".join(line.strip() for line in detail))
            continue
        try:
            problem = cfg.command_problem()
        except ConfigError as exc:  # kept as written: the gateway expands it where the host starts it
            out.append(f"server {name!r}: {exc} in this shell; kept as written, set it where the host runs")
            continue
        if problem:
            out.append(f"server {name!r}: {problem}")
    return out


def _own_command() -> str:
    """This gateway's command as an absolute path (hosts do not start commands through the user's PATH)."""
    script = Path(sys.argv[0])
    if script.name.startswith("mcp-context-gateway") and script.exists():
        return str(script.resolve())
    found = shutil.which("mcp-context-gateway")
    return str(Path(found).resolve()) if found else "/absolute/path/.venv/bin/mcp-context-gateway"


def cmd_import(path: Path) -> int:
    if path.suffix.lower() != ".json":
        print(f"mcp-context-gateway: {path} is not a .json file (import reads a host's mcp.json)", file=sys.stderr)
        return 2
    servers = read_config_file(path)["servers"]
    if not servers:
        shape = '{"mcpServers": {"name": {"command": ...}}}'
        print(f"mcp-context-gateway: {path} lists no servers (expected {shape}): nothing to import", file=sys.stderr)
        return 1
    raw = json.loads(strip_jsonc(path.read_text(encoding="utf-8")))
    warnings = _warnings(raw, servers)
    command = json.dumps(_own_command())[1:-1]  # backslashes of a Windows path escaped, as JSON needs
    print(HEADER.format(path=path.resolve(), command=command) + to_toml(servers), end="")
    for line in warnings:
        print(f"mcp-context-gateway import: {line}", file=sys.stderr)
    return 0
