"""One settings model: TOML file (or a host `mcp.json`), `CTX_*` environment, command line.

Precedence: command line > environment > file > defaults.
"""

from __future__ import annotations

import difflib
import errno
import json
import logging
import os
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

log = logging.getLogger("gateway.settings")
SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
MIN_RESPONSE_SIZE = 256
MAX_RESPONSE_SIZE = 10 * 1024 * 1024
MIN_TOKEN_LENGTH = 16  # bearer tokens, named or not
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
LAUNCHER_HINTS = {
    "npx": "npx comes with Node.js: install Node.js",
    "node": "install Node.js",
    "uvx": "uvx comes with uv: install uv (https://docs.astral.sh/uv/)",
    "uv": "install uv (https://docs.astral.sh/uv/)",
    "docker": "install Docker, or start Docker Desktop",
    "bunx": "install Bun",
    "deno": "install Deno",
}
SCRIPT_RUNNERS = re.compile(r"^(python[0-9.]*|pythonw|py|node|bun|deno|tsx|ts-node)$")
SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts")


class ConfigError(Exception):
    """A settings problem the user must fix; the message says what and how."""


def default_workspace() -> Path:
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "mcp-context-gateway"


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_vars(value: str) -> str:
    """Expand `${VAR}` from the environment; `${PYTHON}` is the interpreter running the gateway."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == "PYTHON" and "PYTHON" not in os.environ:
            return sys.executable
        if name not in os.environ:
            raise ConfigError(f"${{{name}}} is used in the config but the environment variable {name} is not set")
        return os.environ[name]

    return _VAR.sub(sub, value)


TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what hosts accept as a tool name


class ToolFilter(BaseModel):
    """`tools = {...}` of a server. Every key names the upstream's own tool names: include, exclude, and
    the overrides of what the host is shown (rename, describe)."""

    model_config = ConfigDict(extra="forbid")
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    rename: dict[str, str] = Field(default_factory=dict)  # own name -> the name the host sees (before the prefix)
    describe: dict[str, str] = Field(default_factory=dict)  # own name -> the description the host sees

    def allows(self, name: str) -> bool:
        if self.include and name not in self.include:
            return False
        return name not in self.exclude

    @model_validator(mode="after")
    def _overrides(self) -> ToolFilter:
        given: set[str] = set()
        for old, new in self.rename.items():
            if not TOOL_NAME.fullmatch(new):
                raise ValueError(f"tools.rename {old!r} = {new!r}: use 1-64 letters, digits, '_' or '-'")
            if new in given:
                raise ValueError(f"tools.rename gives several tools the name {new!r}: give each its own")
            given.add(new)
        if empty := [old for old, text in self.describe.items() if not text.strip()]:
            raise ValueError(f"tools.describe {empty[0]!r} is empty: give a description, or leave the key out")
        return self


OffloadPolicy = Literal["auto", "never", "always"]


UpstreamTransport = Literal["stdio", "http", "sse"]
# how hosts' mcp.json files spell a transport (`type`, `transport`, `transportType`), lower case, no - or _
TRANSPORT_SPELLINGS: dict[str, UpstreamTransport] = {
    "stdio": "stdio",
    "http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}


def transport_named(value: Any) -> Any:
    """`streamable-http`, `streamableHttp`, `SSE`, ...: as the gateway names it (else unchanged)."""
    if isinstance(value, str):
        return TRANSPORT_SPELLINGS.get(re.sub(r"[-_\s]", "", value.lower()), value)
    return value


class ServerConfig(BaseModel):
    """One upstream: stdio (`command`) or HTTP (`url`): Streamable HTTP, or the older HTTP+SSE."""

    model_config = ConfigDict(extra="forbid")
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    # stdio for `command`; for `url`: http (Streamable HTTP) unless "sse" (the 2024-11-05 HTTP+SSE transport)
    transport: UpstreamTransport | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    max_response_size: int | None = None
    max_response_tokens: int | None = None
    timeout_seconds: float = 60.0
    init_timeout_seconds: float = 60.0
    ping_seconds: float = 30.0  # liveness check; an upstream that does not answer is restarted
    tools: ToolFilter = Field(default_factory=ToolFilter)
    prefix: bool = True
    tool_mode: Literal["direct", "catalog", "auto"] | None = None
    pin: bool = False
    enabled: bool = True
    # offload: auto = by the size rule; never = always inline (output that must stay whole; its
    # outputSchema is kept); always = every result to a file (scripting); per tool in offload_tools
    offload: OffloadPolicy = "auto"
    offload_tools: dict[str, OffloadPolicy] = Field(default_factory=dict)

    @field_validator("args", mode="before")
    @classmethod
    def _args_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # `args = "-m foo"`: pydantic would only say "Input should be a valid list"
            raise ValueError(f"args is a list, one item per argument: args = {_toml_value(_words(value))}")
        return value

    @field_validator("transport", mode="before")
    @classmethod
    def _transport_spelling(cls, value: Any) -> Any:
        return transport_named(value)

    def offload_policy(self, tool: str) -> OffloadPolicy:
        """The offload policy for one of this server's tools (by its own name)."""
        return self.offload_tools.get(tool, self.offload)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("give either `command` (stdio) or `url` (Streamable HTTP), not both and not neither")
        given = self.transport
        self.transport = "stdio" if self.command else given or "http"
        if given and (given == "stdio") != bool(self.command):
            raise ValueError(
                'transport "stdio" needs `command`; with `url` give transport = "http" (Streamable HTTP) or "sse"'
                if self.url
                else f'transport "{given}" needs `url`; a `command` is spoken to over stdio (leave transport out)'
            )
        if self.cwd and "${" not in self.cwd:
            folder = Path(os.path.expanduser(self.cwd))
            if not folder.is_dir():
                where = (
                    "" if folder.is_absolute() else f" (relative to {Path.cwd()}, where the host started the gateway)"
                )
                raise ValueError(f"cwd {self.cwd!r} is not a directory{where}: give an absolute path that exists")
        if (script := _missing_script(self)) is not None:
            raise ValueError(script)
        if self.max_response_size is not None:
            _check_response_size(self.max_response_size)
        if self.timeout_seconds <= 0 or self.init_timeout_seconds <= 0:
            raise ValueError("timeout_seconds and init_timeout_seconds must be positive")
        return self

    def command_problem(self) -> str | None:
        """Why `command` cannot be started from here (not on PATH, not a file), with what to do; or None."""
        if not self.command:
            return None
        cfg = self.expanded()
        command = cfg.command
        search = cfg.env.get("PATH") or os.environ.get("PATH", "")
        if os.sep in command or (os.altsep and os.altsep in command):
            found: str | None = command if os.path.isfile(os.path.expanduser(command)) else None
        else:
            found = shutil.which(command, path=search)
        if found:
            return None
        words = _words(command) if " " in command.strip() else []
        if words and (shutil.which(words[0], path=search) or os.path.isfile(os.path.expanduser(words[0]))):
            return (
                f"command {command!r} holds its arguments too: give them in args, one item each: "
                f"command = {_toml_value(words[0])}, args = {_toml_value(words[1:] + cfg.args)}"
            )
        hint = LAUNCHER_HINTS.get(program_name(command), "install it, or give its absolute path")
        return (
            f"command not found: {command} ({hint}; hosts start the gateway with their own PATH, so an absolute "
            "path is safest)"
        )

    def expanded(self) -> ServerConfig:
        """A copy with `${VAR}` expanded in command, args, env, cwd, url and headers."""
        return self.model_copy(
            update={
                "command": expand_vars(self.command),
                "args": [expand_vars(a) for a in self.args],
                "env": {k: expand_vars(v) for k, v in self.env.items()},
                "cwd": expand_vars(self.cwd),
                "url": expand_vars(self.url),
                "headers": {k: expand_vars(v) for k, v in self.headers.items()},
            }
        )


