"""The model's context window and what derives from it: the token budget and the result limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.services.model_endpoint import ModelEndpoint
    from gateway.settings import Settings

DEFAULT_BUDGET = 4000


class ContextWindow:
    def __init__(self, settings: Settings, llm: ModelEndpoint):
        self.settings = settings
        self.llm = llm

    def size(self) -> int:
        """The model's window: the setting, else discovered from the endpoint, else 2 x budget."""
        cfg = self.settings.gateway
        return cfg.context_window or self.llm.window or 2 * (cfg.budget or DEFAULT_BUDGET)

    def budget(self) -> int:
        """The token budget: the setting, else half the (set or discovered) window, else 4000."""
        cfg = self.settings.gateway
        if cfg.budget:
            return cfg.budget
        window = cfg.context_window or self.llm.window
        return window // 2 if window else DEFAULT_BUDGET

    def limit(self, server: str | None, key: Literal["max_response_size", "max_response_tokens"]) -> int:
        """A per-server setting, else the [gateway] one."""
        cfg = self.settings.servers.get(server) if server else None
        value = getattr(cfg, key, None) if cfg else None
        return value if value is not None else getattr(self.settings.gateway, key)

    def max_response_tokens(self, server: str | None) -> int:
        """Results above this many tokens are offloaded: the per-server or global setting, else budget / 2."""
        return self.limit(server, "max_response_tokens") or self.budget() // 2

    def max_response_size(self, server: str | None) -> int:
        return self.limit(server, "max_response_size")
