"""The fastmcp proxy in front of the demo upstream, for `bench/proxy_overhead.py` to compare against.

Run with a Python that has fastmcp installed (the bench makes one; fastmcp is never a dependency):

    <fastmcp python> bench/fastmcp_proxy.py <gateway python>
"""

import sys

from fastmcp.server import create_proxy

upstream = {"command": sys.argv[1], "args": ["-m", "gateway.cli.demo_upstream"]}
create_proxy({"mcpServers": {"demo": upstream}}, name="fastmcp-proxy").run(show_banner=False)
