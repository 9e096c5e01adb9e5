"""gateway.services.process_tree: the host among a process's ancestors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.services.process_tree import ancestors, host_pid


def test_the_host_is_the_first_ancestor_that_is_no_wrapper() -> None:
    assert host_pid([(40, "claude"), (30, "zsh"), (1, "systemd")]) == 40
    assert host_pid([(41, "sh"), (40, "uv"), (39, "node"), (30, "bash")]) == 39  # sh -c uvx ... under node
    assert host_pid([(30, "bash"), (20, "tmux: server"), (1, "systemd")]) is None  # started from a terminal
    assert host_pid([(1, "init")]) is None and host_pid([]) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
def test_ancestors_of_a_real_child_start_with_this_process() -> None:
    code = "from gateway.services.process_tree import ancestors; print(ancestors()[0][0])"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(child.stdout) == os.getpid()
    assert ancestors()[0][0] == os.getppid()
