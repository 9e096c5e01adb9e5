"""gateway.settings: file < environment < command line; plugin tables; host mcp.json; clear errors."""

import json
import re
from pathlib import Path

import pytest

from gateway.settings import ConfigError, load_settings


def write(tmp_path: Path, text: str, name: str = "g.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_precedence_and_flat_names(tmp_path: Path) -> None:
    cfg = write(tmp_path, "[gateway]\nbudget = 1000\n[plugins.offload]\nresponse_ttl_hours = 1\n")
    assert load_settings(cfg, environ={}).gateway.budget == 1000
    env = {"CTX_BUDGET": "2000", "CTX_RESPONSE_TTL_HOURS": "7", "CTX_INGEST_ROOTS": "/a:/b"}
    from_env = load_settings(cfg, environ=env)
    assert from_env.gateway.budget == 2000
    assert from_env.plugins == {"offload": {"response_ttl_hours": "7"}, "documents": {"ingest_roots": "/a:/b"}}
    cli = load_settings(cfg, {"budget": 3000, "ingest_root": ["/c"], "ingest_roots": ["/d"]}, environ=env)
    assert cli.gateway.budget == 3000 and cli.plugins["documents"]["ingest_roots"] == ["/c", "/d"]


def test_plugins_lists(tmp_path: Path) -> None:
    assert load_settings(None, environ={}).gateway.plugins is None  # every installed plugin
    s = load_settings(None, environ={"CTX_PLUGINS": "offload, monitor", "CTX_DISABLED_PLUGINS": "memory"})
    assert s.gateway.plugins == ["offload", "monitor"] and s.gateway.disabled_plugins == ["memory"]


def test_host_mcp_json(tmp_path: Path) -> None:
    cfg = write(tmp_path, '{"mcpServers": {"my fs": {"command": "npx", "args": ["-y", "x"]}}}', "mcp.json")
    assert load_settings(cfg, environ={}).servers["my-fs"].args == ["-y", "x"]


def test_an_upstream_transport_as_hosts_spell_it(tmp_path: Path) -> None:
    entries = {
        "a": {"type": "sse", "url": "http://h/sse"},
        "b": {"transport": "SSE", "url": "http://h/events"},
        "c": {"transportType": "sse", "url": "http://h/x"},
        "d": {"type": "streamable-http", "url": "http://h/mcp"},
        "e": {"type": "streamableHttp", "url": "http://h/mcp"},
        "f": {"type": "stdio", "command": "x"},
    }
    servers = load_settings(write(tmp_path, json.dumps({"mcpServers": entries}), "mcp.json"), environ={}).servers
    expected = {"a": "sse", "b": "sse", "c": "sse", "d": "http", "e": "http", "f": "stdio"}
    assert {name: cfg.transport for name, cfg in servers.items()} == expected
    toml = load_settings(write(tmp_path, "[servers.t]\nurl = 'http://h/sse'\ntransport = 'sse'\n"), environ={})
    assert toml.servers["t"].transport == "sse"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gateway]\nbudgte = 1\n", "gateway.budgte: unknown key 'budgte' (did you mean 'budget'?)"),
        ("[gateway]\nmax_response_size = 10\n", "max_response_size must be between 256"),
        ("[servers.a]\ncommand = 'x'\nurl = 'http://y'\n", "give either `command`"),
        ("[gateway]\ntransport = 'http'\nhost = '0.0.0.0'\n", "set auth_token"),
        ("[gateway\n", "is not valid TOML"),
        ("[servers.a]\nurl = 'http://y'\ntransport = 'stdio'\n", 'give transport = "http" (Streamable HTTP) or "sse"'),
        ("[servers.a]\ncommand = 'x'\ntransport = 'sse'\n", 'transport "sse" needs `url`'),
        (
            "[servers.a]\ncommand = 'x'\ntools = { rename = { a = 'r', b = 'r' } }\n",
            "tools.rename gives several tools the name 'r'",
        ),
        ("[servers.a]\ncommand = 'x'\ntools = { rename = { a = 'read file' } }\n", "use 1-64 letters"),
    ],
)
def test_errors_are_one_clear_message(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings(write(tmp_path, text), environ={})


def test_named_tokens_from_the_table_and_a_file(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# name token\nbob  bob-token-0123456789abcdef\n\n")
    cfg = write(
        tmp_path,
        '[[auth.tokens]]\nname = "alice"\ntoken = "alice-token-0123456789ab"\n'
        f'[auth]\ntokens_file = "{tokens}"\n[gateway]\ntransport = "http"\nhost = "0.0.0.0"\n',
    )
    settings = load_settings(cfg, environ={})  # named tokens satisfy "a token off loopback"
    assert [t.name for t in settings.auth.all_tokens()] == ["alice", "bob"]
    tokens.write_text("carol short\n")
    with pytest.raises(ConfigError, match="tokens:1: a token must be at least 16 characters"):
        settings.auth.all_tokens()
    with pytest.raises(ConfigError, match=r"token name '\.\./x'"):
        load_settings(write(tmp_path, '[[auth.tokens]]\nname = "../x"\ntoken = "0123456789abcdef0"\n'), environ={})


def test_an_unknown_key_says_what_was_meant(tmp_path: Path) -> None:
    path = write(tmp_path, '[gateway]\nworkspce = "/tmp/x"\n\n[servers.a]\ncommand = "x"\ntimeout_second = 5\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    text = str(caught.value)
    assert "gateway.workspce: unknown key 'workspce' (did you mean 'workspace'?)" in text
    assert "servers.a.timeout_second: unknown key 'timeout_second' (did you mean 'timeout_seconds'?)" in text
    path = write(tmp_path, "[auth]\nzzz = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'zzz'; known keys: tokens, tokens_file"):
        load_settings(path, environ={})


def test_json_with_comments_and_trailing_commas_is_accepted(tmp_path: Path) -> None:
    text = """{
      // my servers (VS Code writes mcp.json like this)
      "mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "pkg", "http://a//b, }",], /* the folder */},
      },
    }"""
    settings = load_settings(write(tmp_path, text, "mcp.json"), environ={})
    assert settings.servers["fs"].args == ["-y", "pkg", "http://a//b, }"]
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_settings(write(tmp_path, '{"mcpServers": {"fs": }', "bad.json"), environ={})
