"""The command's entry point. A host may send SIGHUP (a reload) the moment it has started the gateway,
before the command line's modules are even imported; that must not end the process. So the signal is
held first, with the standard library only, and the command line then runs (`gateway.cli.main` lets
go of it again for every command but `serve`)."""

from __future__ import annotations


def main() -> int:
    from gateway.proxy.sighup import hold

    hold()
    from gateway.cli import main as run

    return run()
