"""Live events (``dflow.live``) in local mode: a step publishes them while it runs, a
follower reads them between the committed steps (``Run.events(live=True)``), and they are
best effort: a store that cannot take them costs the step nothing, a store without a feed
leaves the committed steps to follow; bad data is refused where it is published."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import dflow
from dflow import DFlow, LiveEvent, Run, RunTimeoutError, StepRecord
from dflow.live import MAX_EVENT_BYTES, NO_LIVE_FEED, LiveFeed


async def _count_to(n: int) -> int:
    for i in range(n):
        assert await dflow.live.publish({"i": i}) is True
    return n


counting = (
    DFlow.from_call("live-count")
    .map(_count_to)
    .id("count")
    .map(lambda n: n * 10)
    .id("times")
    .init("live-count")
)


def test_a_step_publishes_and_a_follower_reads_its_events_before_its_record(local: dflow.Runtime) -> None:
    run = counting.call(3)
    seen = list(run.events(live=True, timeout=10))
    keys = [e.key for e in seen if isinstance(e, StepRecord)]
    assert keys == ["live-count>count>times", "count>times", "times"]
    assert [e.data["i"] for e in seen if isinstance(e, LiveEvent)] == [0, 1, 2]
    at = {e.key if isinstance(e, StepRecord) else e.data["i"]: n for n, e in enumerate(seen)}
    assert max(at[0], at[1], at[2]) < at["count>times"], "a step's live events come before its record"
    live = [e for e in seen if isinstance(e, LiveEvent)]
    count = next(e for e in seen if isinstance(e, StepRecord) and e.key == "count>times")
    assert {(e.trace_id, e.seq, e.attempt) for e in live} == {(run.trace_id, count.seq, 0)}
    assert run.result(5) == 30
    assert [type(e) for e in run.events(timeout=5)] == [StepRecord] * 3, "without live=True: steps only"


def test_publishing_outside_a_step_sends_nothing() -> None:
    assert asyncio.run(dflow.live.publish({"alone": True})) is False


@pytest.mark.parametrize(
    ("data", "error", "words"),
    [
        (["not", "a", "dict"], TypeError, "takes a dict, got list"),
        ({"when": object()}, TypeError, "JSON-able"),
        ({"big": "x" * MAX_EVENT_BYTES}, ValueError, "at most 65536 bytes"),
    ],
)
def test_data_a_follower_could_not_read_is_refused_in_the_step(
    local: dflow.Runtime, data: Any, error: type[Exception], words: str
) -> None:
    async def bad(_: Any) -> str:
        with pytest.raises(error, match=words):
            await dflow.live.publish(data)
        return "went on"

    flow = DFlow.from_call("live-bad").map(bad).id("bad").init(f"live-bad-{error.__name__}-{len(str(data))}")
    assert flow.call(None).result(5) == "went on"


class _Down(LiveFeed):
    def __init__(self) -> None:
        self.tries = 0

    async def publish(self, event: LiveEvent) -> None:
        self.tries += 1
        raise ConnectionError("the feed is away")

    async def read(self, trace_id: str, after: str, wait: float) -> list[LiveEvent]:
        raise ConnectionError("the feed is away")


def test_a_feed_that_fails_costs_the_step_nothing_and_is_logged_once(
    local: dflow.Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    down = _Down()
    monkeypatch.setattr(type(local.store), "live", property(lambda self: down))
    said: list[bool] = []

    async def chatty(n: int) -> int:
        for i in range(n):
            said.append(await dflow.live.publish({"i": i}))
        return n

    flow = DFlow.from_call("live-down").map(chatty).id("chatty").init("live-down")
    with caplog.at_level(logging.WARNING, logger="dflow.live"):
        run = flow.call(5)
        assert [e.key for e in run.events(live=True, timeout=10)] == ["live-down>chatty", "chatty"]
    assert run.result(5) == 5
    assert said == [False] * 5 and down.tries == 1, "after the first failure the step stops trying"
    (warning,) = [r for r in caplog.records if r.name == "dflow.live"]
    assert "dropped" in warning.getMessage() and run.trace_id in warning.getMessage()


def test_a_store_without_a_feed_leaves_the_committed_steps_to_follow(
    local: dflow.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(type(local.store), "live", property(lambda self: NO_LIVE_FEED))
    run = counting.call(2)
    assert [e.key for e in run.events(live=True, timeout=10)] == [
        "live-count>count>times",
        "count>times",
        "times",
    ]


def test_following_live_ends_with_a_timeout_while_the_run_waits(local: dflow.Runtime) -> None:
    waiting = (
        DFlow.from_call("live-wait").flat_map(lambda v: DFlow.from_call("never")).id("wait").init("live-wait")
    )
    run = waiting.call(1)
    with pytest.raises(RunTimeoutError, match="did not end within 0.3s"):
        list(Run(run.trace_id).events(live=True, timeout=0.3))
    run.cancel()
