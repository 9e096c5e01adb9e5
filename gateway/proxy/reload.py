"""Live reload: the config file is watched (and SIGHUP re-reads it); a change is applied to the
running gateway without the host restarting it.

Servers added are started, removed ones stopped (their processes end), a server whose connection
changed is restarted; a change that only touches how the gateway shows a server (filters, prefix,
tool mode, offload policy, limits) applies in place. Of the gateway-wide settings, the window and
result limits and the tool mode apply live; the rest (transport, host, port, workspace, plugins,
the model endpoint, tokens) is logged as needing a restart. A file that does not load is logged
with the message `inspect` prints, and the running configuration stays in force.

A file caught mid-save can be valid TOML that ends early: the servers after the cut would stop (their
calls in flight failing) or restart with half their settings. So a change is applied only once the
file has stayed the same for `SETTLE_SECONDS` (re-read and compared byte for byte; changed, it is
loaded again and waited for again). Every change waits, not only those that stop a process: a cut
can as well drop a tool filter or a size limit, and a second is nothing for a save.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

import gateway.proxy.sighup as sighup
from gateway.settings import ConfigError, GatewaySettings, ServerConfig, Settings

log = logging.getLogger("gateway.reload")

# [gateway] keys read at each use (window, limits, tool mode): they change without a restart
LIVE_GATEWAY_KEYS = ("budget", "context_window", "max_response_size", "max_response_tokens", "tool_mode")
# what a running upstream connection was made from: a change means stopping it and starting anew
CONNECTION_KEYS = (
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "transport",
    "headers",
    "init_timeout_seconds",
    "ping_seconds",
)
DEBOUNCE_MS = 300  # editors write a file in several steps (truncate, write, rename)
WATCH_LOOKS_MS = 1000  # how often the watcher thread looks at its stop event (nobody waits for it to end)
# how long a file must stay unchanged before it is applied: editors finish a save in milliseconds,
# a script writing in pieces or a network file system within a few hundred
SETTLE_SECONDS = 0.75
SETTLE_TRIES = 8  # a file still changing after this many looks is left to its next change event
STOP_WAIT = 10.0


@dataclass
class Plan:
    """What a reloaded configuration changes, by name."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)  # same connection, other settings: applied in place
    live: dict[str, Any] = field(default_factory=dict)  # [gateway] key -> new value
    hosts_changed: bool = False
    needs_restart: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.added
            or self.removed
            or self.restarted
            or self.updated
            or self.live
            or self.hosts_changed
            or self.needs_restart
        )

    def summary(self) -> str:
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("removed", self.removed),
                ("restarted", self.restarted),
                ("updated", self.updated),
            )
            if names
        ]
        parts += [f"[gateway] {key} = {value!r}" for key, value in self.live.items()]
        if self.hosts_changed:
            parts.append("[hosts] updated")
        return "; ".join(parts) or "nothing to apply"


def plan(old: Settings, new: Settings) -> Plan:
    """Compare the running settings with reloaded ones (pure: nothing is started or stopped)."""
    out = Plan()
    before, after = old.enabled_servers, new.enabled_servers
    out.removed = [name for name in before if name not in after]
    for name, cfg in after.items():
        if name not in before:
            out.added.append(name)
        elif cfg != before[name]:
            (out.restarted if _connection_changed(before[name], cfg) else out.updated).append(name)
    for key in GatewaySettings.model_fields:
        if getattr(old.gateway, key) != getattr(new.gateway, key):
            if key in LIVE_GATEWAY_KEYS:
                out.live[key] = getattr(new.gateway, key)
            else:
                out.needs_restart.append(f"[gateway] {key}")
    out.hosts_changed = old.hosts != new.hosts
    if old.llm != new.llm:
        out.needs_restart.append("[llm]")
    out.needs_restart += [
        f"[plugins.{name}]"
        for name in sorted(set(old.plugins) | set(new.plugins))
        if old.plugins.get(name) != new.plugins.get(name)
    ]
    if old.auth != new.auth:
        out.needs_restart.append("[auth]")
    return out


def _connection_changed(old: ServerConfig, new: ServerConfig) -> bool:
    return any(getattr(old, key) != getattr(new, key) for key in CONNECTION_KEYS)


class Reconfigurable(Protocol):
    """What a reload acts on (the running `Gateway`)."""

    settings: Settings

    async def reconfigure(self, new: Settings, change: Plan) -> None: ...


