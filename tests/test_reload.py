"""Live reload of the config: a running gateway gains and loses servers without the host restarting it."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from conftest import PY, call, eventually, inproc, make_settings, ok, probe, stdio_gateway, text_of, write_config
from mcp import ClientSession

from gateway.proxy.reload import SETTLE_SECONDS, ConfigReloader
from gateway.settings import load_settings

pytestmark = pytest.mark.anyio


class Changes:
    """Counts the tools/list_changed notifications a host receives."""

    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.count += 1


def save(path: Path, text: str) -> None:
    """Save the way editors do: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def ended(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


async def tool_names(session: ClientSession) -> set[str]:
    return {t.name for t in (await session.list_tools()).tools}


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see the removed server's process end")
async def test_a_running_gateway_gains_and_loses_servers(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"a": probe("a")})
    config_text = cfg.read_text()
    changes = Changes()
    errlog_path = tmp_path / "gw.err"
    async with stdio_gateway(cfg, errlog_path, message_handler=changes) as session:
        assert "a__echo" in await tool_names(session)
        pid_a = int(text_of(await session.call_tool("a__pid", {})))

        # a server added: started, listed, callable; the host told
        seen = changes.count
        save(cfg, config_text.replace("[servers.a]", _table("b") + "\n[servers.a]"))
        await eventually(lambda: changes.count > seen, 20, "list_changed after adding b")
        await eventually_listed(session, "b__echo")
        assert text_of(await session.call_tool("b__whoami", {})) == "b"

        # a server removed: its tools gone, its process ended
        seen = changes.count
        save(cfg, config_text.replace(_table("a"), _table("b")))
        await eventually(lambda: changes.count > seen, 20, "list_changed after removing a")
        names = await tool_names(session)
        assert "b__echo" in names and not any(n.startswith("a__") for n in names)
        await eventually(lambda: ended(pid_a), 15, "server a's process to end")

        # a broken edit: logged with the one-line config message, the running configuration kept
        save(cfg, config_text.replace(_table("a"), _table("b")) + "\n[servers.c\ncommand = \n")
        await eventually(lambda: b"the running configuration stays in force" in errlog_path.read_bytes(), 20)
        assert b"is not valid TOML" in errlog_path.read_bytes()
        assert b"Traceback" not in errlog_path.read_bytes()
        assert text_of(await session.call_tool("b__whoami", {})) == "b"

        # fixed again: applied
        seen = changes.count
        save(cfg, config_text.replace(_table("a"), _table("b") + _table("c")))
        await eventually(lambda: changes.count > seen, 20, "list_changed after the fix")
        await eventually_listed(session, "c__echo")
        assert text_of(await session.call_tool("c__whoami", {})) == "c"


async def eventually_listed(session: ClientSession, name: str) -> None:
    with anyio.fail_after(20):
        while name not in await tool_names(session):
            await anyio.sleep(0.05)


def _table(name: str) -> str:
    args = ", ".join(f'"{a}"' for a in probe(name)["args"])
    return f'[servers.{name}]\ncommand = "{PY}"\nargs = [{args}]\n'


@pytest.mark.skipif(sys.platform == "win32", reason="SIGHUP is POSIX")
async def test_sighup_reloads_and_a_changed_server_restarts(tmp_path: Path) -> None:
    """SIGHUP re-reads the settings; a server whose command line changed is restarted (new process), one
    whose filter changed keeps its process, and a setting that cannot change live is reported."""
    settings = make_settings(tmp_path, {"a": probe("a"), "b": probe("b")})
    (tmp_path / "next").mkdir()
    new_cfg = write_config(
        tmp_path / "next",
        {"a": probe("a", "--extra-tools", "2"), "b": probe("b", tools={"exclude": ["hang"]})},
        workspace=str(settings.gateway.workspace),
        port=9999,
    )
    changes = Changes()
    async with inproc(settings, notes=changes) as (gateway, session):
        await gateway.wait_ready()
        pid_a = int(text_of(await session.call_tool("a__pid", {})))
        pid_b = int(text_of(await session.call_tool("b__pid", {})))
        reloader = ConfigReloader(gateway, lambda: load_settings(new_cfg, environ={}))
        async with anyio.create_task_group() as tg:
            tg.start_soon(reloader.watch)
            with anyio.fail_after(5):
                await reloader.listening.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await eventually(lambda: reloader.applied == 1, 20, "the SIGHUP reload")
            tg.cancel_scope.cancel()
        await eventually_listed(session, "a__extra_1")
        names = await tool_names(session)
        assert "b__hang" not in names and "b__echo" in names
        assert int(text_of(await session.call_tool("a__pid", {}))) != pid_a
        assert int(text_of(await session.call_tool("b__pid", {}))) == pid_b
        assert changes.count >= 1
        assert gateway.settings.gateway.port == 8808  # needs a restart: not applied
        assert (await ok(session, "b__add", {"a": 1, "b": 2}))["sum"] == 3


