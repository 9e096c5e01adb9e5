"""The fastmcp proxy in front of an upstream, for `bench/proxy_overhead.py` to compare against.

Run with a Python that has fastmcp installed (the bench makes one; fastmcp is never a dependency):

    <fastmcp python> bench/fastmcp_proxy.py COMMAND [ARGS...]     (e.g. <gateway python> -m gateway.cli.demo_upstream)
"""

import sys

from fastmcp.server import create_proxy

upstream = {"command": sys.argv[1], "args": sys.argv[2:]}
create_proxy({"mcpServers": {"demo": upstream}}, name="fastmcp-proxy").run(show_banner=False)
