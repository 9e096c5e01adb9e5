"""Opt-in: the image built from the Dockerfile, run with podman, spoken to over stdio and HTTP.

    MCP_GATEWAY_CONTAINER_TEST=1 pytest -m container

`tests/container/build.sh` builds it (installing podman, runc and debootstrap when missing; root; about
three minutes cold). Without the variable these tests are skipped and say so: CI's default run does not
build images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from conftest import ROOT, free_port, wait_listening
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

pytestmark = [pytest.mark.anyio, pytest.mark.container]
CONF = {"CONTAINERS_CONF": str(ROOT / "tests" / "container" / "containers.conf")}
CONFIG = """\
[servers.demo]
command = "${PYTHON}"
args = ["-m", "gateway.cli.demo_upstream"]
max_response_size = 262144
"""


def _podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CONF}
    return subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    if os.environ.get("MCP_GATEWAY_CONTAINER_TEST") != "1":
        pytest.skip("set MCP_GATEWAY_CONTAINER_TEST=1 to build the image with podman (root, ~3 minutes cold)")
    if shutil.which("apt-get") is None and shutil.which("podman") is None:
        pytest.skip("no podman and no apt-get to install it")
    built = subprocess.run(
        ["bash", str(ROOT / "tests" / "container" / "build.sh")], capture_output=True, text=True, timeout=1800
    )
    assert built.returncode == 0, built.stderr[-2000:]
    yield built.stdout.strip().splitlines()[-1]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    folder = tmp_path / "config"  # the folder is mounted, as the README says (live reload sees saves by rename)
    folder.mkdir(mode=0o755)
    path = folder / "gateway.toml"
    path.write_text(CONFIG)
    path.chmod(0o644)
    return path


async def test_stdio_offloads_into_the_volume_and_says_where_the_host_sees_it(image: str, config: Path) -> None:
    argv = ["run", "-i", "--rm", "-v", f"{config.parent}:/config:ro", "-e", "CTX_WORKSPACE_ON_HOST=/home/me/gw"]
    params = StdioServerParameters(command="podman", args=[*argv, image], env={**os.environ, **CONF})
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = {t.name for t in (await session.list_tools()).tools}
        assert {"demo__list_orders", "response_query", "context_recall"} <= names
        big = await session.call_tool("demo__list_orders", {"count": 5000})
        ref = json.loads(big.content[0].text)["fileRef"]
        assert ref["path"].startswith("/data/responses/")  # what the tools take back
        assert ref["openCmd"] == "xdg-open /home/me/gw/responses/" + ref["path"].rsplit("/", 1)[1]
        answer = await session.call_tool("response_query", {"path": ref["id"], "sql": "SELECT count(*) FROM items"})
        assert json.loads(answer.content[0].text)["rows"] == [[5000]]


async def test_http_needs_its_token_and_serves_from_outside_the_container(image: str, config: Path) -> None:
    port = free_port()
    token = "t0ken-for-the-container-test"
    run = ["run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8808", "-v", f"{config.parent}:/config:ro"]
    started = _podman(*run, "-e", "CTX_TRANSPORT=http", "-e", f"CTX_AUTH_TOKEN={token}", image)
    container = started.stdout.strip()
    try:
        wait_listening(f"http://127.0.0.1:{port}/nothing", seconds=60)
        assert httpx2.post(f"http://127.0.0.1:{port}/mcp", json={}).status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            echo = await session.call_tool("demo__echo", {"text": "안녕 from outside"})
            assert echo.content[0].text == "안녕 from outside"
    finally:
        _podman("stop", "-t", "5", container, check=False)


def test_http_without_a_token_refuses_to_start(image: str) -> None:
    out = _podman("run", "--rm", "-e", "CTX_TRANSPORT=http", image, check=False)
    assert out.returncode == 2 and "CTX_AUTH_TOKEN" in out.stderr and "Traceback" not in out.stderr


def test_a_bind_mount_the_user_cannot_write_says_what_to_do(image: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)  # root's: the image's user (uid 10001) cannot write it
    out = _podman("run", "--rm", "-v", f"{data}:/data", image, check=False)
    assert out.returncode == 2 and '--user "$(id -u):$(id -g)"' in out.stderr, out.stderr
    mine = _podman("run", "--rm", "-i", "--user", "0:0", "-v", f"{data}:/data", image, "inspect", check=False)
    assert mine.returncode == 0, mine.stderr


def test_the_image_holds_no_sources_or_build_leftovers(image: str) -> None:
    listing = _podman("run", "--rm", "--entrypoint", "sh", image, "-c", "ls -d /src /app build *.egg-info 2>&1; true")
    assert "No such file" in listing.stdout and "egg-info\n" not in listing.stdout
