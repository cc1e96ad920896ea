"""Run.rerun_from in local mode: a run that failed at step 4 of 5 because of a bug, rerun
from step 4 once the bug is fixed, completes without executing steps 1 to 3 again (their
side effects counted); zips, waits, delays, retries and recovered errors before the rerun
point are replayed, flat_map functions run again; bad requests are refused clearly."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import dflow
from dflow import ContextStack, DFlow, RunStatus
from dflow.testing import FakeClock


class Tally:
    """Calls of each step, counted, and the "deployed code": whether each bug is fixed."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fixed = {"four": False, "fan": False}


# Shared by name: the steps of flows built at run time travel pickled, and must count here.
TALLY = dflow.shared(Tally(), "test-rerun-tally")
CALLS, FIXED = TALLY.calls, TALLY.fixed


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    CALLS.clear()
    FIXED.update(four=False, fan=False)
    yield


def counted(name: str) -> Any:
    """A step that counts its calls, writes its input to the run's data, and adds one; the
    step named ``four`` has a bug until ``TALLY.fixed["four"]``."""

    def step(ctx: ContextStack, x: int) -> int:
        TALLY.calls[name] += 1
        if name == "four" and not TALLY.fixed["four"]:
            raise ValueError("bug in step four")
        ctx.put(name, x)
        return x + 1

    step.__name__ = name
    return step


def five_steps(name: str) -> dflow.Pipeline[int]:
    flow = DFlow.from_call("rerun-go")
    for step in ("one", "two", "three", "four", "five"):
        flow = flow.map(counted(step)).id(step)
    return flow.init(name)


FIVE = five_steps("rerun-five")


def failed(run: dflow.Run[Any]) -> dflow.RunFailedError:
    with pytest.raises(dflow.RunFailedError) as caught:
        run.result(5)
    return caught.value


def test_a_run_that_failed_at_step_4_reruns_from_it_without_running_steps_1_to_3(
    local: dflow.Runtime,
) -> None:
    run = FIVE.call(10)
    assert "bug in step four" in str(failed(run))
    assert CALLS == {"one": 1, "two": 1, "three": 1, "four": 1}

    TALLY.fixed["four"] = True  # the bug is fixed
    again = run.rerun_from(4)
    assert again.trace_id != run.trace_id
    assert again.result(5) == 15
    assert CALLS == {"one": 1, "two": 1, "three": 1, "four": 2, "five": 1}

    steps = again.context().steps
    assert [(s.seq, s.key.split(">")[0], s.status) for s in steps] == [
        (0, "rerun-go", dflow.StepStatus.ENTRY),
        *[(i, n, dflow.StepStatus.DONE) for i, n in enumerate(("one", "two", "three", "four", "five"), 1)],
    ]
    assert [s.output for s in steps] == [10, 11, 12, 13, 14, 15]
    data = again.context().as_dict()
    assert {k: data[k] for k in ("one", "two", "three", "four", "five")} == {
        "one": 10,
        "two": 11,
        "three": 12,
        "four": 13,
        "five": 14,
    }
    assert data["dflow/rerun"]["trace_id"] == run.trace_id and data["dflow/rerun"]["seq"] == 4
    assert f"rerun of run {run.trace_id} from step 4" in again.tree()
    steps_shown = [line for line in again.tree().splitlines() if line.startswith(("├─", "└─"))]
    replayed = [line.split()[1] for line in steps_shown if " replayed " in line]
    assert replayed == ["#0", "#1", "#2", "#3"], again.tree()  # the entry and steps 1-3, not four on
    assert "rerun of" not in run.tree() and "replayed" not in run.tree()
    assert run.status() is RunStatus.FAILED  # the original stays as it ended


def test_arerun_from_in_async_code(local: dflow.Runtime) -> None:
    async def main() -> int:
        run = await FIVE.acall(1)
        with pytest.raises(dflow.RunFailedError):
            await run.wait(5)
        TALLY.fixed["four"] = True
        again = await run.arerun_from(4)
        return await again.wait(5)

    assert asyncio.run(main()) == 6
    assert CALLS == {"one": 1, "two": 1, "three": 1, "four": 2, "five": 1}


def test_the_rerun_starts_with_the_originals_data(local: dflow.Runtime) -> None:
    reads = []

    def four_reads(ctx: ContextStack, x: int) -> int:
        reads.append((ctx.get("two"), ctx.get("five")))
        return x

    flow = DFlow.from_call("rerun-data").map(counted("one")).id("one").map(counted("two")).id("two")
    flow = flow.map(counted("three")).id("three").map(four_reads).id("four").map(counted("five")).id("five")
    done = flow.init("rerun-data").call(0)
    assert done.result(5) == 4
    again = done.rerun_from(4)  # a run that ended DONE may be rerun too
    assert again.result(5) == 4
    # the replayed steps' writes are there; so is what step five wrote in the original (the caveat)
    assert reads == [(1, None), (1, 3)]
    assert CALLS == {"one": 1, "two": 1, "three": 1, "five": 2}