def _words(text: str) -> list[str]:
    """A command line as its words, quotes honoured where they balance."""
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def program_name(command: str) -> str:
    """`/usr/bin/Python3.exe` -> `python3`: the program a command runs, as the hints know it."""
    return os.path.basename(command).lower().removesuffix(".exe").removesuffix(".cmd")


def _missing_script(cfg: ServerConfig) -> str | None:
    """`python server.py` / `node build/index.js` with a relative script that does not exist: hosts start
    the gateway in a folder of their own, so relative paths rarely point where the user meant."""
    if not SCRIPT_RUNNERS.match(program_name(cfg.command)):
        return None
    script = next((a for a in cfg.args if not a.startswith("-")), "")
    if not script.endswith(SCRIPT_SUFFIXES) or "${" in script or os.path.isabs(os.path.expanduser(script)):
        return None
    folder = Path(os.path.expanduser(cfg.cwd)) if cfg.cwd else Path.cwd()
    if (folder / script).is_file():
        return None
    which = "the server's cwd" if cfg.cwd else "the folder the gateway was started in"
    return f"args: the script {script!r} does not exist relative to {folder} ({which}): give its absolute path"


def check_variables(settings: Settings) -> None:
    """Every `${VAR}` an enabled server uses is set, before any server starts: else one ConfigError naming
    the server (a server started without it would only fail, again and again, for the same reason)."""
    for name, cfg in settings.enabled_servers.items():
        try:
            cfg.expanded()
        except ConfigError as exc:
            raise ConfigError(
                f"server {name!r}: {exc}: set it in the environment the host starts the gateway with, or write "
                "the value in the config"
            ) from None


