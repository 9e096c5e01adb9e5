"""gateway.proxy.upstream: the calls in flight on one upstream, whose they are, and their landing."""

from __future__ import annotations

from pathlib import Path

from gateway.proxy.upstream import Upstream, _InFlight
from gateway.settings import ServerConfig


def _flight(namespace: str, host: object = None) -> _InFlight:
    return _InFlight(host, None, object(), 30.0, namespace=namespace)  # type: ignore[arg-type]


def test_a_landing_takes_that_call_only_and_its_namespace_is_counted_until_its_last_call(tmp_path: Path) -> None:
    up = Upstream("p", ServerConfig(command="true"), tmp_path)
    host = object()
    same = [_flight("alice", host), _flight("alice", host)]  # alike field by field: two calls all the same
    bobs = _flight("bob", object())
    for flight in [*same, bobs]:
        up._took_off(flight)
    up._landed(same[1])
    up._landed(same[1])  # a second landing of one call counts once
    assert [f for f, *_ in up.hosts_in_flight()] == [host, bobs.host_session]
    assert up.namespaces_in_flight() == {"alice", "bob"}
    assert up._asker() == (None, up._asker()[1]) and "2 different hosts" in up._asker()[1]
    up._landed(bobs)
    assert up._asker() == (same[0], "")  # the latest call in flight of the one host left
    up._landed(same[0])
    assert not up._namespaces and not up.hosts_in_flight()
    assert up.namespaces_in_flight() == {"alice", "bob"}  # landed within the grace: still theirs