def test_a_rerun_of_a_rerun(local: dflow.Runtime) -> None:
    original = FIVE.call(0)
    failed(original)
    TALLY.fixed["four"] = True
    first = original.rerun_from(4)
    assert first.result(5) == 5
    second = first.rerun_from(5)  # steps 1-3 replayed from the original's records, 4 from the first rerun's
    assert second.result(5) == 5
    assert CALLS == {"one": 1, "two": 1, "three": 1, "four": 2, "five": 2}
    assert second.context().get("dflow/rerun")["trace_id"] == first.trace_id
    earlier = first.rerun_from(2, again=True)  # from a step before the first rerun's own rerun point
    assert earlier.result(5) == 5
    assert CALLS == {"one": 1, "two": 2, "three": 2, "four": 3, "five": 3}


def test_zip_and_flat_map_before_the_rerun_point_are_replayed(local: dflow.Runtime) -> None:
    def fan(ctx: ContextStack, x: int) -> DFlow[int]:
        TALLY.calls["fan"] += 1
        return (
            DFlow.zip(DFlow.just(x).map(counted("b1")).id("b1"), DFlow.just(x).map(counted("b2")).id("b2"))
            .map(sum)
            .id("sum")
        )

    pipeline = (
        DFlow.from_call("rerun-zip")
        .map(counted("one"))
        .id("one")
        .flat_map(fan)
        .id("fan")
        .map(counted("three"))
        .id("three")
        .map(counted("four"))
        .id("four")
        .init("rerun-zip")
    )
    run = pipeline.call(1)
    failed(run)
    seq = next(s.seq for s in run.context().steps if s.key.startswith("four"))
    assert seq == 7  # entry, one, fan, its zip, the join, sum, three, four
    TALLY.fixed["four"] = True
    again = run.rerun_from(seq)
    assert again.result(5) == 8  # one: 1 -> 2; the branches: 3 and 3; sum: 6; three: 7; four: 8
    # the flat_map's function built the flow again; nothing else ran again but step four
    assert CALLS == {"one": 1, "fan": 2, "b1": 1, "b2": 1, "three": 1, "four": 2}
    assert again.context().get("b1") == 2  # a branch's write, merged by the join of the original


def test_a_zip_at_the_head_of_a_pipeline_and_an_any(local: dflow.Runtime) -> None:
    branches = DFlow.zip(
        DFlow.just(1).map(counted("b1")).id("b1"), DFlow.just(5).map(counted("b2")).id("b2")
    ).id("rerun-zip-head")
    pipeline = (
        branches.map(sum)
        .id("sum")
        .flat_map(lambda v: DFlow.any(DFlow.just(v).map(counted("a1")).id("a1")))
        .id("first")
        .map(counted("four"))
        .id("four")
        .init("rerun-zip-head")
    )
    run = pipeline.call()
    failed(run)
    seq = next(s.seq for s in run.context().steps if s.key.startswith("four"))
    TALLY.fixed["four"] = True
    again = run.rerun_from(seq)
    assert again.result(5) == 10
    assert CALLS == {"b1": 1, "b2": 1, "a1": 1, "four": 2}


def test_waits_delays_retries_and_recovered_errors_before_the_rerun_point(local: dflow.Runtime) -> None:
    def flaky(x: int) -> int:
        TALLY.calls["flaky"] += 1
        if TALLY.calls["flaky"] < 3:
            raise ConnectionError("try again")
        return x

    def broken(x: int) -> int:
        TALLY.calls["broken"] += 1
        raise RuntimeError("always")

    def start_job(ctx: ContextStack) -> None:
        TALLY.calls["on_init"] += 1

    pipeline = (
        DFlow.from_call("rerun-waits")
        .map(flaky)
        .id("flaky")
        .retry(3, backoff=0.001)
        .map(broken)
        .id("broken")
        .on_error_return(lambda e: 100)
        .flat_map(lambda v: DFlow.from_call("approve", on_init=start_job).map(lambda a: v + a).id("approved"))
        .id("ask")
        .flat_map(lambda v: DFlow.delay(v, 1.0))
        .id("pause")
        .map(counted("four"))
        .id("four")
        .init("rerun-waits")
    )
    run = pipeline.call(1)
    deadline = time.monotonic() + 5
    while run.status() is not RunStatus.WAITING:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    DFlow.call("approve", 20, run.trace_id)
    failed(run)
    assert CALLS == {"flaky": 3, "broken": 1, "on_init": 1, "four": 1}
    seq = next(s.seq for s in run.context().steps if s.key.startswith("four"))
    TALLY.fixed["four"] = True
    started = time.monotonic()
    again = run.rerun_from(seq)
    assert again.result(5) == 121  # the recovered 100, plus the recorded answer 20, plus one
    assert time.monotonic() - started < 0.8, "the delay before the rerun point did not sleep again"
    assert CALLS == {"flaky": 3, "broken": 1, "on_init": 1, "four": 2}
    assert again.status() is RunStatus.DONE