def check_port(settings: Settings) -> None:
    """The HTTP front's port can be bound (nothing else listens there); else a one-line ConfigError."""
    import socket

    cfg = settings.gateway
    if cfg.transport != "http":
        return
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            if sys.platform != "win32":  # as uvicorn binds: a port in TIME_WAIT is free
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((cfg.host, cfg.port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1)):
            raise ConfigError(
                f"port {cfg.port} on {cfg.host} is already in use (another gateway, or another program): "
                "choose another with --port or [gateway] port"
            ) from None
        raise ConfigError(
            f"cannot listen on {cfg.host}:{cfg.port} ({exc.strerror or exc}): check [gateway] host"
        ) from None


def check_workspace(settings: Settings) -> None:
    """The workspace exists (or can be made) and is writable; else a one-line ConfigError."""
    folder = settings.gateway.workspace
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        in_container = Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()
        fix = (
            f"in a container, mount a named volume on {folder}, or run the container as the owner of the "
            'folder you bind-mount there (`--user "$(id -u):$(id -g)"`)'
            if in_container
            else "set [gateway] workspace (or CTX_WORKSPACE) to a folder you can write"
        )
        raise ConfigError(f"workspace {folder} is not writable ({exc.strerror or exc}): {fix}") from None


def _check_response_size(value: int) -> int:
    if not MIN_RESPONSE_SIZE <= value <= MAX_RESPONSE_SIZE:
        raise ValueError(
            f"max_response_size must be between {MIN_RESPONSE_SIZE} and {MAX_RESPONSE_SIZE} bytes, got {value}"
        )
    return value


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # each description is the help of its command-line flag (and of its CTX_* variable)
    workspace: Path = Field(
        default_factory=default_workspace,
        description="folder for offloaded results, notes, indexes and logs (absolute path)",
    )
    workspace_on_host: str = Field(
        "",
        description="where the host sees the workspace when the gateway runs in a container (a bind mount): "
        "the openCmd of offloaded results uses it",
    )
    budget: int = Field(0, ge=0, description="token budget for notes and results; 0 = half the window, else 4000")
    context_window: int = Field(
        0, ge=0, description="the model's context window in tokens; 0 = from the host, the endpoint or unknown"
    )
    tokenizer: Literal["auto", "cl100k", "o200k", "llama3", "qwen"] = Field(
        "auto",
        description="the host model's tokenizer family, counted with its real tokenizer in token figures and "
        "offload limits; auto = for the widest common one (the larger of cl100k and Qwen 3.6, x1.09)",
    )
    exact_tokens: bool = Field(
        True,
        description="count tokens with the real tokenizers (loaded in the background, ~130 MB for auto, "
        "35-65 MB for one family); false = the built-in estimate only, which leans higher",
    )
    max_response_size: int = Field(1048576, description="results above this many bytes go to a file")
    max_response_tokens: int = Field(
        0, ge=0, description="results above this many tokens go to a file; 0 = half the budget (4000 if unknown)"
    )
    separator: str = Field("__", description="between server and tool name in the names hosts see")
    plugins: list[str] | None = Field(None, description="exactly these plugins, in this order; default: all installed")
    disabled_plugins: list[str] = Field(default_factory=list, description="plugins to leave out")
    tool_mode: Literal["direct", "catalog", "auto"] = Field(
        "direct", description="list every tool (direct), three search tools (catalog), or decide by size (auto)"
    )
    transport: Literal["stdio", "http"] = Field("stdio", description="how hosts reach the gateway")
    host: str = Field("127.0.0.1", description="address the HTTP front binds")
    port: int = Field(8808, description="port of the HTTP front")
    auth_token: str = Field("", description="bearer token every HTTP request must carry (needed off loopback)")
    allowed_origins: list[str] = Field(
        default_factory=list, description="browser origins allowed beyond loopback (HTTP front)"
    )
    max_sessions_per_token: int = Field(
        1000,
        ge=1,
        description="open HTTP sessions one token may hold; over it, its session idle longest is closed",
    )
    freeze_definitions: bool = Field(
        False, description="serve each tool's first definition; refuse calls to one that changed"
    )
    replica_name: str = Field(
        "",
        description="this gateway's name in the usage figures and /metrics (replicas on one database); "
        "default: HOST:PORT over HTTP, the machine's name over stdio",
    )
    lean_path: bool = Field(
        True,
        description="plain tool calls skip the MCP SDK's message handling (stdio, and hosts over HTTP); "
        "false: all through it",
    )

    @field_validator("port")
    @classmethod
    def _port_range(cls, value: int) -> int:
        if not 1 <= value <= 65535:
            raise ValueError(f"port {value} is out of range: give a port between 1 and 65535 (default 8808)")
        return value

    @field_validator("auth_token")
    @classmethod
    def _token_length(cls, value: str) -> str:
        if value and len(value) < MIN_TOKEN_LENGTH:  # as for [[auth.tokens]]: a guessable token guards nothing
            raise ValueError(
                f"auth_token must be at least {MIN_TOKEN_LENGTH} characters (use a random one: openssl rand -hex 24)"
            )
        return value

    @field_validator("workspace", mode="before")
    @classmethod
    def _expand_workspace(cls, value: Any) -> Any:
        path = Path(os.path.expanduser(expand_vars(str(value)))) if value else default_workspace()
        if not path.is_absolute():
            raise ValueError(
                f"{value!r} is a relative path: hosts start the gateway from a folder of their own, so give an "
                "absolute path (or one starting with ~)"
            )
        return path

    @field_validator("plugins", "disabled_plugins", "allowed_origins", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):  # CTX_PLUGINS="offload,monitor" or a JSON list
            value = json.loads(value) if value.startswith("[") else [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("max_response_size")
    @classmethod
    def _size_range(cls, value: int) -> int:
        return _check_response_size(value)

    @field_validator("separator")
    @classmethod
    def _separator_chars(cls, value: str) -> str:
        if not value or not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise ValueError("separator must be one or more of A-Z a-z 0-9 _ - (hosts reject other characters)")
        return value

    @property
    def responses_dir(self) -> Path:
        """Where oversized results are written (`clean` empties it)."""
        return self.workspace / "responses"

    @property
    def logs_dir(self) -> Path:
        """Each stdio server's stderr log, `{name}.log`."""
        return self.workspace / "logs"


NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


class NamedToken(BaseModel):
    """One client of a shared HTTP gateway: its bearer token and the namespace its data lives in."""

    model_config = ConfigDict(extra="forbid")
    name: str
    token: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAMESPACE.fullmatch(value):
            raise ValueError(f"token name {value!r}: use 1-32 letters, digits, '-' or '_' (it names a folder)")
        return value

    @field_validator("token", mode="before")
    @classmethod
    def _expand(cls, value: Any) -> Any:
        value = expand_vars(value) if isinstance(value, str) else value
        if not isinstance(value, str) or len(value) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"a token must be at least {MIN_TOKEN_LENGTH} characters (use a random one: openssl rand -hex 24)"
            )
        return value


