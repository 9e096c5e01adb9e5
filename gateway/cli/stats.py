"""`stats`: what passed through the gateway and what it kept out of the window (from `stats.db`)."""

from __future__ import annotations

import json
import sqlite3
import sys
import time

from gateway.cli.table import table
from gateway.services.stats import PERIODS, summary
from gateway.services.storage import Storage
from gateway.services.text import human_size
from gateway.services.tokens import describe_tokenizer
from gateway.settings import Settings


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def tokenizer_note(settings: Settings) -> str:
    """Which tokenizer the figures are counted for, and how to change it."""
    name = settings.gateway.tokenizer
    if name == "auto":
        return f"for {describe_tokenizer(name)}: set [gateway] tokenizer to count for your host's"
    return f"for {describe_tokenizer(name)} ([gateway] tokenizer)"


def cmd_stats(settings: Settings, period: str, as_json: bool) -> int:
    path = settings.gateway.workspace / "stats.db"
    storage = Storage(settings.storage)
    try:
        figures = summary(path, period, storage=storage)
    except sqlite3.Error as exc:
        print(
            f"mcp-context-gateway: {path} cannot be read ({exc}): remove it (the gateway starts a new one)",
            file=sys.stderr,
        )
        return 2
    except RuntimeError as exc:  # the PostgreSQL backend cannot be reached
        print(f"mcp-context-gateway: {exc}", file=sys.stderr)
        return 2
    where = storage.describe() if storage.shared else str(path)
    if as_json:
        figures["tokenizer"] = settings.gateway.tokenizer  # what the token figures are counted for
        print(json.dumps(figures, indent=2, ensure_ascii=False))
        return 0
    totals = [["period", "calls", "errors", "tokens returned", "tokens kept out"]]
    for name in PERIODS:
        t = figures["totals"][name]
        label = "all" if name == "all" else f"last {name}"
        totals.append([label, _n(t["calls"]), _n(t["errors"]), _n(t["tokens_returned"]), _n(t["tokens_saved"])])
    print(f"usage figures in {where}")
    print(table(totals, right={1, 2, 3, 4}))
    replicas = figures["replicas"]
    if len(replicas) > 1:  # several gateway processes wrote here (replicas, or gateways on one workspace)
        out = [["replica", "calls", "errors", "tokens returned", "tokens kept out", "last call"]]
        for r in replicas:
            last = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_call"])) if r["last_call"] else "-"
            name = r["replica"] or "(before replicas were named)"
            out.append([name, _n(r["calls"]), _n(r["errors"]), _n(r["tokens_returned"]), _n(r["tokens_saved"]), last])
        print(f"\n{'all time' if period == 'all' else 'last ' + period}, by replica (the gateway process that served):")
        print(table(out, right={1, 2, 3, 4}))
    rows = figures["rows"]
    if not rows:
        print(f"\nno calls recorded ({'all time' if period == 'all' else 'in the last ' + period})")
        return 0
    out = [["server", "tool", "via", "calls", "errors", "result", "returned", "kept out", "by", "p50 ms", "max ms"]]
    for r in rows:
        listing = r["tool"] == "tools/list"
        out.append(
            [
                r["server"],
                r["tool"],
                r["via"],
                _n(r["calls"]),
                _n(r["errors"]),
                "-" if listing or not r["result_bytes"] else human_size(r["result_bytes"]),
                _n(r["tokens_returned"]),
                _n(r["tokens_saved"]),
                ", ".join(sorted(r["saved_by"])) or "-",
                "-" if r["p50_ms"] is None else f"{r['p50_ms']:.1f}",
                "-" if r["max_ms"] is None else f"{r['max_ms']:.1f}",
            ]
        )
    print(f"\n{'all time' if period == 'all' else 'last ' + period}, by server and tool:")
    print(table(out, right={3, 4, 5, 6, 7, 9, 10}))
    print(
        f"\ntokens are the gateway's counts (real tokenizers, the built-in estimate until they load), "
        f"{tokenizer_note(settings)}, of what it returned and what it kept "
        "out (offload: a result's cost minus its fileRef's; catalog: the definitions behind the catalog minus its "
        "meta-tools', per tools/list); it sees only what passes through it, not the host's context"
    )
    return 0