def test_steps_at_and_after_the_rerun_point_run_again_with_their_branches(local: dflow.Runtime) -> None:
    pipeline = (
        DFlow.from_call("rerun-after")
        .map(counted("one"))
        .id("one")
        .flat_map(lambda x: DFlow.zip(DFlow.just(x).map(counted("b1")).id("b1")))
        .id("fan")
        .init("rerun-zip-after")
    )
    run = pipeline.call(1)
    assert run.result(5) == [3]
    again = run.rerun_from(2)  # the flat_map step: its zip runs again
    assert again.result(5) == [3]
    assert CALLS == {"one": 1, "b1": 2}


def test_a_flow_changed_before_the_rerun_point_fails_the_rerun_saying_where(local: dflow.Runtime) -> None:
    def fan(x: int) -> DFlow[int]:
        TALLY.calls["fan"] += 1
        if TALLY.fixed["fan"]:
            return DFlow.just(x).map(counted("other")).id("other")
        return DFlow.just(x).map(counted("inner")).id("inner")

    pipeline = (
        DFlow.from_call("rerun-changed")
        .flat_map(fan)
        .id("fan")
        .map(counted("four"))
        .id("four")
        .init("rerun-changed")
    )
    run = pipeline.call(1)
    failed(run)
    FIXED.update(four=True, fan=True)
    error = failed(run.rerun_from(3))
    assert error.error["type"] == "dflow.errors.BuildError"
    assert "the flow changed before the rerun point" in str(error)
    assert "other" in str(error) and "inner" in str(error)
    assert TALLY.calls["other"] == 0 and TALLY.calls["four"] == 1


def test_a_flat_map_that_passes_on_another_value_fails_the_rerun_at_the_step_it_feeds(
    local: dflow.Runtime,
) -> None:
    def ask(x: int) -> DFlow[int]:  # as an agent's turn asking a model: another answer each time
        TALLY.calls["ask"] += 1
        return DFlow.just(x * 100 + TALLY.calls["ask"]).map(counted("act")).id("act")

    pipeline = (
        DFlow.from_call("rerun-ask").flat_map(ask).id("ask").map(counted("four")).id("four").init("rerun-ask")
    )
    run = pipeline.call(1)
    failed(run)
    TALLY.fixed["four"] = True
    error = failed(run.rerun_from(3))
    assert error.error["type"] == "dflow.errors.BuildError"
    assert "step 2 'act/ask>four' gets another input now" in str(error)
    assert (
        TALLY.calls["act"] == 1 and TALLY.calls["four"] == 1
    )  # nothing ran on a recorded result that does not fit


def test_bad_requests_are_refused_saying_why(local: dflow.Runtime) -> None:
    with pytest.raises(dflow.RunNotFoundError, match="no run with trace id 'nope'"):
        dflow.Run("nope").rerun_from(1)

    waiting = (
        DFlow.from_call("rerun-wait")
        .flat_map(lambda x: DFlow.from_call("later"))
        .id("wait")
        .init("rerun-waiting")
        .call(1)
    )
    deadline = time.monotonic() + 5
    while waiting.status() is not RunStatus.WAITING:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(dflow.RunError, match="still waiting.*Cancel it first"):
        waiting.rerun_from(1)
    waiting.cancel()
    rerun = waiting.rerun_from(1)  # cancelled: it may be rerun (it waits again)
    while rerun.status() is not RunStatus.WAITING:
        assert time.monotonic() < deadline + 5
        time.sleep(0.005)
    rerun.cancel()

    run = FIVE.call(1)
    failed(run)
    with pytest.raises(dflow.RunError, match=r"no step 5 to rerun from: its steps are 1 to 4"):
        run.rerun_from(5)
    with pytest.raises(dflow.RunError, match=r"its steps are 1 to 4 \(0 is the entry call"):
        run.rerun_from(0)
    with pytest.raises(TypeError, match="an int; got str"):
        run.rerun_from("4")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an int; got bool"):
        run.rerun_from(True)

    zipped = (
        DFlow.from_call("rerun-join")
        .flat_map(lambda x: DFlow.zip(DFlow.just(x).map(counted("b")).id("b")))
        .id("fan")
        .map(counted("four"))
        .id("four")
        .init("rerun-join")
        .call(1)
    )
    failed(zipped)
    with pytest.raises(dflow.RunError, match="step 3 of run .* is the join of the zip/any started at step 2"):
        zipped.rerun_from(3)
    branch = zipped.context().steps[-3].output[0]  # the FORKED record names the branch runs
    with pytest.raises(dflow.RunError, match="is a branch of a zip/any"):
        dflow.Run(branch).rerun_from(0)

    direct = DFlow.direct_run(1, lambda x: DFlow.just(x).map(counted("four")).id("four"))
    failed(direct)
    with pytest.raises(dflow.RunError, match="started by direct_run"):
        direct.rerun_from(1)
    assert TALLY.calls["four"] == 3  # nothing was rerun by a refused request


