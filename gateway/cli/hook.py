"""`mcp-context-gateway hook`: a PostToolUse (Claude Code) / AfterTool (Gemini CLI) hook.

Those hosts know the real context usage; a statusline command (`hook --statusline`) writes it to
a bridge file `{tmp}/claude-ctx-{session_id}.json` with the command's ancestors (so that only the
gateways the same host started take the figure), and the tool hook turns it into an advisory
note when a level applies. Any problem ends quietly with exit status 0: a hook must never break
the host.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway.services.context_levels import Debounce, bridge_path, level_for, note_text, read_bridge, safe_session_id
from gateway.services.files import atomic_write
from gateway.services.process_tree import ancestors

STDIN_GUARD_SECONDS = 10.0


def _read_stdin(timeout: float = STDIN_GUARD_SECONDS) -> str | None:
    box: list[str] = []

    def read() -> None:
        with contextlib.suppress(Exception):
            box.append(sys.stdin.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout)
    return box[0] if box else None


def tool_hook(payload: dict[str, Any], folder: Path | None = None) -> str | None:
    """The hook's stdout for one tool use, or None for silence."""
    sid = safe_session_id(payload.get("session_id"))
    if sid is None:
        return None
    path = bridge_path(sid, folder)
    remaining = read_bridge(path)
    if remaining is None:
        return None
    state_path = path.with_name(f"claude-ctx-{sid}.state.json")
    try:
        state = Debounce.from_json(json.loads(state_path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        state = Debounce()
    level = level_for(remaining)
    warn = state.should_warn(level)
    atomic_write(state_path, json.dumps(state.to_json()), sync=False)
    if not warn or level is None:
        return None
    event = (
        payload.get("hook_event_name")
        if payload.get("hook_event_name") in ("PostToolUse", "AfterTool")
        else ("PostToolUse")
    )
    text = note_text(level, remaining, None, "reported by the host")
    return json.dumps({"hookSpecificOutput": {"hookEventName": event, "additionalContext": text}})


def statusline(payload: dict[str, Any], folder: Path | None = None) -> str:
    """Write the bridge file from Claude Code's statusline JSON; return the status line text."""
    sid = safe_session_id(payload.get("session_id"))
    window = payload.get("context_window") if isinstance(payload.get("context_window"), dict) else {}
    remaining = window.get("remaining_percentage")
    if remaining is None and window.get("used_percentage") is not None:
        remaining = 100 - float(window["used_percentage"])
    if remaining is None and window.get("context_window_size"):
        used = float(window.get("total_input_tokens") or 0) + float(window.get("total_output_tokens") or 0)
        remaining = 100 * (1 - used / float(window["context_window_size"]))
    if sid is None or remaining is None:
        return "ctx ?"
    remaining = max(0.0, min(100.0, float(remaining)))
    bridge = {
        "session_id": sid,
        "remaining_percentage": remaining,
        "used_pct": 100 - remaining,
        "timestamp": time.time(),
    }
    # the processes above this command, the host among them: only gateways that host started take the figure
    bridge["ancestors"] = [pid for pid, _ in ancestors()]
    size = window.get("context_window_size")
    if isinstance(size, int) and size > 0:
        bridge["context_window_size"] = size  # the gateway takes the host's own window from here
    atomic_write(bridge_path(sid, folder), json.dumps(bridge), sync=False)
    return f"ctx {remaining:.0f}% left"


def run_hook(statusline_mode: bool = False, folder: Path | None = None) -> int:
    try:
        raw = _read_stdin()
        if not raw:
            return 0
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            return 0
        out = statusline(payload, folder) if statusline_mode else tool_hook(payload, folder)
        if out:
            print(out)
    except Exception:
        pass  # a hook must never break the host
    return 0
