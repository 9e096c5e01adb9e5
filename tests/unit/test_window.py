"""gateway.services.window: which window a host has, where the figure came from, what derives from it."""

from pathlib import Path

from gateway.services.context_levels import HostFigure
from gateway.services.window import UNKNOWN_WINDOW_RESULT_TOKENS, ContextWindow, known_host
from gateway.settings import load_settings


class Endpoint:
    def __init__(self, window: int | None = None) -> None:
        self.window, self.window_source = window, "llama.cpp /props n_ctx" if window else ""


class Bridge:
    def __init__(self, figure: HostFigure | None = None) -> None:
        self.figure = figure

    def current(self) -> HostFigure | None:
        return self.figure


def window(tmp_path: Path, toml: str = "", endpoint: int | None = None, bridge: HostFigure | None = None):
    cfg = tmp_path / "g.toml"
    cfg.write_text(toml)
    return ContextWindow(load_settings(cfg, environ={}), Endpoint(endpoint), Bridge(bridge))  # type: ignore[arg-type]


def test_known_hosts_by_their_client_info_name() -> None:
    assert known_host("claude-code").window == 200_000
    assert known_host("Claude Code").label == "Claude Code"
    assert known_host("claude-ai").label == "Claude Desktop"
    assert known_host("Visual Studio Code").label == "VS Code"
    assert known_host("mcp") is None and known_host(None) is None


def test_precedence(tmp_path: Path) -> None:
    w = window(tmp_path)
    w.note_host("s", "claude-code")
    assert w.for_session("s").tokens == 200_000 and w.max_response_tokens(None, "s") == 25_000
    assert window(tmp_path, endpoint=8192).for_session("s").tokens == 8192  # no name: the endpoint decides
    e = window(tmp_path, endpoint=8192)
    e.note_host("s", "claude-code")
    assert e.for_session("s").tokens == 8192  # the endpoint's window over the usual one
    b = window(tmp_path, endpoint=8192, bridge=HostFigure(40.0, 1_000_000))
    b.note_host("s", "claude-code")
    assert b.for_session("s").source == "reported by the host" and b.size("s") == 1_000_000
    h = window(tmp_path, '[hosts."claude code"]\ncontext_window = 64000\n', endpoint=8192)
    h.note_host("s", "claude-code")
    assert h.for_session("s").tokens == 64000
    g = window(tmp_path, "[gateway]\ncontext_window = 9000\n", endpoint=8192)
    assert g.for_session("s").tokens == 9000 and g.budget("s") == 4500 and g.max_response_tokens(None, "s") == 2250


def test_unknown_window_is_not_invented(tmp_path: Path) -> None:
    w = window(tmp_path)
    w.note_host("s", "a-new-host")
    assert w.for_session("s").tokens is None and "not known" in w.for_session("s").source
    assert w.budget("s") == 4000 and w.max_response_tokens(None, "s") == UNKNOWN_WINDOW_RESULT_TOKENS
    lm = window(tmp_path)
    lm.note_host("s", "LM Studio")
    assert lm.for_session("s").tokens is None and "endpoint" in lm.for_session("s").source
    set_limit = window(tmp_path, "[gateway]\nmax_response_tokens = 1500\n")
    assert set_limit.max_response_tokens(None, "s") == 1500