def test_a_rerun_whose_source_run_expired_is_refused() -> None:
    clock = FakeClock()
    runtime = dflow.global_init_for_test(ttl=2.0, clock=clock)  # the original expires 1 s before its rerun

    def advance(seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(clock.advance(seconds), runtime._loop).result(10)  # type: ignore[arg-type]

    try:
        original = FIVE.call(0)
        failed(original)
        advance(1.0)
        TALLY.fixed["four"] = True
        first = original.rerun_from(4)
        assert first.result(5) == 5
        advance(1.0)
        deadline = time.monotonic() + 5
        while True:
            try:
                original.status()
            except dflow.RunNotFoundError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.002)
        with pytest.raises(
            dflow.RunError, match=f"run '{original.trace_id}', which executed the steps 0 to 3 .* is gone"
        ):
            first.rerun_from(5)
        assert first.rerun_from(1).result(5) == 5  # from its first step nothing is replayed: it may
        assert CALLS == {"one": 2, "two": 2, "three": 2, "four": 3, "five": 2}
    finally:
        dflow.shutdown()


def test_the_original_names_its_rerun_and_a_second_rerun_is_refused_naming_it(local: dflow.Runtime) -> None:
    run = FIVE.call(10)
    failed(run)
    TALLY.fixed["four"] = True
    first = run.rerun_from(4)
    assert first.result(5) == 15
    assert run.info().reruns == (first.trace_id,)
    assert f"rerun as run {first.trace_id}" in run.tree()
    assert f"rerun of run {run.trace_id} from step 4" in first.tree()

    with pytest.raises(
        dflow.AlreadyRerunError, match=f"rerun already, as run '{first.trace_id}'.*again=True"
    ) as e:
        run.rerun_from(4)
    assert e.value.rerun == first.trace_id and e.value.trace_id == run.trace_id
    assert isinstance(e.value, dflow.RunError)
    assert CALLS["four"] == 2 and CALLS["five"] == 1, "the refused rerun ran nothing"
    assert run.info().reruns == (first.trace_id,)

    second = run.rerun_from(4, again=True)
    assert second.result(5) == 15
    assert run.info().reruns == (first.trace_id, second.trace_id)
    assert f"rerun as run {second.trace_id} (and before it {first.trace_id})" in run.tree()
    assert first.info().reruns == (), "a rerun names the runs it was rerun as, not its siblings"


def test_of_two_reruns_asked_at_once_one_starts(local: dflow.Runtime) -> None:
    run = FIVE.call(1)
    failed(run)
    TALLY.fixed["four"] = True

    async def both() -> list[Any]:
        return await asyncio.gather(run.arerun_from(4), run.arerun_from(4), return_exceptions=True)

    got = asyncio.run(both())
    started = [r for r in got if isinstance(r, dflow.Run)]
    refused = [r for r in got if isinstance(r, dflow.AlreadyRerunError)]
    assert len(started) == 1 and len(refused) == 1, got
    assert refused[0].rerun == started[0].trace_id
    assert started[0].result(5) == 6
    assert CALLS["five"] == 1, "one rerun ran"


def test_a_refused_rerun_is_not_noted_on_the_original(local: dflow.Runtime) -> None:
    run = FIVE.call(1)
    failed(run)
    with pytest.raises(dflow.RunError, match="no step 9"):
        run.rerun_from(9)
    assert run.info().reruns == ()
    TALLY.fixed["four"] = True
    assert run.rerun_from(4).result(5) == 6  # (the refused request left no rerun behind)