async def test_a_reload_while_a_listing_waits_for_a_slow_server(tmp_path: Path) -> None:
    """A slow server being added, a tools/list waiting for it, a second save adding another: the listing
    answers (it used to fail with "dictionary changed size during iteration")."""
    settings = make_settings(tmp_path, {"a": probe("a")})
    configs = []
    # b's start (its imports and 0.5 s more) outlasts the moment the second save is applied by far: that
    # follows the first at once (it was 2 s more)
    for i, servers in enumerate(
        [
            {"a": probe("a"), "b": probe("b", "--start-delay", "0.5")},
            {"a": probe("a"), "b": probe("b", "--start-delay", "0.5"), "c": probe("c")},
        ]
    ):
        (tmp_path / f"v{i}").mkdir()
        configs.append(write_config(tmp_path / f"v{i}", servers, workspace=str(settings.gateway.workspace)))
    async with inproc(settings) as (gateway, session):
        await gateway.wait_ready()
        first = ConfigReloader(gateway, lambda: load_settings(configs[0], environ={}))
        second = ConfigReloader(gateway, lambda: load_settings(configs[1], environ={}))
        await first.reload("save 1")
        listed: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def listing() -> None:
                listed.append(await session.send_request(types.ListToolsRequest(), types.ListToolsResult))

            tg.start_soon(listing)
            tg.start_soon(gateway.wait_ready, 10)
            await anyio.sleep(0)  # let both start waiting on the slow server
            await second.reload("save 2")
        names = {t.name for t in listed[0].tools}
        assert "a__echo" in names
        await eventually_listed(session, "c__echo")


async def test_a_config_caught_mid_save_is_not_applied(tmp_path: Path) -> None:
    """The file is written in two steps: first cut inside server b's table (valid TOML: b with its command
    but not its arguments), the whole file shortly after (adding c). b is neither dropped nor restarted
    with half its settings: its call in flight answers, its process is the same; the whole file applies."""
    cfg = write_config(tmp_path, {"a": probe("a"), "b": probe("b")})
    whole = cfg.read_text() + _table("c")
    cut = whole[: whole.index("args", whole.index("[servers.b]"))]
    assert load_settings_text(tmp_path, cut).servers["b"].args == []  # the cut loads: valid and whole-looking
    errlog_path = tmp_path / "gw.err"
    async with stdio_gateway(cfg, errlog_path) as session:
        pid_b = int(text_of(await session.call_tool("b__pid", {})))
        slow: list[types.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def in_flight() -> None:
                slow.append(await call(session, "b__slow", {"seconds": 3}))

            tg.start_soon(in_flight)
            cfg.write_text(cut, encoding="utf-8")  # in place, as a writer caught half way
            await anyio.sleep(SETTLE_SECONDS / 2)  # the writer's pace: the rest comes well within the settle time
            cfg.write_text(whole, encoding="utf-8")
        assert not slow[0].is_error and text_of(slow[0]) == "slept", text_of(slow[0])
        await eventually_listed(session, "c__echo")  # the whole file applied
        assert int(text_of(await session.call_tool("b__pid", {}))) == pid_b
        assert text_of(await session.call_tool("b__whoami", {})) == "b"
    assert b"removed b" not in errlog_path.read_bytes() and b"restarted b" not in errlog_path.read_bytes()


def load_settings_text(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "cut" / "gateway.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ={})


async def test_a_serving_gateway_freezes_what_it_started_with_and_a_reload_thaws_it(tmp_path: Path) -> None:
    """A serving gateway moves what it started with out of the collector's sight, a little after its
    upstreams started; a reload that drops a server gives that back to the collector (the server's
    objects are garbage now) and freezes again once the new state is up."""
    cfg = write_config(tmp_path, {"a": probe("a"), "b": probe("b")})
    config_text = cfg.read_text()
    errlog_path = tmp_path / "gw.err"

    def frozen() -> int:
        return errlog_path.read_bytes().count(b"objects alive at start frozen")

    async with stdio_gateway(cfg, errlog_path, ["-m", "gateway", "--config", str(cfg), "--verbose"]) as session:
        await eventually(lambda: frozen() == 1, 20, "the start-up objects frozen")
        save(cfg, config_text.replace(_table("a"), ""))
        await eventually(lambda: frozen() == 2, 30, "frozen again after the reload")
        assert text_of(await session.call_tool("b__whoami", {})) == "b"


async def test_the_config_watcher_never_holds_an_exit(tmp_path: Path) -> None:
    """The file watcher looks at its stop event only every so often (WATCH_LOOKS_MS); an exit waited for
    that look (~0.2 s of every exit of a gateway started per task). Its thread is never waited for: the
    watch ends at once, a change still reaches a reload, and the thread ends on its own soon after."""
    import threading
    from types import SimpleNamespace

    config = tmp_path / "gateway.toml"
    config.write_text("[gateway]\n")
    reloads: list[str] = []

    class Watched(ConfigReloader):
        async def reload(self, why: str) -> Any:
            reloads.append(why)

    reloader = Watched(SimpleNamespace(settings=SimpleNamespace(config_path=config)), lambda: None)  # type: ignore[arg-type]

    def watchers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "config-watch"]

    async with anyio.create_task_group() as tg:
        tg.start_soon(reloader._on_file_change, config)
        await eventually(lambda: bool(watchers()))
        with anyio.fail_after(20):  # changed until one is seen (one made before the watch began is not)
            while not reloads:
                config.write_text(f"[gateway]\n# change {len(config.read_text())}\n")
                await anyio.sleep(0.05)
        watcher = watchers()[0]
        tg.cancel_scope.cancel()
    assert watcher.is_alive() and watcher.daemon  # the watch ended without waiting for its thread
    await eventually(lambda: not watcher.is_alive(), 20)  # it saw the stop event at its next look
    assert set(reloads) == {"gateway.toml changed"}
