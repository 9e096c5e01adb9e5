"""Command line: serve · inspect · demo · clean · hook · import. Each command lives in its own module
here and is imported only when it runs (start-up is part of every host's wait)."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, get_args, get_origin

from gateway.settings import (
    FLAT_KEYS,
    PLUGIN_FLAT_KEYS,
    ConfigError,
    GatewaySettings,
    LLMSettings,
    Settings,
    load_settings,
)

log = logging.getLogger("gateway")
COMMANDS = ("serve", "inspect", "demo", "stats", "clean", "hook", "import")


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (override the file and CTX_* variables)")
    models = {"gateway": GatewaySettings, "llm": LLMSettings}
    for flat, where in FLAT_KEYS.items():
        if flat == "ingest_roots":
            continue
        section, key = ".".join(where[:-1]), where[-1]
        kwargs: dict[str, Any] = {"dest": flat, "default": None, "help": f"[{section}] {key}"}
        if flat == "ingest_root":
            kwargs |= {"action": "append", "metavar": "DIR", "help": "doc_ingest may read below DIR (repeatable)"}
            group.add_argument("--ingest-root", **kwargs)
            continue
        annotation = (
            PLUGIN_FLAT_KEYS[flat][1] if flat in PLUGIN_FLAT_KEYS else models[section].model_fields[key].annotation
        )
        if get_args(annotation) and type(None) in get_args(annotation):  # `list[str] | None`
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        if get_origin(annotation) is list:
            kwargs |= {"type": lambda v: [p.strip() for p in v.split(",") if p.strip()], "metavar": "A,B"}
        elif get_args(annotation) and all(isinstance(a, str) for a in get_args(annotation)):
            kwargs |= {"choices": list(get_args(annotation))}
        elif annotation in (int, float):
            kwargs |= {"type": annotation}
        group.add_argument("--" + flat.replace("_", "-"), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-context-gateway",
        description="One MCP entry that fronts many MCP servers and keeps oversized results out of the context.",
    )
    from gateway import __version__

    parser.add_argument("--version", action="version", version=f"mcp-context-gateway {__version__}")
    sub = parser.add_subparsers(dest="command")
    specs = {
        "serve": "run the gateway for a host (stdio unless --transport http)",
        "inspect": "start every upstream and print a table; non-zero exit if one fails",
        "demo": "start the gateway as a host would, call a tool with an oversized result, print what happened",
        "stats": "what passed through the gateway and the tokens it kept out of the window, per server and tool",
        "clean": "remove every offloaded response file",
        "hook": "PostToolUse / AfterTool hook for Claude Code and Gemini CLI",
        "import": "print the TOML equivalent of a host mcp.json",
    }
    for name, help_text in specs.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "import":
            p.add_argument("file", type=Path, help='a host mcp.json ({"mcpServers": {...}})')
            continue
        if name == "hook":
            p.add_argument("--statusline", action="store_true", help="write the bridge file from statusline JSON")
            continue
        if name == "stats":
            p.add_argument(
                "--period", choices=["day", "week", "all"], default="all", help="rows for this period (default all)"
            )
            p.add_argument("--json", action="store_true", help="print the figures as JSON")
        p.add_argument("--config", "-c", help="gateway TOML or host mcp.json (absolute path); env CTX_CONFIG")
        p.add_argument("--verbose", "-v", action="store_true", help="log at INFO level to stderr")
        _add_setting_flags(p)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {flat: getattr(args, flat, None) for flat in FLAT_KEYS if hasattr(args, flat)}
    return load_settings(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help", "--version"):
        argv.insert(0, "serve")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from mcp import MCPDeprecationWarning

    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    from gateway.pipeline import PluginError

    try:
        if args.command == "import":
            from gateway.cli.import_config import cmd_import

            return cmd_import(args.file)
        if args.command == "hook":
            from gateway.cli.hook import run_hook

            return run_hook(statusline_mode=args.statusline)
        settings = _settings(args)
        if args.command in ("serve", "inspect", "demo"):
            from gateway.settings import check_workspace

            check_workspace(settings)
        if args.command == "inspect":
            from gateway.cli.inspect import cmd_inspect

            return cmd_inspect(settings)
        if args.command == "demo":
            from gateway.cli.demo import cmd_demo

            return cmd_demo(settings)
        if args.command == "stats":
            from gateway.cli.stats import cmd_stats

            return cmd_stats(settings, args.period, args.json)
        if args.command == "clean":
            from gateway.cli.clean import cmd_clean

            return cmd_clean(settings)
        from gateway.cli.serve import cmd_serve

        return cmd_serve(settings, reload=lambda: _settings(args))
    except (ConfigError, PluginError) as exc:
        print(f"mcp-context-gateway: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
