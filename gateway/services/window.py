"""The model's context window for each host connection, where that figure came from, and what derives
from it: the token budget and the offload limit.

Precedence: the `context_window` setting (or `[hosts."<name>"] context_window`) > the figure the host
reports itself (a statusline bridge file) > the model endpoint's discovered window > the usual window of
a known host (by the name it gives in `clientInfo`) > unknown. An unknown window is never invented:
the monitor stays silent and the offload token limit is `UNKNOWN_WINDOW_RESULT_TOKENS`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.services.context_levels import HostBridge
from gateway.services.namespaced import PerNamespace

if TYPE_CHECKING:
    from gateway.services.model_endpoint import ModelEndpoint
    from gateway.settings import Settings

DEFAULT_BUDGET = 4000  # tokens, when neither the setting nor a window gives one
UNKNOWN_WINDOW_RESULT_TOKENS = 4000  # offload above this when the window is unknown (safe for a 16k model)


@dataclass(frozen=True)
class KnownHost:
    label: str
    window: int | None  # None: the host runs whatever model the user loads (the endpoint's window)
    result_tokens: int | None = None  # the host's own cap on one tool result, kept below it


# Hosts by the `clientInfo.name` they send (matched case-insensitively, as a prefix, `-`/`_`/space alike).
# Windows are the usual figure for the models each host runs by default; set `[hosts."<name>"]` to correct one.
KNOWN_HOSTS: dict[str, KnownHost] = {
    # Claude Code refuses results above 25k tokens (its count); this estimate leans high, so 25k stays below it
    "claude-code": KnownHost("Claude Code", 200_000, 25_000),
    "claude-ai": KnownHost("Claude Desktop", 200_000),
    "claude-desktop": KnownHost("Claude Desktop", 200_000),
    "cursor": KnownHost("Cursor", 128_000),
    "visual-studio-code": KnownHost("VS Code", 128_000),
    "vscode": KnownHost("VS Code", 128_000),
    "windsurf": KnownHost("Windsurf", 128_000),
    "zed": KnownHost("Zed", 128_000),
    "gemini-cli": KnownHost("Gemini CLI", 1_048_576),
    "codex": KnownHost("Codex", 200_000, 2_500),  # cuts results at 10 KiB
    # hosts for local models: the window is the model server's (discovered from [llm])
    "lm-studio": KnownHost("LM Studio", None),
    "lmstudio": KnownHost("LM Studio", None),
    "ollama": KnownHost("Ollama", None),
    "llama-cpp": KnownHost("llama.cpp", None),
    "jan": KnownHost("Jan", None),
    "anythingllm": KnownHost("AnythingLLM", None),
    "open-webui": KnownHost("Open WebUI", None),
}


@functools.lru_cache(maxsize=512)  # asked on every call for the same few names
def normalize(name: str) -> str:
    return re.sub(r"[\s_.]+", "-", name.strip().lower())


@functools.lru_cache(maxsize=512)
def known_host(name: str | None) -> KnownHost | None:
    if not name:
        return None
    key = normalize(name)
    for prefix in sorted(KNOWN_HOSTS, key=len, reverse=True):
        if key == prefix or key.startswith(prefix + "-") or key.startswith(prefix):
            return KNOWN_HOSTS[prefix]
    return None


@dataclass(frozen=True)
class Window:
    tokens: int | None  # None = unknown
    source: str

    def describe(self) -> str:
        return f"{self.tokens} tokens ({self.source})" if self.tokens else f"unknown ({self.source})"


class ContextWindow:
    def __init__(self, settings: Settings, llm: ModelEndpoint, bridge: HostBridge | None = None):
        self.settings = settings
        self.llm = llm
        self.bridge = bridge or HostBridge()
        # host connection -> the clientInfo name it gave; connections come and go: the newest kept, per namespace
        self.hosts: PerNamespace[str] = PerNamespace(256)

    def note_host(self, session_id: str, client_name: str | None, namespace: str = "") -> None:
        if client_name:
            self.hosts.put(namespace, session_id, client_name)

    def _host_setting(self, name: str | None) -> tuple[str, int]:
        """The `[hosts."<key>"]` table that names this host (case, spaces, `-` and `_` alike)."""
        if name:
            for key, table in self.settings.hosts.items():
                if normalize(key) == normalize(name) and table.context_window:
                    return key, table.context_window
        return "", 0

    def for_session(self, session_id: str | None = None) -> Window:
        name = self.hosts.get(session_id or "")
        if self.settings.gateway.context_window:
            return Window(self.settings.gateway.context_window, "context_window setting")
        key, configured = self._host_setting(name)
        if configured:
            return Window(configured, f'[hosts."{key}"] setting')
        figure = self.bridge.current()
        if figure is not None and figure.window:
            return Window(figure.window, "reported by the host")
        if self.llm.window:
            return Window(self.llm.window, self.llm.window_source or "model endpoint")
        host = known_host(name)
        if host is not None and host.window:
            return Window(host.window, f"usual window of {host.label}")
        if host is not None:
            return Window(None, f"{host.label} runs the model of your endpoint, which did not answer")
        return Window(None, f"host {name!r} is not known" if name else "the host did not name itself")

    def size(self, session_id: str | None = None) -> int | None:
        return self.for_session(session_id).tokens

    def budget(self, session_id: str | None = None) -> int:
        """The token budget: the setting, else half the window, else 4000."""
        if self.settings.gateway.budget:
            return self.settings.gateway.budget
        window = self.size(session_id)
        return window // 2 if window else DEFAULT_BUDGET

    def limit(self, server: str | None, key: Literal["max_response_size", "max_response_tokens"]) -> int:
        """A per-server setting, else the [gateway] one."""
        cfg = self.settings.servers.get(server) if server else None
        value = getattr(cfg, key, None) if cfg else None
        return value if value is not None else getattr(self.settings.gateway, key)

    def max_response_tokens(self, server: str | None, session_id: str | None = None) -> int:
        """Results above this many tokens are offloaded: the per-server or global setting, else half the
        budget (below the host's own cap on a result, where it has one), else a constant when the window
        is unknown."""
        if configured := self.limit(server, "max_response_tokens"):
            return configured
        window = self.for_session(session_id)
        if window.tokens is None and not self.settings.gateway.budget:
            return UNKNOWN_WINDOW_RESULT_TOKENS
        derived = self.budget(session_id) // 2
        host = known_host(self.hosts.get(session_id or ""))
        if host is not None and host.result_tokens:
            derived = min(derived, host.result_tokens)
        return derived

    def max_response_size(self, server: str | None) -> int:
        return self.limit(server, "max_response_size")
