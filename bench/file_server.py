"""A raw JSON-RPC stdio server with one tool, `read_text_file`, answering as the npm filesystem server
does (the text plus a `structuredContent` copy) for files too large for Node's strings (> ~250 MB).

    python bench/file_server.py <allowed folder>
"""

import json
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()
TOOL = {
    "name": "read_text_file",
    "description": "Read a text file.",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    msg = json.loads(line)
    method, msg_id = msg.get("method"), msg.get("id")
    if msg_id is None:
        continue
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
        send({"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": method}})
        continue
    send({"jsonrpc": "2.0", "id": msg_id, "result": result})
    del result