class AuthSettings(BaseModel):
    """`[auth]`: named bearer tokens for the HTTP front; each name gets its own namespace."""

    model_config = ConfigDict(extra="forbid")
    tokens: list[NamedToken] = Field(default_factory=list)  # [[auth.tokens]] name = "alice", token = "${ALICE}"
    tokens_file: str = ""  # lines of `name token`; '#' starts a comment

    def all_tokens(self) -> list[NamedToken]:
        """The tokens of the table and of the file, names unique."""
        found = list(self.tokens)
        if self.tokens_file:
            path = Path(os.path.expanduser(expand_vars(self.tokens_file)))
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise ConfigError(f"[auth] tokens_file {path} cannot be read: {exc.strerror or exc}") from None
            for number, line in enumerate(lines, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) != 2:
                    raise ConfigError(f"{path}:{number}: write `name token` (two words)")
                try:
                    found.append(NamedToken(name=parts[0], token=parts[1]))
                except ValidationError as exc:
                    raise ConfigError(
                        f"{path}:{number}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
                    ) from None
        # each name is a folder: names that differ only by case are one folder on macOS and Windows
        names = [t.name.lower() for t in found]
        if len(set(names)) != len(names):
            twice = sorted({t.name for t in found if names.count(t.name.lower()) > 1})
            raise ConfigError(
                f"[auth] token names must be unique, ignoring case (each names a folder): {', '.join(twice)}"
            )
        return found


