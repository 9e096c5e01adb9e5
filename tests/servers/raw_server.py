"""A hand-written MCP server (no SDK) that speaks JSON-RPC over stdio the way some older servers do:
its tool definitions omit `inputSchema.type`, which the SDK's strict result schema rejects."""

import json
import sys

TOOLS = [
    {
        "name": "legacy_echo",
        "description": "Echo, with an old-style schema.",
        "inputSchema": {"properties": {"text": {"type": "string"}}},
    },
    {"name": "no_schema", "description": "A tool with an empty schema.", "inputSchema": {}},
]
if "--bad-schemas" in sys.argv:  # definitions the strict schema rejects outright: one must not hide the rest
    TOOLS += [
        {"name": "props_list", "inputSchema": {"type": "object", "properties": [1, 2]}},
        {"name": "required_str", "inputSchema": {"type": "object", "required": "x"}},
        {"name": "prop_number", "inputSchema": {"type": "object", "properties": {"a": 5, "b": {"type": "string"}}}},
    ]


if "--surrogate" in sys.argv:  # a reply holding a lone surrogate (a JSON escape no UTF-8 can carry)
    TOOLS.append(
        {"name": "lone_surrogate", "description": "Answer a lone surrogate.", "inputSchema": {"type": "object"}}
    )


if "--deep" in sys.argv:  # a reply nested 1,500 levels deep (deeper than Python's parser goes)
    TOOLS.append({"name": "deep", "description": "Answer deeply nested.", "inputSchema": {"type": "object"}})


if "--deep" in sys.argv:  # (also) a tool that writes hostile lines before its real reply
    TOOLS.append({"name": "junk", "description": "Hostile lines, then the reply.", "inputSchema": {"type": "object"}})
    TOOLS.append({"name": "late_big", "description": "A big reply, late.", "inputSchema": {"type": "object"}})
JUNK = [
    b"",
    b"   ",
    b"not json",
    b"{",
    b'{"jsonrpc": "2.0", "method": "notifications/message", "params": ' + b"[" * 1500 + b"]" * 1500 + b"}",
    b'{"jsonrpc": "2.0", "id": [1, 2], "result": {}}',
    b'{"jsonrpc": "2.0", "id": {"a": 1}, "result": {}}',
    b'{"jsonrpc": "2.0", "id": 987654, "result": {"content": []}}',
    b'{"jsonrpc": "2.0", "id": "gw-999999", "result": {"content": []}}',
    b'{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": [1], "progress": NaN}}',
    b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "\xff\xed\xa0\x80"}}',
    b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "'
    + b"h" * 5_000_000
    + b'"}}',
]


if "--cut" in sys.argv:  # a tool whose reply stops half way: the process dies mid-line
    TOOLS.append({"name": "cut", "description": "Die while answering.", "inputSchema": {"type": "object"}})


if "--slow-big" in sys.argv:  # a large reply written slowly, a piece at a time (a busy, living server)
    TOOLS.append({"name": "slow_big", "description": "A large reply, slowly.", "inputSchema": {"type": "object"}})


if "--ask-deep" in sys.argv:  # asks the user a question whose schema is nested `depth` levels deep
    TOOLS.append({"name": "ask_deep", "description": "Ask, deeply nested.", "inputSchema": {"type": "object"}})
ASKING: dict[str, object] = {}  # our question's id -> the call it belongs to

RESOURCES = "--resources" in sys.argv  # declares resources but has no resources/templates/list (-32601)


