"""The official MCP conformance suite (server mode), run against server-everything directly and through
the gateway: the gateway passes every check the direct run passes."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import http_gateway
from npm_servers import conformance_cli, everything_over_http, node22

pytestmark = pytest.mark.npm


def passed_checks(node: str, cli: str, url: str, out: Path) -> set[tuple[str, str]]:
    """(scenario, check) pairs the suite passed against `url` (it exits non-zero when any fails)."""
    run = subprocess.run(
        [node, cli, "server", "--url", url, "-o", str(out)], capture_output=True, text=True, timeout=600
    )
    assert "=== SUMMARY ===" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    passed = set()
    for checks in out.glob("*/checks.json"):
        scenario = re.sub(r"-\d{4}-\d\d-\d\dT.*$", "", checks.parent.name)  # the folder ends with a timestamp
        for check in json.loads(checks.read_text()):
            if check["status"] == "SUCCESS":
                passed.add((scenario, check["id"]))
    return passed


def test_the_gateway_passes_every_check_the_server_passes(tmp_path: Path) -> None:
    node, cli = node22(), conformance_cli()
    with everything_over_http() as url:
        direct = passed_checks(node, cli, url, tmp_path / "direct")
        with http_gateway(tmp_path, servers={"ev": {"url": url, "prefix": False}}) as front:
            through = passed_checks(node, cli, front, tmp_path / "gateway")
    assert len(direct) >= 10  # the suite really ran (server-everything passes 13 of its checks)
    assert direct - through == set(), f"lost through the gateway: {sorted(direct - through)}"
