"""Peak memory of the gateway while it offloads huge results, against the same read made directly.

    python bench/big_results.py [--sizes 10 68 200] [--korean 100] [--http]
    python bench/big_results.py --explore [--sizes 68]
    python bench/big_results.py --first [--sizes 68] [--rounds 3]

The real filesystem server (npm) reads a generated JSON file of each size and answers with one
JSON-RPC line holding the text and its structuredContent copy (about twice the file, escaped); files
over 150 MB, too long for Node's strings, are served the same way by `bench/file_server.py`; with
`--http`, that server answers every file over Streamable HTTP. For each file, a fresh gateway process
(stdio to the host) offloads it; the script prints the time of the direct
read and of the read through the gateway, the gateway's peak RSS (VmHWM) above its idle size, as a
multiple of the file, and its RSS once the call and the background work after it are done (memory
returned?). Idle is measured after one small offload, so the libraries an offload loads count as idle. `--korean` adds a text
file of Korean prose of that many MB. Targets: peak above idle <= 1.5x the file, time <= 1.3x direct.

`--first`: the first look and the first query against jq over the same file, in one run: a fresh gateway
offloads the file; `response_outline` right after the offloading call (its answer from the streaming
pass), then `SELECT sum(id) FROM items` right after that (it waits for the conversion the offload
started), then a second query; beside them `jq '[.items[] | .id] | add'` and `jq '.items | length'`.
Targets: the first outline within jq's time, the first query <= 1.5x jq's aggregate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from mcp import ClientSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import call, table
from npm_servers import npm_bin

from gateway.proxy.upstream_stdio import linear_stdio_client

NODE_LIMIT = 150 * 2**20
SENTENCE = "서울시 강남구의 한 카페에서 오늘 오후 세 시에 회의가 열렸고, 참석자들은 다음 분기 계획을 논의했다. "


def make_json(path: Path, mb: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{"meta": {"source": "bench"}, "items": [')
        i = 0
        while fh.tell() < mb * 2**20:
            record = {"id": i, "user": f"user{i}", "city": ["Seoul", "Busan", "Berlin"][i % 3], "note": 'a "q" \\ b'}
            fh.write(("," if i else "") + json.dumps(record, indent=1))
            i += 1
        fh.write("]}\n")


def make_korean(path: Path, mb: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        i = 0
        while fh.tell() < mb * 2**20:
            fh.write(f"{i:08d} {SENTENCE}\n")
            i += 1


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def child_pid(parent: int) -> int:
    """The gateway's pid: the only child of the stdio client's process (python -m gateway)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and b"gateway" in (proc / "cmdline").read_bytes():
                return int(proc.name)
    return 0


async def settled(pid: int) -> int:
    """RSS once it has stopped changing (5 s within 1 MB), or after 90 s."""
    last, steady = status(pid, "VmRSS"), 0
    with anyio.move_on_after(90):
        while steady < 10:
            await anyio.sleep(0.5)
            now = status(pid, "VmRSS")
            steady = steady + 1 if abs(now - last) < 2**20 else 0
            last = now
    return last


