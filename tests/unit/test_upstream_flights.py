"""gateway.proxy.upstream: the calls in flight on one upstream, whose they are, and their landing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from gateway.proxy import upstream as upstream_module
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
    assert not up._places.held and not up.hosts_in_flight()
    assert up.namespaces_in_flight() == {"alice", "bob"}  # landed within the grace: still theirs


def _http(tmp_path: Path) -> Upstream:
    return Upstream("web", ServerConfig(url="http://127.0.0.1:9/mcp"), tmp_path)


def _alice_at_her_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Upstream, _InFlight]:
    """An HTTP upstream where alice's share is one call, and that call in flight."""
    monkeypatch.setattr(upstream_module, "CALLER_SHARE", 1)
    up = _http(tmp_path)
    flight = _flight("alice")
    up._took_off(flight)
    return up, flight


@pytest.mark.anyio
async def test_a_caller_over_its_share_of_an_http_upstream_waits_in_turn_and_others_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice holds her share of calls in flight: her next ones wait, in arrival order, each for a place
    one of hers hands over; bob's start at once; a stdio upstream has no connections to share."""
    monkeypatch.setattr(upstream_module, "CALLER_SHARE", 2)
    up = _http(tmp_path)
    held = [_flight("alice"), _flight("alice")]
    for flight in held:
        up._took_off(flight)
    assert not up.has_room("alice") and up.has_room("bob")
    assert Upstream("cli", ServerConfig(command="true"), tmp_path).has_room("alice")
    got: list[str] = []

    async def wait(name: str) -> None:
        if await up._wait_for_room("alice", 30):
            got.append(name)
            up._took_off(_flight("alice"), counted=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait, "first")
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait, "second")
        await anyio.wait_all_tasks_blocked()
        assert not up.has_room("alice")  # behind her own calls waiting, even below the share
        up._landed(held[0])
        await anyio.wait_all_tasks_blocked()
        assert got == ["first"] and up._places.held["alice"] == 2
        up._landed(held[1])
    assert got == ["first", "second"] and up._places.held["alice"] == 2 and not up._places.waiting


@pytest.mark.anyio
async def test_a_wait_that_times_out_or_is_given_up_keeps_no_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up, flight = _alice_at_her_share(tmp_path, monkeypatch)
    assert not await up._wait_for_room("alice", 0.01)
    with anyio.move_on_after(0.01):
        await up._wait_for_room("alice", 30)
    up._landed(flight)  # the waits given up are skipped: the place is given back
    assert not up._places.held and not up._places.waiting and up.has_room("alice")


@pytest.mark.anyio
async def test_a_place_handed_to_a_caller_that_just_left_goes_on_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's task cancelled (its host left) in the turn its place was handed over: the place goes on."""
    up, flight = _alice_at_her_share(tmp_path, monkeypatch)
    leaving = asyncio.ensure_future(up._wait_for_room("alice", 30))
    staying = asyncio.ensure_future(up._wait_for_room("alice", 30))
    await anyio.wait_all_tasks_blocked()
    up._landed(flight)  # the place goes to the first waiter ...
    leaving.cancel()  # ... whose host leaves before it runs: the second one gets it
    assert await staying is True
    assert leaving.cancelled() and up._places.held["alice"] == 1 and not up._places.waiting


def test_a_question_while_another_callers_request_is_in_flight_is_declined(tmp_path: Path) -> None:
    """bob's call is the only call in flight, alice's prompts/get (a forwarded request) too: an upstream's
    question then may be hers, and goes to nobody."""
    up = Upstream("p", ServerConfig(command="true"), tmp_path)
    bobs = _flight("bob", object())
    up._took_off(bobs)
    assert up._asker() == (bobs, "")
    up._places.take("alice")  # as `request(..., namespace="alice")` counts it
    flight, why = up._asker()
    assert flight is None and "requests of 2 different callers" in why


@pytest.mark.anyio
async def test_two_callers_at_their_shares_leave_places_for_a_third(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of the upstream's places the last ones go only to callers with nothing in flight there: alice and
    bob at their shares, carol still starts one call, not a second; a place that comes free goes to the
    caller waiting, whoever's call ended."""
    for name, value in (("CALLER_SHARE", 2), ("CONNECTIONS", 6), ("RESERVED", 1)):
        monkeypatch.setattr(upstream_module, name, value)
    up = _http(tmp_path)
    flights = {who: [_flight(who), _flight(who)] for who in ("alice", "bob")}
    for flight in flights["alice"] + flights["bob"]:
        up._took_off(flight)
    assert up.has_room("carol")
    carols = _flight("carol")
    up._took_off(carols)
    assert not up.has_room("carol") and up.has_room("dave")  # dave has nothing in flight there
    second = asyncio.ensure_future(up._wait_for_room("carol", 30))
    await anyio.wait_all_tasks_blocked()
    up._landed(flights["alice"][0])  # alice's call ends: the place goes to carol, waiting
    assert await second is True and up._places.held["carol"] == 2 and up._places.total == 5