class HostSettings(BaseModel):
    """`[hosts."<clientInfo name>"]`: what the gateway should assume for one host."""

    model_config = ConfigDict(extra="forbid")
    context_window: int = Field(0, ge=0)


class StorageSettings(BaseModel):
    """`[storage]`: where notes, documents and their search indexes live. SQLite (files in the workspace)
    for one gateway; PostgreSQL for several replicas that share them."""

    model_config = ConfigDict(extra="forbid")
    backend: Literal["sqlite", "postgres"] = Field(
        "sqlite", description="sqlite (files in the workspace) or postgres (shared by replicas)"
    )
    dsn: str = Field("", description="PostgreSQL connection string, e.g. postgresql://user@db/ctx (backend postgres)")

    @model_validator(mode="after")
    def _dsn_for_postgres(self) -> StorageSettings:
        if self.backend == "postgres" and not self.dsn:
            raise ValueError(
                '[storage] backend = "postgres" needs dsn = "postgresql://user:password@host/database" '
                "(or CTX_STORAGE_DSN)"
            )
        return self


class LLMSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str = Field(
        "http://localhost:1234/v1", description="your OpenAI-compatible endpoint (summaries, window, token counts)"
    )
    model: str = Field("", description="model name at the endpoint; empty = the one it has loaded")
    api_key: str = Field("", description="API key for the endpoint, if it needs one")
    timeout_seconds: float = Field(120, description="longest wait for the endpoint")


# Flat environment/CLI names -> where they go. `CTX_BUDGET` and `--budget` set gateway.budget.
FLAT_KEYS: dict[str, tuple[str, ...]] = (
    {k: ("gateway", k) for k in GatewaySettings.model_fields}
    | {f"llm_{k}": ("llm", k) for k in LLMSettings.model_fields}
    | {f"storage_{k}": ("storage", k) for k in StorageSettings.model_fields}
)
# Plugin keys the design card gives flat names (`--ingest-root DIR`, `CTX_INGEST_ROOTS`): each plugin's
# table validates them; here they only have a flat spelling and a command-line type.
PLUGIN_FLAT_KEYS: dict[str, tuple[tuple[str, ...], type]] = {
    "ingest_roots": (("plugins", "documents", "ingest_roots"), list),
    "ingest_root": (("plugins", "documents", "ingest_roots"), list),
    "response_ttl_hours": (("plugins", "offload", "response_ttl_hours"), float),
}
PLUGIN_FLAT_HELP = {
    "ingest_root": "doc_ingest may read files below DIR (repeatable; default: none)",
    "response_ttl_hours": "offloaded results older than this are removed at start (default 48)",
}
FLAT_KEYS |= {flat: where for flat, (where, _) in PLUGIN_FLAT_KEYS.items()}
# `[gateway]` keys that moved to a plugin's table: still read, with one deprecation line.
MOVED_KEYS = {"ingest_roots": ("documents", "ingest_roots"), "response_ttl_hours": ("offload", "response_ttl_hours")}