class ConfigReloader:
    """Re-reads the settings (`load`, the same sources as at start) and applies what changed."""

    def __init__(self, gateway: Reconfigurable, load: Callable[[], Settings]):
        self.gateway = gateway
        self.load = load
        self._lock = anyio.Lock()
        self.applied = 0  # reloads that changed something (tests wait on it)
        self.failed = 0
        self.listening = anyio.Event()  # set once SIGHUP is handled here (before, it would end the process)

    async def reload(self, why: str) -> Plan | None:
        """Load and apply, once the file has settled; None (logged, the running configuration kept) when
        the file does not load or does not settle."""
        async with self._lock:
            for _ in range(SETTLE_TRIES):
                before = await anyio.to_thread.run_sync(_read, self.gateway.settings.config_path)
                new = await self._load(why)
                if new is None:
                    return None
                change = plan(self.gateway.settings, new)
                if change.empty:
                    log.info("config reload (%s): no change", why)
                    return change
                await anyio.sleep(SETTLE_SECONDS)
                if before == await anyio.to_thread.run_sync(_read, self.gateway.settings.config_path):
                    break
                log.info("config reload (%s): the file is still being written; waiting for it to settle", why)
            else:
                self.failed += 1
                log.error("config reload (%s): the file kept changing; the running configuration stays in force", why)
                return None
            for what in change.needs_restart:
                log.warning("config reload: %s changed; it needs a restart of the gateway to apply", what)
            await self.gateway.reconfigure(new, change)
            self.applied += 1
            log.warning("config reloaded (%s): %s", why, change.summary())
            return change

    async def _load(self, why: str) -> Settings | None:
        """The settings, parsed and validated whole; None (logged) when they do not load."""
        try:
            new = await anyio.to_thread.run_sync(self.load)
        except ConfigError as exc:
            self.failed += 1
            message = " ".join(line.strip() for line in str(exc).splitlines())
            log.error("config reload (%s): %s; the running configuration stays in force", why, message)
            return None
        except Exception as exc:  # never let a reload take the gateway down
            self.failed += 1
            log.exception("config reload (%s) failed: %s; the running configuration stays in force", why, exc)
            return None
        if self.gateway.settings.servers and not new.servers:
            # an editor that truncates before it writes, a half-written file: never "no servers"
            self.failed += 1
            log.error(
                "config reload (%s): the file names no servers; the running configuration stays in force "
                "(restart the gateway to run it without servers)",
                why,
            )
            return None
        return new

    async def watch(self) -> None:
        """Reload on every change to the config file (by name: editors save by writing a new file and
        renaming it over the old one) and, on POSIX, on SIGHUP. Runs until cancelled."""
        async with anyio.create_task_group() as tg:
            if sys.platform != "win32":
                tg.start_soon(self._on_sighup)
            path = self.gateway.settings.config_path
            if path is not None:
                tg.start_soon(self._on_file_change, path)

    async def _on_sighup(self) -> None:
        with anyio.open_signal_receiver(signal.SIGHUP) as received:
            self.listening.set()
            if sighup.EARLY.is_set():  # sent while the gateway was starting
                sighup.EARLY.clear()
                await self.reload("SIGHUP during start")
            async for _ in received:
                await self.reload("SIGHUP")

    async def _on_file_change(self, path: Any) -> None:
        # imported in a worker thread: the loop is answering the host's first requests meanwhile
        watchfiles = await anyio.to_thread.run_sync(importlib.import_module, "watchfiles")
        changes, changed = anyio.create_memory_object_stream[None](1)
        stop = threading.Event()
        token = anyio.lowlevel.current_token()

        def tell() -> None:
            with contextlib.suppress(anyio.WouldBlock):  # a reload is pending already: it reads the file anew
                changes.send_nowait(None)

        def watch() -> None:
            try:
                for _ in watchfiles.watch(
                    path.parent,
                    watch_filter=lambda _change, name: name == str(path),
                    debounce=DEBOUNCE_MS,
                    step=50,
                    recursive=False,
                    stop_event=stop,
                    rust_timeout=WATCH_LOOKS_MS,
                    raise_interrupt=False,
                ):
                    anyio.from_thread.run_sync(tell, token=token)
            except anyio.RunFinishedError:  # the gateway stopped meanwhile
                pass
            except Exception as exc:  # a folder that cannot be watched: SIGHUP still works
                log.warning("cannot watch %s for changes (%s); send SIGHUP to reload it", path, exc)

        # a daemon thread, never waited for: an exit would otherwise wait for the watcher's next look at
        # `stop` (~0.2 s of the exit of a gateway started per task with a look every 300 ms)
        threading.Thread(target=watch, name="config-watch", daemon=True).start()
        try:
            async with changed:
                async for _ in changed:
                    await self.reload(f"{path.name} changed")
        finally:
            stop.set()


def _read(path: Path | None) -> bytes | None:
    """The config file's bytes, to tell whether it changed (None: no file, or unreadable now)."""
    try:
        return path.read_bytes() if path is not None else None
    except OSError:
        return None
