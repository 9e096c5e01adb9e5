"""Command line: serve · inspect · accept · demo · stats · clean · hook · import. Each command lives in its own module
here and is imported only when it runs (start-up is part of every host's wait)."""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
from pathlib import Path
from typing import Any, get_args, get_origin

from gateway.settings import (
    FLAT_KEYS,
    PLUGIN_FLAT_HELP,
    PLUGIN_FLAT_KEYS,
    ConfigError,
    GatewaySettings,
    LLMSettings,
    Settings,
    StorageSettings,
    check_variables,
    load_settings,
)

log = logging.getLogger("gateway")
SECTIONS: dict[str, Any] = {"gateway": GatewaySettings, "llm": LLMSettings, "storage": StorageSettings}
COMMANDS = ("serve", "inspect", "accept", "demo", "stats", "clean", "hook", "import")


def _default_text(section: str, key: str) -> str:
    field = SECTIONS[section].model_fields[key]
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "all installed" if key == "plugins" else "none"
    if value in ("", []):
        return "empty"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _add_setting_flags(
    parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None, helps: dict[str, str] | None = None
) -> None:
    group = parser.add_argument_group("settings (override the config file and CTX_* variables)")
    models = SECTIONS
    for flat, where in FLAT_KEYS.items():
        if flat == "ingest_roots" or (only is not None and flat not in only):
            continue
        env = f"CTX_{flat.upper()}"
        if flat in PLUGIN_FLAT_KEYS:
            kwargs: dict[str, Any] = {"dest": flat, "default": None, "help": f"{PLUGIN_FLAT_HELP[flat]}; {env}"}
            if flat == "ingest_root":
                kwargs |= {"action": "append", "metavar": "DIR", "help": f"{PLUGIN_FLAT_HELP[flat]}; CTX_INGEST_ROOTS"}
            else:
                kwargs |= {"type": PLUGIN_FLAT_KEYS[flat][1]}
            group.add_argument("--" + flat.replace("_", "-"), **kwargs)
            continue
        section, key = where[0], where[-1]
        field = models[section].model_fields[key]
        kwargs = {
            "dest": flat,
            "default": None,
            "help": f"{field.description} (default {_default_text(section, key)}; [{section}] {key}, {env})",
        }
        if flat in (helps or {}):
            kwargs["help"] = (helps or {})[flat]
        annotation = field.annotation
        if get_args(annotation) and type(None) in get_args(annotation):  # `list[str] | None`
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        if get_origin(annotation) is list:
            kwargs |= {"type": lambda v: [p.strip() for p in v.split(",") if p.strip()], "metavar": "A,B"}
        elif get_args(annotation) and all(isinstance(a, str) for a in get_args(annotation)):
            kwargs |= {"choices": list(get_args(annotation))}
        elif annotation in (int, float):
            kwargs |= {"type": annotation, "metavar": "N"}
        elif annotation is bool:
            kwargs |= {"type": _boolean, "metavar": "true|false"}
        group.add_argument("--" + flat.replace("_", "-"), **kwargs)