def reply(msg_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    if not line.strip():
        continue
    msg = json.loads(line)
    method, msg_id = msg.get("method"), msg.get("id")
    if msg_id is None:
        if method == "notifications/cancelled":  # in its log (the gateway keeps a server's stderr)
            print(f"cancelled {msg['params'].get('requestId')}", file=sys.stderr, flush=True)
        continue  # notifications
    if method is None and msg_id in ASKING:  # the answer to our question: the call it belongs to ends
        answer = json.dumps(msg.get("result", msg.get("error")))
        reply(ASKING.pop(msg_id), {"content": [{"type": "text", "text": f"answered:{answer[:200]}"}]})
        continue
    if method == "initialize":
        reply(
            msg_id,
            {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}, **({"resources": {}} if RESOURCES else {})},
                "serverInfo": {"name": "raw", "version": "0.0.1"},
            },
        )
    elif method == "tools/list":
        reply(msg_id, {"tools": TOOLS})
    elif method == "resources/list" and RESOURCES:
        reply(msg_id, {"resources": [{"uri": "mem://one", "name": "one"}]})
    elif method == "tools/call" and msg["params"]["name"] == "cut":
        head = json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": {"content": [{"type": "text", "text": "x"}]}})
        sys.stdout.write(head[: head.index('"x"') + 1] + "partial " * 1_000_000)
        sys.stdout.flush()
        sys.exit(1)
    elif method == "tools/call" and msg["params"]["name"] == "junk":
        n = int((msg["params"].get("arguments") or {}).get("n", 0))
        for junk in JUNK[n % len(JUNK) :] + JUNK[: n % len(JUNK)]:
            sys.stdout.buffer.write(junk + b"\n")
        sys.stdout.buffer.flush()
        reply(msg_id, {"content": [{"type": "text", "text": f"after junk {n}"}], "structuredContent": {"n": n}})
    elif method == "tools/call" and msg["params"]["name"] == "late_big":  # slow, big, deaf to cancels
        args = msg["params"].get("arguments") or {}
        import time

        time.sleep(float(args.get("delay", 1)))
        reply(msg_id, {"content": [{"type": "text", "text": "L" * int(args.get("size", 6_000_000))}]})
    elif method == "tools/call" and msg["params"]["name"] == "slow_big":
        import time

        args = msg["params"].get("arguments") or {}
        size, pieces = int(args.get("size", 1_000_000)), int(args.get("pieces", 20))
        line = json.dumps(
            {"jsonrpc": "2.0", "id": msg_id, "result": {"content": [{"type": "text", "text": "B" * size}]}}
        )
        step = len(line) // pieces + 1
        for begin in range(0, len(line), step):
            sys.stdout.write(line[begin : begin + step])
            sys.stdout.flush()
            time.sleep(float(args.get("pause", 0.02)))
        sys.stdout.write("\n")
        sys.stdout.flush()
    elif method == "tools/call" and msg["params"]["name"] == "ask_deep":
        depth = int((msg["params"].get("arguments") or {}).get("depth", 950))
        ASKING[f"q{msg_id}"] = msg_id
        nested = "[" * depth + "]" * depth
        schema = '{"type": "object", "properties": {"x": {"type": "array", "default": ' + nested + "}}}"
        head = {"jsonrpc": "2.0", "id": f"q{msg_id}", "method": "elicitation/create"}
        sys.stdout.write(
            json.dumps(head)[:-1] + ', "params": {"message": "deep", "requestedSchema": ' + schema + "}}\n"
        )
        sys.stdout.flush()
    elif method == "tools/call" and msg["params"]["name"] == "deep":
        nested = "[" * 1500 + "]" * 1500
        sys.stdout.write(
            '{"jsonrpc": "2.0", "id": ' + json.dumps(msg_id) + ', "result": {"content": ' + nested + "}}\n"
        )
        sys.stdout.flush()
    elif method == "tools/call" and msg["params"]["name"] == "lone_surrogate":
        rows = int((msg["params"].get("arguments") or {}).get("rows", 0))
        reply(msg_id, {"content": [{"type": "text", "text": "a" + "row " * rows + "\ud800b"}]})
    elif method == "tools/call":
        args = msg["params"].get("arguments") or {}
        reply(msg_id, {"content": [{"type": "text", "text": f"{msg['params']['name']}:{args.get('text', '')}"}]})
    elif method == "ping":
        reply(msg_id, {})
    else:
        sys.stdout.write(
            json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": method}}) + "\n"
        )
        sys.stdout.flush()
