"""gateway.proxy.exchanges: questions out as input_required, answers back, tokens per namespace."""

import anyio
import mcp_types as types
import pytest

from gateway.proxy import exchanges
from gateway.proxy.exchanges import Exchanges

pytestmark = pytest.mark.anyio
DONE = types.CallToolResult(content=[types.TextContent(text="done")])


async def test_question_answer_and_result() -> None:
    registry = Exchanges()
    ex = registry.new("alice")
    assert registry.find(ex.token, "alice") is ex and registry.find(ex.token, "bob") is None
    got: list[object] = []

    async def upstream() -> None:
        got.append(
            await ex.ask(
                types.ElicitRequest(
                    params=types.ElicitRequestFormParams(
                        message="name?", requested_schema={"type": "object", "properties": {}}
                    )
                )
            )
        )
        await ex.finish(types.CallToolResult(content=[types.TextContent(text="done")]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(upstream)
        question = await ex.next_outcome()
        assert isinstance(question, types.InputRequiredResult) and question.request_state == ex.token
        assert list(question.input_requests) == ["q1"] and ex.waiting
        assert ex.answer({"nope": {}}) == "no question 'nope' is open"
        assert "is not a elicitation/create result" in (ex.answer({"q1": {"action": "maybe"}}) or "")
        assert ex.answer({"q1": {"action": "accept", "content": {"name": "Mina"}}}) is None
        final = await ex.next_outcome()
    assert isinstance(final, types.CallToolResult)
    assert got == [types.ElicitResult(action="accept", content={"name": "Mina"})]


async def test_an_unanswered_question_is_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchanges, "ANSWER_WAIT", 0.05)
    ex = Exchanges().new("")
    assert await ex.ask(types.ListRootsRequest()) is None and not ex.waiting


async def test_results_nobody_came_back_for_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Exchanges()
    old, running = registry.new(""), registry.new("")
    old.finish_now(DONE)
    monkeypatch.setattr(exchanges, "KEEP_FINISHED", -1.0)  # every finished one is old now
    registry.new("")
    assert old.token not in registry.open and running.token in registry.open and len(registry.open) == 2


async def test_a_namespace_keeps_its_newest_results_only_and_never_anothers() -> None:
    """alice's results waiting for retries beyond her share go, oldest first (a retry of one is told it
    expired); bob's waiting result and everyone's calls still running stay; a result taken leaves nothing."""
    registry = Exchanges()
    bobs, running = registry.new("bob"), registry.new("alice")
    bobs.finish_now(DONE)
    alices = [registry.new("alice") for _ in range(exchanges.MAX_KEPT_PER_NAMESPACE + 5)]
    for ex in alices:
        ex.finish_now(DONE)
    assert all(registry.find(ex.token, "alice") is None for ex in alices[:5])
    assert all(registry.find(ex.token, "alice") is ex for ex in alices[5:])
    assert registry.find(bobs.token, "bob") is bobs and registry.find(running.token, "alice") is running
    for ex in [bobs, *alices]:
        registry.close(ex)
    assert list(registry.open) == [running.token] and not registry._kept


async def test_one_namespace_cannot_evict_another_and_an_evicted_round_is_cancelled() -> None:
    """alice opens more rounds (questions out) than her quota: her oldest go, each with its upstream call
    cancelled and a reason to answer with; bob's one open round stays."""
    registry = Exchanges()
    bobs = registry.new("bob")
    registry.opened(bobs)
    alices = [registry.new("alice") for _ in range(exchanges.MAX_PER_NAMESPACE + 10)]
    for ex in alices:
        registry.opened(ex)
    assert registry.find(bobs.token, "bob") is bobs and not bobs.scope.cancel_called
    assert all(ex.scope.cancel_called and "64 questions" in (ex.evicted or "") for ex in alices[:10])
    assert not any(ex.scope.cancel_called for ex in alices[10:])
    assert sum(ex.namespace == "alice" for ex in registry.rounds.values()) == exchanges.MAX_PER_NAMESPACE


async def test_calls_in_flight_are_not_rounds() -> None:
    """A caller's calls that asked nothing never count against the quota of open rounds."""
    registry = Exchanges()
    calls = [registry.new("alice") for _ in range(exchanges.MAX_EXCHANGES + 10)]
    assert not any(ex.scope.cancel_called for ex in calls) and len(registry.open) == len(calls)


async def test_at_the_quota_of_all_the_biggest_holder_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchanges, "MAX_EXCHANGES", 4)
    registry = Exchanges()
    bobs, *alices = [registry.new(ns) for ns in ("bob", "alice", "alice", "alice")]
    for ex in [bobs, *alices]:
        registry.opened(ex)
    carol = registry.new("carol")
    registry.opened(carol)
    assert alices[0].evicted and not bobs.evicted and not carol.evicted


