"""Compensation (``DFlow.compensate``) and fallbacks (``DFlow.fallback``) in local mode:
the order and the once-ness of compensations, cancelled runs, zip branches, compensations
that fail, forged saga entries; fallback flows in place of a failed step."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import dflow
from dflow import BuildError, ContextStack, DFlow, RunCompensatedError, RunFailedError, RunStatus, StepStatus
from dflow.wire.values import encode

pytestmark = pytest.mark.usefixtures("local")


class Ledger:
    """What the steps of a test did and undid, in order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, Any]] = []

    def add(self, *event: Any) -> None:
        with self.lock:
            self.events.append(event)  # type: ignore[arg-type]

    def of(self, kind: str) -> list[Any]:
        return [e[1] for e in self.events if e[0] == kind]


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def booking(ledger: Ledger, steps: int, fail_at: int | None) -> DFlow[Any]:
    """``steps`` booking steps, each with a compensation; the one at ``fail_at`` raises."""

    def book(n: int) -> Any:
        def do(prev: Any) -> str:
            if n == fail_at:
                raise ValueError(f"step {n} failed")
            ledger.add("do", n)
            return f"booking-{n}"

        return do

    def cancel_booking(n: int) -> Any:
        def undo(ctx: ContextStack, booking_id: str) -> None:
            ledger.add("undo", (n, booking_id, ctx.idempotency_key))

        return undo

    flow: Any = DFlow.from_call("go")
    for n in range(1, steps + 1):
        flow = flow.map(book(n)).id(f"s{n}")
        if n != fail_at:
            flow = flow.compensate(cancel_booking(n))
    return flow


def test_a_saga_failing_at_step_4_compensates_3_2_1_once_and_ends_compensated() -> None:
    ledger = Ledger()
    run = booking(ledger, 4, fail_at=4).init(_name("saga")).call()
    with pytest.raises(RunCompensatedError) as caught:
        run.result(10)
    assert isinstance(caught.value, RunFailedError), "a compensated run is a failed one"
    assert ledger.of("do") == [1, 2, 3]
    undone = ledger.of("undo")
    assert [(n, b) for n, b, _ in undone] == [(3, "booking-3"), (2, "booking-2"), (1, "booking-1")]
    assert len({k for _, _, k in undone}) == 3, "each compensation is a step of its own"
    info = run.info()
    assert info.status is RunStatus.COMPENSATED and info.status.finished
    assert info.error is not None and info.error["type"] == "ValueError" and info.error["step"] == "s4"
    assert info.error["compensated"] == ["s3>s4", "s2>s3>s4", "s1>s2>s3>s4"]
    records = list(run.events(timeout=1))
    assert [r.name for r in records if r.name and r.name.startswith("compensate")] == [
        "compensate s3",  # (by the id of the step undone; the error's "compensated" has the keys)
        "compensate s2",
        "compensate s1",
    ]
    assert not [k for k in run.context().keys() if k.startswith("dflow/saga/")], "every entry was consumed"


def test_a_run_that_succeeds_or_recovers_compensates_nothing() -> None:
    ledger = Ledger()
    assert booking(ledger, 3, fail_at=None).init(_name("saga-ok")).call().result(10) == "booking-3"
    recovered = booking(ledger, 3, fail_at=3).on_error_return(lambda e: "handled").init(_name("saga-handled"))
    assert recovered.call().result(10) == "handled"
    assert ledger.of("undo") == []


def test_a_cancelled_run_is_compensated() -> None:
    ledger = Ledger()
    flow = booking(ledger, 2, fail_at=None).flat_map(lambda v: DFlow.from_call("approval")).id("wait")
    run = flow.init(_name("saga-cancel")).call()
    for _ in range(500):
        if run.info().status is RunStatus.WAITING:
            break
        time.sleep(0.01)
    assert run.info().status is RunStatus.WAITING
    after = run.cancel("the customer left")
    assert after.status in (RunStatus.RUNNING, RunStatus.COMPENSATED), "it runs its compensations first"
    with pytest.raises(RunCompensatedError) as caught:
        run.result(10)
    assert caught.value.error["type"] == "dflow.RunCancelled"
    assert caught.value.error["message"] == "the customer left"
    assert [n for n, _, _ in ledger.of("undo")] == [2, 1]


