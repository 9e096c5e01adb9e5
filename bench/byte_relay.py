"""The floor of any stdio proxy: bytes copied both ways between the host and an upstream, nothing
parsed. `bench/proxy_overhead.py` runs it to show what the extra process hop alone costs.

    python bench/byte_relay.py [COMMAND ARGS...]      (default: the demo upstream)
"""

import asyncio
import os
import sys


async def copy(reader: asyncio.StreamReader, write) -> None:
    while chunk := await reader.read(1 << 16):
        write(chunk)


async def main() -> None:
    argv = sys.argv[1:] or [sys.executable, "-m", "gateway.cli.demo_upstream"]
    child = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    loop = asyncio.get_running_loop()
    host_in = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(host_in), sys.stdin)
    assert child.stdin is not None and child.stdout is not None

    def to_host(chunk: bytes) -> None:
        os.write(1, chunk)  # small replies: one write each

    await asyncio.gather(copy(host_in, child.stdin.write), copy(child.stdout, to_host))


asyncio.run(main())
