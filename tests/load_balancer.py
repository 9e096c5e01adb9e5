"""HAProxy in front of gateway replicas: the configuration the README shows, with a run's own ports.

The README's ```haproxy block is the one source: `config` takes it, binds the front to the given port
and names one `server` line per replica, so what the tests and the bench run is what users read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_config() -> str:
    found = re.search(r"^```haproxy\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert found, "README.md has no ```haproxy block"
    return found.group(1)


def config(front_port: int, replica_ports: list[int]) -> str:
    """The README's configuration: the front on 127.0.0.1:`front_port`, a server per replica port."""
    text = re.sub(r"(?m)^(\s*bind 127\.0\.0\.1:)\d+", rf"\g<1>{front_port}", readme_config())
    indent = re.search(r"(?m)^(\s*)server ", text)
    assert indent, "the README's configuration names no server"
    text = re.sub(r"(?m)^\s*server .*\n", "", text)
    servers = "".join(f"{indent.group(1)}server r{i} 127.0.0.1:{port}\n" for i, port in enumerate(replica_ports))
    return text + servers


def missing() -> str:
    """Why HAProxy cannot run here ("" when it can)."""
    if shutil.which("haproxy") is None:
        return "HAProxy is not installed (apt-get install haproxy; .ci/run installs it when it runs as root)"
    return ""


@contextmanager
def haproxy(folder: Path, front_port: int, replica_ports: list[int]) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy in the foreground (`-db`) until the block ends; its warnings and alerts in folder/haproxy.log."""
    from conftest import wait_listening

    cfg = folder / "haproxy.cfg"
    cfg.write_text(config(front_port, replica_ports))
    checked = subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    with open(folder / "haproxy.log", "ab") as log:
        proc = subprocess.Popen(["haproxy", "-f", str(cfg), "-db"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        wait_listening(f"http://127.0.0.1:{front_port}/metrics", proc)
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)