def test_zip_branches_that_completed_are_compensated_too() -> None:
    ledger = Ledger()  # the flat_map's flow is stored: what it captures must travel by name
    dflow.shared(ledger, _name("saga-zip-ledger"))

    def ok(tag: str) -> Any:
        def do(v: Any) -> str:
            ledger.add("do", tag)
            return tag

        return do

    def undo(tag: str) -> Any:
        def u(v: str) -> None:
            ledger.add("undo", v)

        return u

    def fail(v: Any) -> None:
        raise ValueError("the hotel is full")

    flow = (
        DFlow.from_call("go")
        .map(ok("before"))
        .id("before")
        .compensate(undo("before"))
        .flat_map(
            lambda v: DFlow.zip(
                DFlow.just(v).map(ok("flight")).id("flight").compensate(undo("flight")),
                DFlow.just(v)
                .map(ok("car"))
                .id("car")
                .compensate(undo("car"))
                .flat_map(lambda c: DFlow.delay(c, 0.2))
                .id("slow")
                .map(fail)
                .id("hotel"),
            ).id("both")
        )
        .id("book")
    )
    run = flow.init(_name("saga-zip")).call()
    with pytest.raises(RunCompensatedError):
        run.result(10)
    assert sorted(ledger.of("do")) == ["before", "car", "flight"]
    undone = ledger.of("undo")
    assert sorted(undone) == ["before", "car", "flight"] and undone[-1] == "before", undone


def test_a_failing_compensation_ends_the_run_failed_with_what_is_left_undone() -> None:
    ledger = Ledger()
    tries = {"n": 0}

    def flaky_undo(v: str) -> None:
        tries["n"] += 1
        raise ConnectionError("the booking service is down")

    flow = (
        DFlow.from_call("go")
        .map(lambda v: "a")
        .id("a")
        .compensate(lambda v: ledger.add("undo", v))
        .map(lambda v: "b")
        .id("b")
        .compensate(flaky_undo, attempts=2, backoff=0.01)
        .map(lambda v: "c")
        .id("c")
        .compensate(lambda v: ledger.add("undo", v))
        .map(lambda v: 1 / 0)
        .id("d")
    )
    run = flow.init(_name("saga-undo-fails")).call()
    with pytest.raises(RunFailedError) as caught:
        run.result(10)
    assert not isinstance(caught.value, RunCompensatedError)
    err = caught.value.error
    assert run.info().status is RunStatus.FAILED
    assert err["type"] == "ZeroDivisionError" and err["step"] == "d", "the error it failed with first"
    assert err["compensation_error"]["type"] == "ConnectionError"
    assert err["compensated"] == ["c>d"]
    assert err["undone"] == ["b>c>d", "a>b>c>d"]
    assert tries["n"] == 2 and ledger.of("undo") == ["c"], "compensation stops at the one that failed"


def test_a_forged_saga_entry_runs_no_code() -> None:
    def forge(ctx: ContextStack, v: Any) -> Any:
        with pytest.raises(dflow.DFlowError, match="dflow's own"):
            ctx.put("dflow/saga/000000000001", b"not a signed entry")
        # as a writer of the store could (a step cannot)
        ctx._changes["dflow/saga/000000000001"] = encode(b"not a signed entry")

    def fail(v: Any) -> None:
        raise ValueError("and fail")

    run = DFlow.from_call("go").map(forge).id("forge").map(fail).id("fail").init(_name("saga-forged")).call()
    with pytest.raises(RunFailedError) as caught:
        run.result(10)
    assert run.info().status is RunStatus.FAILED
    assert caught.value.error["type"] == "ValueError"
    assert caught.value.error["compensation_error"]["type"] == "dflow.errors.PayloadRejectedError"


def test_compensate_and_fallback_say_where_they_apply() -> None:
    with pytest.raises(BuildError, match="compensate applies to map steps"):
        DFlow.from_call("x").id("x").compensate(lambda v: None)
    with pytest.raises(BuildError, match="fallback applies to map and flat_map"):
        DFlow.from_call("x").id("x").fallback(lambda v: DFlow.just(v))
    with pytest.raises(BuildError, match="exception classes"):
        DFlow.from_call("x").map(str).id("s").fallback(lambda v: DFlow.just(v), on=(ValueError, "x"))  # type: ignore[arg-type]
    with pytest.raises(BuildError, match="attempts"):
        DFlow.from_call("x").map(str).id("s").compensate(lambda v: None, attempts=0)