@asynccontextmanager
async def session(command: str, args: list[str], log: Path) -> AsyncIterator[ClientSession]:
    with open(log, "ab") as errlog:
        async with (
            linear_stdio_client(command, args, None, None, errlog) as streams,
            ClientSession(*streams) as client,
        ):
            await client.initialize()
            yield client


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    """A direct client over Streamable HTTP (the SDK's own: it reads each response body whole)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=None)) as http,
        streamable_http_client(url, http_client=http, max_sse_event_size=None) as streams,
        ClientSession(streams[0], streams[1]) as client,
    ):
        await client.initialize()
        yield client


async def measure(source: Path, server: list[str], tmp: Path) -> list[str]:
    """`server`: the upstream's command line, or `[url]` for one over Streamable HTTP."""
    size = source.stat().st_size
    http = server[0].startswith("http://")
    direct_session = http_session(server[0]) if http else session(server[0], server[1:], tmp / "direct.log")
    async with direct_session as client:
        t = time.perf_counter()
        direct = await call(client, "read_text_file", {"path": str(source)})
        direct_s = time.perf_counter() - t
        assert not direct.is_error
        del direct

    config = tmp / f"gw-{source.stem}.toml"
    upstream = (
        f"url = {json.dumps(server[0])}"
        if http
        else f"command = {json.dumps(server[0])}\nargs = {json.dumps(server[1:])}"
    )
    config.write_text(
        f'[gateway]\nworkspace = {json.dumps(str(tmp / "ws"))}\nplugins = ["offload"]\n\n[servers.fs]\n{upstream}\n'
    )
    async with session(sys.executable, ["-m", "gateway", "--config", str(config)], tmp / "gw.log") as client:
        pid = child_pid(os.getpid())
        fresh = status(pid, "VmRSS")
        # steady state: one result offloaded first, so the libraries an offload loads (ijson, DuckDB for
        # response_query: ~75 MB, whatever the result's size) are in the idle figure
        warm = await call(client, "fs__read_text_file", {"path": str(tmp / "data" / "warm.json")})
        assert "fileRef" in warm.content[0].text
        idle = await settled(pid)
        t = time.perf_counter()
        reply = await call(client, "fs__read_text_file", {"path": str(source)})
        gateway_s = time.perf_counter() - t
        assert "fileRef" in reply.content[0].text, reply.content[0].text[:300]
        peak = status(pid, "VmHWM")
        after = await settled(pid)  # the outline and DuckDB conversion run in the background after the call
        peak_total = status(pid, "VmHWM")
    return [
        f"{source.name} ({size / 2**20:.0f} MB)",
        "bench/file_server.py, HTTP"
        if http
        else "npm filesystem"
        if "node" in server[0] or "mcp-server" in server[0]
        else "bench/file_server.py",
        f"{direct_s:.2f} s",
        f"{gateway_s:.2f} s",
        f"{gateway_s / direct_s:.2f}x",
        f"{fresh / 2**20:.0f} / {idle / 2**20:.0f} MB",
        f"{(peak - idle) / 2**20:.0f} MB",
        f"{(peak - idle) / size:.2f}x",
        f"{(after - idle) / 2**20:+.0f} MB",
        f"{(peak_total - idle) / 2**20:.0f} MB",
    ]


def tree_rss(pid: int) -> int:
    """RSS of the gateway and its query workers (`plugins.offload.sql_worker`), now: the upstream servers
    it started are not the gateway's cost."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    total = 0
    for current in [pid, *children.get(pid, [])]:
        try:
            if current == pid or b"sql_worker" in Path(f"/proc/{current}/cmdline").read_bytes():
                total += status(current, "VmRSS")
        except OSError:
            continue
    return total


async def explore(source: Path, server: list[str], tmp: Path) -> list[str]:
    """A result's whole exploration from a fresh gateway (nothing loaded before: idle is right after
    tools/list): the offloading call, the first outline, 20 slices, the table conversion (awaited by a
    query). Peak: the gateway's own (VmHWM), and with its SQL worker processes (sampled every 20 ms)."""
    size = source.stat().st_size
    config = tmp / f"gw-explore-{source.stem}.toml"
    config.write_text(
        f'[gateway]\nworkspace = {json.dumps(str(tmp / "ws-explore"))}\nplugins = ["offload"]\n\n'
        f"[servers.fs]\ncommand = {json.dumps(server[0])}\nargs = {json.dumps(server[1:])}\n"
    )
    async with session(sys.executable, ["-m", "gateway", "--config", str(config)], tmp / "gw.log") as client:
        pid = child_pid(os.getpid())
        await client.list_tools()
        idle = await settled(pid)
        idle_tree = tree_rss(pid)
        peak_tree = idle_tree

        async def sample() -> None:
            nonlocal peak_tree
            while True:
                peak_tree = max(peak_tree, tree_rss(pid))
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            t = time.perf_counter()
            reply = await call(client, "fs__read_text_file", {"path": str(source)})
            rid = json.loads(reply.content[0].text)["fileRef"]["id"]
            outline = await call(client, "response_outline", {"path": rid})
            assert not outline.is_error, outline.content[0].text[:300]
            for i in range(20):
                piece = await call(client, "response_slice", {"path": rid, "json_path": f"items.{i * 997}"})
                assert not piece.is_error, piece.content[0].text[:300]
            counted = await call(client, "response_query", {"path": rid, "sql": "SELECT count(*) FROM items"})
            assert not counted.is_error, counted.content[0].text[:300]
            seconds = time.perf_counter() - t
            await settled(pid)
            tg.cancel_scope.cancel()
        peak = status(pid, "VmHWM")
    return [
        f"{source.name} ({size / 2**20:.0f} MB)",
        f"{idle / 2**20:.0f} MB",
        f"{(peak - idle) / 2**20:.0f} MB",
        f"{(peak - idle) / size:.2f}x",
        f"{(peak_tree - idle_tree) / 2**20:.0f} MB",
        f"{(peak_tree - idle_tree) / size:.2f}x",
        f"{seconds:.1f} s",
    ]


