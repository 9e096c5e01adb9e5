"""Plugins' work started before the rest of the gateway loads.

`serve` starts the upstream processes first and then imports the SDK, the front server and the plugins
(~0.4 s). A plugin whose first request needs a process of its own that takes as long to start (offload's
SQL worker: Python and DuckDB's import) names a callable in the entry-point group
`mcp_context_gateway.early`, under the plugin's own name; it is called then, in a thread of its own, so
both start together. It must not block for long and must clean up after itself if the plugin never
starts (offload's worker ends itself when idle, and with the gateway). Only enabled plugins' callables
run, chosen as `[gateway] plugins` and `disabled_plugins` choose plugins; one that fails is logged.
Light on purpose: the standard library only.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

EARLY_GROUP = "mcp_context_gateway.early"
log = logging.getLogger("gateway.plugins")


def start(names: Sequence[str] | None, disabled: Sequence[str]) -> threading.Thread:
    """Run the enabled plugins' early callables in a background thread (returned, already started)."""
    thread = threading.Thread(target=run, args=(names, tuple(disabled)), name="plugins-early", daemon=True)
    thread.start()
    return thread


def run(names: Sequence[str] | None, disabled: Sequence[str]) -> list[str]:
    """Call each enabled plugin's early callable; the names of those that ran."""
    from importlib.metadata import entry_points

    ran = []
    for ep in entry_points(group=EARLY_GROUP):
        if ep.name in disabled or (names is not None and ep.name not in names):
            continue
        try:
            ep.load()()
        except Exception:  # the plugin's own start does what it needs, a little later
            log.exception("plugin %s: its early start failed", ep.name)
            continue
        ran.append(ep.name)
    return ran