class Settings(BaseSettings):
    """Everything the gateway reads. Build it with `load_settings`."""

    model_config = SettingsConfigDict(extra="forbid")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)  # `[plugins.<name>]`, validated by each plugin
    hosts: dict[str, HostSettings] = Field(default_factory=dict)  # `[hosts."<clientInfo name>"]`
    auth: AuthSettings = Field(default_factory=AuthSettings)
    config_path: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *args: Any, **kwargs: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings merges file, environment and command line itself (flat CTX_* names need mapping).
        return (init_settings,)

    @field_validator("servers")
    @classmethod
    def _server_names(cls, value: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in value:
            if not SERVER_NAME.match(name) or len(name) > 32:
                raise ValueError(
                    f"server name {name!r}: use letters, digits, '-' and single '_' (at most 32 characters)"
                )
        return value

    @model_validator(mode="after")
    def _auth_off_loopback(self) -> Settings:
        cfg = self.gateway
        named = bool(self.auth.tokens or self.auth.tokens_file)
        if cfg.transport == "http" and cfg.host not in LOOPBACK_HOSTS and not cfg.auth_token and not named:
            raise ValueError(
                f"host {cfg.host!r} is not a loopback address: set auth_token (or CTX_AUTH_TOKEN), or [[auth.tokens]], "
                "so that every request needs `Authorization: Bearer <token>`; or bind 127.0.0.1"
            )
        return self

    @property
    def enabled_servers(self) -> dict[str, ServerConfig]:
        return {n: s for n, s in self.servers.items() if s.enabled}


def read_config_file(path: Path) -> dict[str, Any]:
    """A gateway TOML file, or a host `mcp.json` (`{"mcpServers": {...}}`), as a settings dict."""
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*") if p.suffix.lower() in (".toml", ".json"))[:3]
        named = f" ({', '.join(inside)} are there)" if inside else ""
        raise ConfigError(f"--config {path} is a folder: name a file in it, e.g. {path / 'gateway.toml'}{named}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (pass --config with an absolute path)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            try:  # JSON with comments and trailing commas (VS Code's mcp.json and others write it)
                data = json.loads(strip_jsonc(text))
            except json.JSONDecodeError:
                raise ConfigError(f"{path} is not valid JSON: {exc}") from None
        return {"servers": servers_from_mcp_json(data)}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}{toml_hint(text, str(exc))}") from None


_TOML_AT = re.compile(r"at line (\d+), column (\d+)")
_TOML_BARE = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*=\s*(.+?)\s*$")


def toml_hint(text: str, error: str) -> str:
    """What a TOML error most likely means, for the two mistakes people make: a string value without
    quotes (`command = npx`) and a Windows path with backslashes in double quotes."""
    at = _TOML_AT.search(error)
    if not at:
        return ""
    lines = text.splitlines()
    number = int(at.group(1))
    line = lines[number - 1] if 0 < number <= len(lines) else ""
    if "escape" in error.lower() or ("\\" in line and '"' in line):
        return " (a Windows path in double quotes needs \\\\ for each \\; write it in 'single quotes' or with /)"
    bare = _TOML_BARE.match(line)
    if bare and not bare.group(2).startswith(('"', "'", "[", "{")):
        key, value = bare.groups()
        quoted = f"'{value}'" if "\\" in value else json.dumps(value, ensure_ascii=False)
        return f" (a text value needs quotes: {key} = {quoted})"
    return ""


def servers_from_mcp_json(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Host `mcp.json` server entries (Claude Desktop, LM Studio, Cursor) as `[servers.*]` tables."""
    entries = data.get("mcpServers", data.get("servers"))
    if not isinstance(entries, dict):
        raise ConfigError('a JSON config needs an object "mcpServers": {"name": {"command": ..., "args": [...]}}')
    servers: dict[str, dict[str, Any]] = {}
    for raw_name, entry in entries.items():
        name = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_-]", "-", raw_name)).strip("-_")[:32] or "server"
        out: dict[str, Any] = {}
        if entry.get("command"):
            out["command"] = entry["command"]
            for key in ("args", "env", "cwd"):
                if entry.get(key):
                    out[key] = entry[key]
        elif entry.get("url") or entry.get("serverUrl"):
            out["url"] = entry.get("url") or entry.get("serverUrl")
            if entry.get("headers"):
                out["headers"] = entry["headers"]
            kind = entry.get("type") or entry.get("transport") or entry.get("transportType")
            if transport_named(kind) == "sse":  # else Streamable HTTP, the default for a url
                out["transport"] = "sse"
        else:
            raise ConfigError(f"mcp.json server {raw_name!r} has neither `command` nor `url`")
        if entry.get("disabled"):
            out["enabled"] = False
        servers[name] = out
    return servers


def _set(data: dict[str, Any], where: tuple[str, ...], value: Any) -> None:
    for key in where[:-1]:
        data = data.setdefault(key, {})
    data[where[-1]] = value


def _get(data: dict[str, Any], where: tuple[str, ...]) -> Any:
    for key in where:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flat, where in FLAT_KEYS.items():
        value = environ.get(f"CTX_{flat.upper()}")
        if value is not None and flat != "ingest_root":
            _set(out, where, value)
    return out


def _move_deprecated(data: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """`[gateway] ingest_roots` / `response_ttl_hours` (before plugins owned their settings) still work."""
    section = data.get("gateway")
    if not isinstance(section, dict):
        return data
    for key, (plugin, new_key) in MOVED_KEYS.items():
        if key in section:
            log.warning(
                "%s: [gateway] %s is deprecated; move it to [plugins.%s] %s", path or "settings", key, plugin, new_key
            )
            table = data.setdefault("plugins", {}).setdefault(plugin, {})
            value = section.pop(key)
            if isinstance(table, dict):
                table.setdefault(new_key, value)
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def load_settings(
    config: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Build settings from the file, `CTX_*` variables and flat command-line overrides (`{"budget": 4000}`)."""
    environ = dict(os.environ if environ is None else environ)
    config = config or environ.get("CTX_CONFIG") or None
    data: dict[str, Any] = {}
    path: Path | None = None
    if config:
        path = Path(os.path.expanduser(str(config))).resolve()
        data = _move_deprecated(read_config_file(path), path)
    data = _merge(data, _env_overrides(environ))
    # where a value that is not the file's came from: an error names the flag or variable, not the file
    sources = {
        tuple(where): f"CTX_{flat.upper()}={environ[f'CTX_{flat.upper()}']}"
        for flat, where in FLAT_KEYS.items()
        if f"CTX_{flat.upper()}" in environ and flat != "ingest_root"
    }
    cli: dict[str, Any] = {}
    for flat, value in (overrides or {}).items():
        if value is None:
            continue
        where = FLAT_KEYS[flat]
        if flat in ("ingest_root", "ingest_roots"):  # repeatable: the flags add up
            value = list(_get(cli, where) or []) + list(value)
        _set(cli, where, value)
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        sources[tuple(where)] = f"--{flat.replace('_', '-')} {shown}"
    data = _merge(data, cli)
    data["config_path"] = path
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, path, sources)) from None


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The settings model a validation error's location points into (for "did you mean")."""
    model: Any = Settings
    steps = list(loc[:-1])
    while steps and model is not None:
        step = steps.pop(0)
        if model is Settings and step in ("servers", "hosts") and steps:
            steps.pop(0)  # the server's (or host's) own name
            model = ServerConfig if step == "servers" else HostSettings
            continue
        field = model.model_fields.get(str(step)) if isinstance(model, type) else None
        annotation = getattr(field, "annotation", None)
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