# -- fallback ------------------------------------------------------------------------


def slow_model(prompt: str) -> str:
    raise TimeoutError("the big model timed out")


def fast_model(prompt: str) -> str:
    return f"quick answer to {prompt}"


def test_a_step_that_fails_for_good_runs_its_fallback_flow_in_its_place() -> None:
    calls = {"n": 0}

    def model(prompt: str) -> str:
        calls["n"] += 1
        return slow_model(prompt)

    flow = (
        DFlow.from_call("ask")
        .map(model)
        .id("big")
        .retry(2, backoff=0.01)
        .fallback(lambda prompt: DFlow.just(prompt).map(fast_model).id("small"))
        .map(str.upper)
        .id("shout")
    )
    run = flow.init(_name("fallback")).call("hi")
    assert run.result(10) == "QUICK ANSWER TO HI"
    assert calls["n"] == 2, "the fallback runs after the retries"
    records = list(run.events(timeout=1))
    statuses = [(r.key, r.status) for r in records]
    assert ("big>shout", StepStatus.RETRYING) in statuses and ("big>shout", StepStatus.FALLBACK) in statuses
    assert ("small/big>shout", StepStatus.DONE) in statuses, "its steps show under the failed step"
    assert "FALLBACK" in run.tree() or "fallback" in run.tree()


def test_fallback_only_for_the_errors_it_names_and_its_errors_go_to_handlers() -> None:
    def broken(v: str) -> str:
        raise KeyError("not a timeout")

    narrow = (
        DFlow.from_call("ask")
        .map(broken)
        .id("m")
        .fallback(lambda v: DFlow.just("fb"), on=TimeoutError)
        .on_error_return(lambda e: f"handled {type(e).__name__}")
    )
    assert narrow.init(_name("fallback-narrow")).call("x").result(10) == "handled KeyError"

    def failing_fallback(v: str) -> DFlow[str]:
        return DFlow.just(v).map(slow_model).id("also-slow")

    chained = (
        DFlow.from_call("ask")
        .map(slow_model)
        .id("m")
        .fallback(failing_fallback)
        .on_error_return(lambda e: f"handled {type(e).__name__}")
    )
    assert chained.init(_name("fallback-fails")).call("x").result(10) == "handled TimeoutError"

    def raising_builder(v: str) -> DFlow[str]:
        raise RuntimeError("cannot build the fallback")

    builder = (
        DFlow.from_call("ask")
        .map(slow_model)
        .id("m")
        .fallback(raising_builder)
        .on_error_return(lambda e: str(e))
    )
    assert builder.init(_name("fallback-builder")).call("x").result(10) == "cannot build the fallback"


def test_a_circuit_open_error_reaches_the_fallback() -> None:
    name = _name("fb-circuit")

    def down(v: Any) -> str:
        raise ConnectionError("down")

    flow = (
        DFlow.from_call("go")
        .map(down)
        .id("dep")
        .circuit(name, failures=1, cool_down=30)
        .fallback(lambda v: DFlow.just("cached answer"))
    )
    p = flow.init(_name("fallback-circuit"))
    assert p.call(1).result(10) == "cached answer"
    assert p.call(2).result(10) == "cached answer"
    assert dflow.Circuit(name).state().state == "open"


def test_a_compensated_run_is_rerun_from_its_first_step_only() -> None:
    ledger = Ledger()
    run = booking(ledger, 4, fail_at=4).init(_name("saga-rerun")).call()
    with pytest.raises(RunCompensatedError):
        run.result(10)
    steps = list(run.events(timeout=1))
    failed_at = next(r.seq for r in steps if r.key == "s4" and r.status is StepStatus.FAILED)
    with pytest.raises(dflow.RunError, match="was compensated"):
        run.rerun_from(failed_at)  # it would replay bookings that were cancelled
    first = min(r.seq for r in steps if r.status is not StepStatus.ENTRY)
    again = run.rerun_from(first)
    with pytest.raises(RunCompensatedError):
        again.result(10)
    assert ledger.of("do") == [1, 2, 3, 1, 2, 3]
    assert [n for n, _, _ in ledger.of("undo")] == [3, 2, 1, 3, 2, 1], "each run undid what it did, once"
    assert not [k for k in again.context().keys() if k.startswith("dflow/saga/")]