async def test_a_call_without_a_task_hands_its_first_question_over() -> None:
    """The lean path's exchange (no task waits on it): the first question goes to `handover` (the host's
    call answers it), later ones wait in the exchange for the retry as always; a handover that finds
    the host's call gone declines the question at once and opens no round; the quota's eviction and a
    retry given up end such a call through `halt`."""
    registry = Exchanges()
    ex = registry.new("")
    handed: list[object] = []

    def hand(question: object) -> bool:
        handed.append(question)
        return True

    ex.handover = hand
    roots = types.ListRootsResult(roots=[])
    async with anyio.create_task_group() as tg:

        async def ask_twice() -> None:
            assert await ex.ask(types.ListRootsRequest()) == roots
            assert await ex.ask(types.ListRootsRequest()) == roots

        tg.start_soon(ask_twice)
        await anyio.wait_all_tasks_blocked()
        ((first,),) = [handed]
        assert isinstance(first, types.InputRequiredResult) and ex.handover is None and ex.token in registry.rounds
        assert ex.answer({"q1": {"roots": []}}) is None
        second = await ex.next_outcome()  # not handed over: it waits for the host's retry
        assert isinstance(second, types.InputRequiredResult) and list(second.input_requests) == ["q2"]
        assert ex.answer({"q2": {"roots": []}}) is None
    assert len(handed) == 1

    gone = registry.new("")
    gone.handover = lambda question: False  # the host cancelled its call meanwhile
    with anyio.fail_after(5):
        assert await gone.ask(types.ListRootsRequest()) is None
    assert not gone.waiting and gone.token not in registry.rounds

    halted: list[str] = []
    lean = registry.new("alice")
    lean.halt = lambda: halted.append(lean.evicted or "")
    registry.opened(lean)
    for _ in range(exchanges.MAX_PER_NAMESPACE):
        registry.opened(registry.new("alice"))
    assert len(halted) == 1 and "64 questions" in halted[0] and lean.halt is None
    with anyio.fail_after(5):  # no task finishes it: the eviction answers its retry
        outcome = await lean.next_outcome()
    assert isinstance(outcome, types.CallToolResult) and outcome.is_error and "64 questions" in outcome.content[0].text

    asked_again = registry.new("")
    asked_again.halt = lambda: halted.append("retry given up")
    asked_again.cancel()  # the host gave up on its retry: the upstream call stops, once
    asked_again.cancel()
    assert halted[1:] == ["retry given up"] and asked_again.scope.cancel_called


async def test_results_a_host_request_waits_on_never_push_out_one_waiting_for_a_retry() -> None:
    """alice's result that waits for her retry stays findable while 64 of her calls finish in one turn
    with their own requests waiting on them (those are taken and closed at once, never kept)."""
    registry = Exchanges()
    waiting = registry.new("alice")
    waiting.finish_now(DONE)
    burst = [registry.new("alice") for _ in range(exchanges.MAX_KEPT_PER_NAMESPACE)]
    for ex in burst:
        ex.busy = True
        ex.finish_now(DONE)
    assert registry.find(waiting.token, "alice") is waiting
    for ex in burst:
        registry.close(ex)
    assert list(registry.open) == [waiting.token]


async def test_old_results_go_in_the_order_they_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiry follows the order results finished in, and one finished again moves to the end (its older
    neighbour still goes in time)."""
    registry = Exchanges()
    clock = [100.0]
    monkeypatch.setattr(exchanges.time, "monotonic", lambda: clock[0])
    first, second = registry.new("alice"), registry.new("alice")
    first.finish_now(DONE)
    clock[0] = 110.0
    second.finish_now(DONE)
    clock[0] = 150.0
    first.finish_now(DONE)  # finished again later: kept from then on
    clock[0] = 110.0 + exchanges.KEEP_FINISHED + 1
    registry.new("carol")
    assert second.token not in registry.open and first.token in registry.open