def export(mb: int, tmp: Path, filesystem: str) -> tuple[Path, list[str]]:
    """A JSON file of `mb` MB in tmp/data, and the server that reads it (Node cannot build a reply string
    for the largest: a raw Python server answers alike)."""
    source = tmp / "data" / f"export-{mb}mb.json"
    make_json(source, mb)
    server = [sys.executable, str(Path(__file__).with_name("file_server.py")), str(tmp / "data")]
    if source.stat().st_size <= NODE_LIMIT:
        server = [filesystem, str(tmp / "data")]
    return source, server


async def explore_main(sizes: list[int]) -> None:
    filesystem = npm_bin("mcp-server-filesystem")
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-explore-"))
    (tmp / "data").mkdir()
    rows = [
        [
            "file",
            "fresh idle",
            "gateway peak above idle",
            "x file (<= 1.5x)",
            "with SQL workers, peak above idle",
            "x file",
            "time",
        ]
    ]
    try:
        for mb in sizes:
            source, server = export(mb, tmp, filesystem)
            rows.append(await explore(source, server, tmp))
            print(table(rows), "\n", flush=True)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def jq_seconds(source: Path, program: str) -> float:
    t = time.perf_counter()
    subprocess.run(["jq", program, str(source)], check=True, capture_output=True)
    return time.perf_counter() - t


async def first(source: Path, server: list[str], tmp: Path, run: int) -> list[str]:
    """One fresh gateway: the offloading call, the first outline, the first query, a second query; jq's
    two programs over the same file right before (the same machine state)."""
    jq_sum = jq_seconds(source, "[.items[] | .id] | add")
    jq_len = jq_seconds(source, ".items | length")
    config = tmp / f"gw-first-{run}.toml"
    config.write_text(
        f'[gateway]\nworkspace = {json.dumps(str(tmp / f"ws-first-{run}"))}\nplugins = ["offload"]\n\n'
        f"[servers.fs]\ncommand = {json.dumps(server[0])}\nargs = {json.dumps(server[1:])}\n"
    )
    async with session(sys.executable, ["-m", "gateway", "--config", str(config)], tmp / "gw.log") as client:
        await client.list_tools()
        t = time.perf_counter()
        reply = await call(client, "fs__read_text_file", {"path": str(source)})
        offload_s = time.perf_counter() - t
        rid = json.loads(reply.content[0].text)["fileRef"]["id"]
        t = time.perf_counter()
        outline = await call(client, "response_outline", {"path": rid})
        outline_s = time.perf_counter() - t
        assert not outline.is_error, outline.content[0].text[:300]
        tables = outline.structured_content.get("tables")
        t = time.perf_counter()
        summed = await call(client, "response_query", {"path": rid, "sql": "SELECT sum(id) FROM items"})
        first_s = time.perf_counter() - t
        assert not summed.is_error, summed.content[0].text[:300]
        t = time.perf_counter()
        again = await call(client, "response_query", {"path": rid, "sql": "SELECT max(id) FROM items"})
        second_s = time.perf_counter() - t
        assert not again.is_error, again.content[0].text[:300]
    return [
        f"{source.stat().st_size / 2**20:.0f} MB #{run + 1}",
        f"{jq_len:.2f} s",
        f"{jq_sum:.2f} s",
        f"{offload_s:.2f} s",
        f"{outline_s:.2f} s ({outline_s / jq_len:.2f}x)",
        "listed" if isinstance(tables, list) else "being prepared",
        f"{first_s:.2f} s ({first_s / jq_sum:.2f}x)",
        f"{(outline_s + first_s) / jq_sum:.2f}x",
        f"{second_s * 1000:.0f} ms",
    ]


