"""The progress reporter a call carries from the host to whoever runs it (a leaf: imports nothing of ours)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

ProgressReporter = Callable[[float, float | None, str | None], Awaitable[None]]


async def no_progress(progress: float, total: float | None = None, message: str | None = None) -> None:
    """The reporter of a call whose host asked for no progress."""
    return None
