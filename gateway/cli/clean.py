"""`clean`: empty the response workspace."""

from __future__ import annotations

from gateway.services.responses import ResponseStore
from gateway.settings import Settings


def cmd_clean(settings: Settings) -> int:
    folder = settings.gateway.responses_dir
    count = ResponseStore(folder).clear()
    print(f"removed {count} files from {folder}")
    return 0
