"""gateway.proxy.reload.plan: what a reloaded configuration changes, without starting anything."""

from gateway.proxy.reload import plan
from gateway.settings import Settings


def settings(servers: dict, **gateway: object) -> Settings:
    return Settings(servers=servers, gateway={"workspace": "/tmp/ws", **gateway})


A = {"command": "a-server", "args": ["--x"]}
B = {"url": "http://127.0.0.1:9000/mcp"}


def test_added_removed_restarted_updated() -> None:
    old = settings({"a": A, "b": B, "c": {"command": "c"}})
    new = settings({"a": A | {"args": ["--y"]}, "b": B | {"tools": {"exclude": ["x"]}}, "d": {"command": "d"}})
    change = plan(old, new)
    assert change.added == ["d"] and change.removed == ["c"]
    assert change.restarted == ["a"]  # its command line changed: a new process
    assert change.updated == ["b"]  # only its filter: same connection
    assert change.summary() == "added d; removed c; restarted a; updated b"


def test_disabled_is_removed_and_unchanged_is_empty() -> None:
    assert plan(settings({"a": A}), settings({"a": A})).empty
    assert plan(settings({"a": A}), settings({"a": A | {"enabled": False}})).removed == ["a"]


def test_gateway_keys_live_or_restart() -> None:
    change = plan(settings({}), settings({}, tool_mode="catalog", budget=4000, port=9000, separator="_"))
    assert change.live == {"budget": 4000, "tool_mode": "catalog"}
    assert change.needs_restart == ["[gateway] separator", "[gateway] port"]  # in the order of the settings


def test_other_sections_need_a_restart() -> None:
    old = settings({})
    new = Settings(
        gateway={"workspace": "/tmp/ws"},
        llm={"model": "m"},
        plugins={"offload": {"response_ttl_hours": 2}},
        hosts={"LM Studio": {"context_window": 8192}},
    )
    change = plan(old, new)
    assert change.needs_restart == ["[llm]", "[plugins.offload]"]
    assert change.hosts_changed and not change.empty
