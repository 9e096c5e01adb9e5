"""The floor of any stdio proxy: bytes copied both ways between the host and the demo upstream, nothing
parsed. `bench/proxy_overhead.py` runs it to show what the extra process hop alone costs.

    python bench/byte_relay.py
"""

import asyncio
import os
import sys


async def copy(reader: asyncio.StreamReader, write) -> None:
    while chunk := await reader.read(1 << 16):
        write(chunk)


async def main() -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli.demo_upstream", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    loop = asyncio.get_running_loop()
    host_in = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(host_in), sys.stdin)
    assert child.stdin is not None and child.stdout is not None

    def to_host(chunk: bytes) -> None:
        os.write(1, chunk)  # small replies: one write each

    await asyncio.gather(copy(host_in, child.stdin.write), copy(child.stdout, to_host))


asyncio.run(main())
