"""`clean`: empty the response workspace (every namespace's)."""

from __future__ import annotations

from gateway.services.responses import ResponseStore
from gateway.settings import Settings


def cmd_clean(settings: Settings) -> int:
    folders = [settings.gateway.responses_dir]
    named = settings.gateway.workspace / "ns"
    if named.is_dir():
        folders += sorted(p / "responses" for p in named.iterdir() if (p / "responses").is_dir())
    for folder in folders:
        count = ResponseStore(folder).clear()
        print(f"removed {count} files from {folder}")
    return 0
