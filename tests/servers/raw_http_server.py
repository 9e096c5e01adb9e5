"""A hand-written Streamable HTTP MCP server (no SDK) of the 2025 era, deaf to cancels:

    python raw_http_server.py PORT

Each POST is answered with one JSON body; `notifications/cancelled` is accepted (202) and ignored, so
a slow call's reply still comes after its caller gave up, as some servers do.
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [
    {"name": "echo", "description": "Echo the text.", "inputSchema": {"type": "object"}},
    {"name": "late_big", "description": "A big reply, late.", "inputSchema": {"type": "object"}},
]


def answer(msg: dict) -> dict | None:
    method, msg_id = msg.get("method"), msg.get("id")
    if msg_id is None:
        return None
    params = msg.get("params") or {}
    if method == "initialize":
        result = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw-http", "version": "0.0.1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "ping":
        result = {}
    elif method == "tools/call" and params.get("name") == "late_big":
        args = params.get("arguments") or {}
        if args.get("marker"):  # tests wait for this instead of sleeping
            open(args["marker"], "w").close()
        time.sleep(float(args.get("delay", 1)))
        result = {"content": [{"type": "text", "text": "L" * int(args.get("size", 6_000_000))}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": str((params.get("arguments") or {}).get("text", ""))}]}
    else:
        return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": str(method)}}
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        out = answer(msg)
        if out is None:
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        if msg.get("method") == "initialize":
            self.send_header("mcp-session-id", "raw-session")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # no server-to-client stream
        self.send_response(405)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