_JSONC_COMMENT = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)
_JSONC_COMMA = re.compile(r'"(?:[^"\\]|\\.)*"|,(?=\s*[}\]])', re.S)


def strip_jsonc(text: str) -> str:
    """JSONC as JSON: `//` and `/* */` comments and trailing commas removed; strings left alone."""
    keep = lambda m: m.group() if m.group().startswith('"') else ""  # noqa: E731
    return _JSONC_COMMA.sub(keep, _JSONC_COMMENT.sub(keep, text))


def format_validation_error(
    exc: ValidationError, path: Path | None, sources: dict[tuple[str, ...], str] | None = None
) -> str:
    """One line per error, each named by where its value came from: the file, or a flag or CTX_ variable."""
    sources = sources or {}
    lines: list[str] = []
    from_file = False
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        origin = sources.get(tuple(str(p) for p in err["loc"]))
        if not err["loc"]:  # a check across keys: the flag or variable whose key it names
            origin = next((o for k, o in sources.items() if re.search(rf"\b{k[-1]}\b", msg)), None)
            loc = "settings"
        from_file = from_file or origin is None
        if origin:
            loc = f"{origin} ({loc})"
        if err["type"] == "extra_forbidden" and err["loc"]:
            key = str(err["loc"][-1])
            model = _model_at(tuple(err["loc"]))
            known = sorted(model.model_fields) if model is not None else []
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            msg = f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            if known and not close:
                msg += f"; known keys: {', '.join(known)}"
        lines.append(f"  {loc}: {msg}")
    where = f" in {path}" if path and from_file else ""
    return "\n".join([f"invalid settings{where}:", *lines])


def to_toml(servers: dict[str, dict[str, Any]]) -> str:
    """Render `[servers.*]` tables (for `import`)."""
    out: list[str] = []
    for name, cfg in servers.items():
        out.append(f"[servers.{name}]")
        for key, value in cfg.items():
            out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
