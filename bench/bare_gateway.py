"""The gateway with its own per-call extras cut out, for measuring what they cost (never a way to run it):
no plugin sees a result (no offload, no monitor), no call enters the usage figures, and the HTTP front
skips the SDK's checks of a POST (Host, Origin, Accept, Content-Type). What is left is the call's own
way: the envelope read, routing, the exchange, the upstream leg, the result read and written.
`bench/concurrency.py --bare` runs it beside the gateway.

    python bench/bare_gateway.py --config FILE --transport http --port PORT   (the gateway's own arguments)
"""

from __future__ import annotations

from typing import Any

from gateway.launch import main
from gateway.proxy import lean_http, server
from gateway.services import spill

finish, finish_now = server.Gateway._finish, server.Gateway._finish_now


def _no_plugins_now(self: server.Gateway, call: Any, result: Any) -> Any:
    return finish_now(self, call, result) if spill.pending() else result  # texts on disk still come back


async def _no_plugins(self: server.Gateway, call: Any, result: Any, partial: Any = None, start: int = 0) -> Any:
    return await finish(self, call, result, partial, start) if spill.pending() else result


async def _accepted(self: lean_http.LeanHttpFront, request: Any) -> bool:
    return True


server.Gateway._finish_now = _no_plugins_now  # type: ignore[method-assign]
server.Gateway._finish = _no_plugins  # type: ignore[method-assign]
server.Gateway._record_call = lambda self, call, result, reply: None  # type: ignore[method-assign]
lean_http.LeanHttpFront._acceptable = _accepted  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(main())
