"""`clean`: empty the response workspace (every namespace's) and what interrupted huge replies left."""

from __future__ import annotations

from gateway.services.responses import ResponseStore
from gateway.services.spill import Spiller
from gateway.settings import Settings


def cmd_clean(settings: Settings) -> int:
    folders = [settings.gateway.responses_dir]
    named = settings.gateway.workspace / "ns"
    if named.is_dir():
        folders += sorted(p / "responses" for p in named.iterdir() if (p / "responses").is_dir())
    for folder in folders:
        count = ResponseStore(folder).clear()
        print(f"removed {count} files from {folder}")
    spill = Spiller(settings.gateway.workspace / "spill")
    if spill.folder.is_dir():  # what a gateway killed while a huge reply arrived left behind
        print(f"removed {spill.remove_stale()} files from {spill.folder}")
    return 0