async def first_main(sizes: list[int], rounds: int) -> None:
    filesystem = npm_bin("mcp-server-filesystem")
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-first-"))
    (tmp / "data").mkdir()
    rows = [
        [
            "file",
            "jq length",
            "jq sum",
            "offloading call",
            "first outline (x jq length)",
            "its tables",
            "first query (x jq sum)",
            "outline + query, x jq sum",
            "second query",
        ]
    ]
    try:
        for mb in sizes:
            source, server = export(mb, tmp, filesystem)
            for run in range(rounds):
                rows.append(await first(source, server, tmp, run))
                print(table(rows), "\n", flush=True)
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


async def main(sizes: list[int], korean: int, http: bool) -> None:
    filesystem = npm_bin("mcp-server-filesystem")
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-big-"))
    data = tmp / "data"
    data.mkdir()
    # above the size parsed whole (4 MB): streamed, outlined and converted to DuckDB like the big ones
    make_json(data / "warm.json", 5)
    files = []
    for mb in sizes:
        make_json(data / f"export-{mb}mb.json", mb)
        files.append(data / f"export-{mb}mb.json")
    if korean:
        make_korean(data / f"korean-{korean}mb.txt", korean)
        files.append(data / f"korean-{korean}mb.txt")
    rows = [
        [
            "file",
            "server",
            "direct",
            "gateway",
            "ratio (<= 1.3x)",
            "idle RSS (fresh / warm)",
            "peak above idle",
            "x file (<= 1.5x)",
            "RSS after, vs idle",
            "peak incl. background",
        ]
    ]
    file_server = [sys.executable, str(Path(__file__).with_name("file_server.py")), str(data)]
    web = None
    if http:  # the same answers over Streamable HTTP: the gateway streams the body to disk as it comes
        port = free_port()
        web = subprocess.Popen([*file_server, "--http", str(port)], stdin=subprocess.DEVNULL)
        with anyio.fail_after(20):
            while True:  # until it listens
                try:
                    await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await anyio.sleep(0.1)
    try:
        for source in files:
            if web is not None:
                server = [f"http://127.0.0.1:{port}/mcp"]
            else:  # Node cannot build a reply string this long (~2x the file): a raw Python server answers alike
                server = file_server if source.stat().st_size > NODE_LIMIT else [filesystem, str(data)]
            rows.append(await measure(source, server, tmp))
            print(table(rows), "\n", flush=True)
    finally:
        if web is not None:
            web.terminate()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="*", default=[10, 68, 200])
    parser.add_argument("--korean", type=int, default=100)
    parser.add_argument("--http", action="store_true", help="the upstream over Streamable HTTP instead of stdio")
    parser.add_argument(
        "--explore", action="store_true", help="each result's whole exploration from a fresh gateway instead"
    )
    parser.add_argument("--first", action="store_true", help="the first outline and query against jq, per size")
    parser.add_argument("--rounds", type=int, default=3, help="with --first: fresh gateways per size")
    args = parser.parse_args()
    if args.first:
        anyio.run(first_main, args.sizes, args.rounds)
    elif args.explore:
        anyio.run(explore_main, args.sizes)
    else:
        anyio.run(main, args.sizes, args.korean, args.http)
