"""A raw JSON-RPC server with one tool, `read_text_file`, answering as the npm filesystem server does
(the text plus a `structuredContent` copy): over stdio for files too large for Node's strings
(> ~250 MB), or over Streamable HTTP (one JSON response per request, no session) for the HTTP runs
of `bench/big_results.py`.

    python bench/file_server.py <allowed folder> [--http PORT]
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()
TOOL = {
    "name": "read_text_file",
    "description": "Read a text file.",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def answer(msg: dict) -> dict | None:
    """The reply to one message (None for a notification)."""
    method, msg_id = msg.get("method"), msg.get("id")
    if msg_id is None:
        return None
    if method == "initialize":
        result = {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bench-files", "version": "0.0.1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call":
        path = Path(msg["params"]["arguments"]["path"]).resolve()
        if ROOT not in path.parents:
            result = {"content": [{"type": "text", "text": "outside the allowed folder"}], "isError": True}
        else:
            text = path.read_text(encoding="utf-8")
            result = {"content": [{"type": "text", "text": text}], "structuredContent": {"content": text}}
            del text
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": method}}
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        reply = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        if reply is None:
            self.send_response(202)
            self.end_headers()
            return
        body = json.dumps(reply, ensure_ascii=False).encode()
        del reply
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # no server-initiated stream
        self.send_response(405)
        self.end_headers()

    do_DELETE = do_GET

    def log_message(self, *args: object) -> None:
        pass


if "--http" in sys.argv:
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--http") + 1])), Handler).serve_forever()
else:
    for line in sys.stdin:
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        del reply