def _boolean(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not true or false")


EPILOG = """\
Without a command it runs `serve`, which is what a host starts:
  mcp-context-gateway --config /absolute/path/gateway.toml
Try it first:
  mcp-context-gateway demo
  mcp-context-gateway inspect --config /absolute/path/gateway.toml
  npx @modelcontextprotocol/inspector -- mcp-context-gateway --config /absolute/path/gateway.toml
Each command has its own --help. --config also reads a host's mcp.json; CTX_CONFIG sets it too."""

# which settings each command reads: the others would be accepted and ignored
COMMAND_SETTINGS: dict[str, tuple[str, ...] | None] = {
    "serve": None,  # all
    "inspect": None,
    "accept": None,  # starts the named servers, as inspect does
    "demo": ("workspace",),
    "stats": ("workspace", "tokenizer"),
    "clean": ("workspace",),
}


# settings whose help differs for one command
COMMAND_HELPS: dict[str, dict[str, str]] = {
    "demo": {"workspace": "folder for the demo's files (default: a new temporary folder, removed afterwards)"},
}


def build_parser() -> Parser:
    parser = Parser(
        prog="mcp-context-gateway",
        description="One MCP entry that fronts many MCP servers and keeps oversized results out of the context.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from gateway import __version__

    parser.add_argument("--version", action="version", version=f"mcp-context-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command")
    commands = parser.commands = {}
    specs = {
        "serve": "run the gateway for a host (the default; stdio unless --transport http)",
        "inspect": "start every server once and print what the host would receive (exit 1 or 2: a server failed)",
        "accept": "take the named servers' current tool definitions as their first ones (changes no longer warn)",
        "demo": "run the gateway as a host would and show an oversized result offloaded",
        "stats": "what passed through the gateway and the tokens it kept out of the window",
        "clean": "remove every offloaded response file",
        "hook": "PostToolUse / AfterTool hook for Claude Code and Gemini CLI",
        "import": "print a gateway TOML equivalent to a host's mcp.json",
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
        if name == "accept":
            p.add_argument("servers", nargs="*", metavar="SERVER", help="the servers to accept, by config name")
            p.add_argument("--all", action="store_true", dest="every", help="accept every enabled server")
        p.add_argument(
            "--config", "-c", help="gateway TOML or host mcp.json, absolute path (default: none; CTX_CONFIG)"
        )
        verbose = "log at INFO level to stderr" + (
            "; list every tool and its definition's tokens" if name == "inspect" else ""
        )
        p.add_argument("--verbose", "-v", action="store_true", help=verbose)
        _add_setting_flags(p, COMMAND_SETTINGS[name], COMMAND_HELPS.get(name))
        commands[name] = p
    return parser


class Parser(argparse.ArgumentParser):
    """Unknown options are reported by the command they were given to, with the nearest known one."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            where = self.commands.get(getattr(parsed, "command", None) or "", self)
            known = [o for action in where._actions for o in action.option_strings if o.startswith("--")]
            hints = [
                close[0]
                for word in extra
                if word.startswith("--") and (close := difflib.get_close_matches(word.split("=")[0], known, n=1))
            ]
            hint = f" (did you mean {' and '.join(hints)}?)" if hints else ""
            where.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return parsed


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {flat: getattr(args, flat, None) for flat in FLAT_KEYS if hasattr(args, flat)}
    settings = load_settings(args.config, overrides)
    if args.command in ("serve", "inspect", "accept", "demo"):  # those that start servers (serve: also on reload)
        check_variables(settings)
    return settings


def _plugin_error() -> type[Exception]:
    from gateway.pipeline import PluginError  # imports the SDK's types: not before serve started its upstreams

    return PluginError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        print(
            f"mcp-context-gateway: unknown command '{argv[0]}' ({hint}commands: {', '.join(COMMANDS)}; see --help)",
            file=sys.stderr,
        )
        return 2
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help", "--version"):
        argv.insert(0, "serve")
    from gateway.proxy.sighup import hold, let_go

    if argv[0] == "serve":  # first of all: a SIGHUP while starting must not end the process
        hold()
    else:  # held by the entry point (`gateway.launch`) before this module loaded
        let_go()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from gateway.compat import ignore_sdk_deprecations, quiet_sdk_notification_errors
    from gateway.services.storage_error import StorageError

    quiet_sdk_notification_errors()
    # the commands that start servers load the SDK anyway (serve: once its upstreams started, in
    # cli/serve.py); the others never load it, and a host runs `hook` after every tool call
    if args.command in ("inspect", "accept", "demo"):
        ignore_sdk_deprecations()

    try:
        if args.command == "import":
            from gateway.cli.import_config import cmd_import

            return cmd_import(args.file)
        if args.command == "hook":
            from gateway.cli.hook import run_hook

            return run_hook(statusline_mode=args.statusline)
        settings = _settings(args)
        temporary = args.command == "demo" and args.workspace is None  # never the user's real sessions
        if temporary:
            import tempfile

            settings.gateway.workspace = Path(tempfile.mkdtemp(prefix="mcp-context-gateway-demo-"))
        if args.command in ("serve", "inspect", "accept", "demo"):
            from gateway.settings import check_port, check_workspace

            check_workspace(settings)
            if settings.storage.backend == "postgres":  # reachable, before any upstream starts
                from gateway.services.storage import Storage

                Storage(settings.storage).check()
            if args.command == "serve":
                check_port(settings)
        if args.command == "inspect":
            from gateway.cli.inspect import cmd_inspect

            return cmd_inspect(settings, args.verbose)
        if args.command == "accept":
            from gateway.cli.accept import cmd_accept

            return cmd_accept(settings, args.servers, args.every)
        if args.command == "demo":
            from gateway.cli.demo import cmd_demo

            return cmd_demo(settings, temporary)
        if args.command == "stats":
            from gateway.cli.stats import cmd_stats

            return cmd_stats(settings, args.period, args.json)
        if args.command == "clean":
            from gateway.cli.clean import cmd_clean

            return cmd_clean(settings)
        from gateway.cli.serve import cmd_serve

        return cmd_serve(settings, reload=lambda: _settings(args))
    except (ConfigError, StorageError, _plugin_error()) as exc:  # evaluated only when something was raised
        print(f"mcp-context-gateway: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
