"""Circuit breakers in local mode: on steps (``DFlow.circuit``) and around any code
(``Circuit``): opening after the threshold, failing fast, one probe at a time, closing."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

import dflow
from dflow import BuildError, Circuit, CircuitOpenError, DFlow, DFlowError

pytestmark = pytest.mark.usefixtures("local")


def _name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


class Dependency:
    """A dependency that fails while ``down``, counts its calls, and can be held."""

    def __init__(self) -> None:
        self.calls = 0
        self.down = True
        self.hold = threading.Event()
        self.hold.set()
        self.threads: set[str] = set()

    def __call__(self, v: Any) -> str:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        self.hold.wait(10)
        if self.down:
            raise ConnectionError("the dependency is down")
        return f"ok {v}"


def _outcome(error: BaseException) -> str:
    return type(error).__name__


def test_a_step_circuit_opens_fails_fast_probes_once_and_closes() -> None:
    name, dep = _name(), Dependency()
    pipeline = (
        DFlow.from_call(name)
        .map(dep)
        .id("dep")
        .circuit(name, failures=3, window=30, cool_down=0.4)
        .on_error_return(_outcome)
        .init(f"circuit-{name}")
    )

    assert [pipeline.call(i).result(10) for i in range(3)] == ["ConnectionError"] * 3
    assert Circuit(name).state().state == "open"
    failing_fast = [pipeline.call(i) for i in range(10)]
    assert dflow.gather(failing_fast, timeout=10) == ["CircuitOpenError"] * 10
    assert dep.calls == 3, "an open circuit does not call the dependency"
    assert dep.threads and not any(t.startswith("dflow-runtime") for t in dep.threads), (
        "a sync step runs in a thread"
    )

    dep.down, dep.hold = False, threading.Event()  # the probe will wait in the dependency
    time.sleep(max(0.0, Circuit(name).state().retry_at - time.time()) + 0.02)
    probe = pipeline.call("probe")
    _until(lambda: dep.calls == 4)
    state = Circuit(name).state()
    assert (state.state, state.probing) == ("half_open", True)
    others = [pipeline.call(i) for i in range(5)]
    assert dflow.gather(others, timeout=10) == ["CircuitOpenError"] * 5, "one probe at a time"
    dep.hold.set()
    assert probe.result(10) == "ok probe"
    assert Circuit(name).state().state == "closed"
    assert [pipeline.call(i).result(10) for i in range(3)] == ["ok 0", "ok 1", "ok 2"]
    assert dep.calls == 7


def test_a_failed_probe_opens_the_circuit_again() -> None:
    name, dep = _name(), Dependency()
    pipeline = (
        DFlow.from_call(name)
        .map(dep)
        .id("dep")
        .circuit(name, failures=1, cool_down=0.2)
        .on_error_return(_outcome)
        .init(f"circuit-reopen-{name}")
    )
    assert pipeline.call(1).result(10) == "ConnectionError"
    opened = Circuit(name).state()
    time.sleep(0.25)
    assert pipeline.call(2).result(10) == "ConnectionError", "the probe went through, and failed"
    again = Circuit(name).state()
    assert again.state == "open" and again.opened_at > opened.opened_at
    assert pipeline.call(3).result(10) == "CircuitOpenError"
    assert dep.calls == 2


def test_the_open_error_says_which_circuit_and_when() -> None:
    name, dep = _name(), Dependency()
    seen: list[CircuitOpenError] = []

    def keep(error: BaseException) -> str:
        assert isinstance(error, CircuitOpenError)
        seen.append(error)
        return "fallback"

    flow = (
        DFlow.from_call(name).map(dep).id("dep").circuit(name, failures=1, cool_down=5).on_error_return(keep)
    )
    pipeline = flow.init(f"circuit-error-{name}")
    with pytest.raises(dflow.RunFailedError, match="ConnectionError"):
        DFlow.from_call(f"{name}-raw").map(dep).id("dep").circuit(name, failures=1, cool_down=5).init(
            f"circuit-error-raw-{name}"
        ).call(0).result(10)
    before = time.time()
    assert pipeline.call(1).result(10) == "fallback"
    error = seen[0]
    assert (error.name, error.state) == (name, "open")
    assert before + 4 < error.retry_at <= before + 5 and 4 < error.retry_after <= 5
    assert name in str(error) and "fail fast" in str(error)


def test_a_retried_step_waits_out_the_cool_down_and_becomes_the_probe() -> None:
    name = _name()
    calls: list[float] = []

    def flaky(v: int) -> int:
        calls.append(time.monotonic())
        if len(calls) <= 2:
            raise ConnectionError("not yet")
        return v

    flow = (
        DFlow.from_call(name)
        .map(flaky)
        .id("flaky")
        .circuit(name, failures=2, cool_down=0.3)
        .retry(4, backoff=0.01)
    )
    assert flow.init(f"circuit-retry-{name}").call(7).result(10) == 7
    assert len(calls) == 3, "the third attempt failed fast: the dependency was not called"
    assert calls[2] - calls[1] >= 0.29, "the retry waited for the cool-down (the error's retry_after)"
    assert Circuit(name).state().state == "closed"


def test_only_the_failures_it_is_told_about_count_and_only_within_the_window() -> None:
    name = _name()

    def bad_input(v: int) -> int:
        raise ValueError("a bad argument is no outage")

    pipeline = (
        DFlow.from_call(name)
        .map(bad_input)
        .id("f")
        .circuit(name, failures=2, on=ConnectionError)
        .on_error_return(_outcome)
        .init(f"circuit-on-{name}")
    )
    assert [pipeline.call(i).result(10) for i in range(4)] == ["ValueError"] * 4
    assert Circuit(name).state().failures == 0

    breaker = Circuit(_name(), failures=3, window=0.2)
    for _ in range(2):
        with pytest.raises(ConnectionError), breaker:
            raise ConnectionError
    time.sleep(0.25)
    with pytest.raises(ConnectionError), breaker:
        raise ConnectionError
    assert (breaker.state().state, breaker.state().failures) == ("closed", 1)


def test_a_circuit_around_any_code() -> None:
    breaker = Circuit(_name(), failures=2, cool_down=30)

    async def call_model(prompt: str) -> str:
        raise TimeoutError(prompt)

    async def scenario() -> list[str]:
        out = []
        for _ in range(3):
            try:
                async with breaker:
                    out.append(await call_model("hi"))
            except (TimeoutError, CircuitOpenError) as exc:
                out.append(type(exc).__name__)
        try:
            await breaker.acall(call_model, "again")
        except CircuitOpenError:
            out.append("fast")
        return out

    assert asyncio.run(scenario()) == ["TimeoutError", "TimeoutError", "CircuitOpenError", "fast"]
    assert breaker.state().state == "open"
    healthy = Circuit(_name())
    assert healthy.call(lambda a, b: a + b, 2, b=3) == 5
    assert asyncio.run(healthy.acall(lambda: "sync in a thread")) == "sync in a thread"


def test_a_blocking_circuit_call_on_the_runtime_loop_names_the_async_form() -> None:
    name = _name()

    def sync_on_loop(v: int) -> int:
        return Circuit(name).call(lambda: v)

    run = DFlow.just(1).map(sync_on_loop).id("on-loop").init(f"circuit-on-loop-{name}").call(None)
    with pytest.raises(dflow.RunFailedError, match="async with circuit"):
        run.result(10)


def test_a_flow_built_at_run_time_may_carry_a_circuit() -> None:
    name = _name()

    def build(v: int) -> DFlow[int]:
        return DFlow.just(v).map(lambda x: x * 2).id("double").circuit(name)

    assert DFlow.direct_run(21, build).result(10) == 42


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DFlow.just(1).circuit("c"), "circuit applies to map and flat_map steps"),
        (lambda: DFlow.just(1).map(str).id("s").circuit("c", failures=0), "failures= is how many"),
        (lambda: DFlow.just(1).map(str).id("s").circuit("c", window=0), "window= is a number of seconds > 0"),
        (lambda: DFlow.just(1).map(str).id("s").circuit("c", cool_down=float("nan")), "cool_down="),
        (
            lambda: DFlow.just(1).map(str).id("s").circuit("c", on=(ValueError, 3)),
            "on= takes exception classes",
        ),  # type: ignore[arg-type]
        (lambda: DFlow.just(1).map(str).id("s").circuit("two words"), "a space"),
    ],
)
def test_bad_circuits_are_refused_when_the_flow_is_built(make: Any, message: str) -> None:
    with pytest.raises(BuildError, match=message):
        make()


def test_circuit_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="probe_lease="):
        Circuit("c", probe_lease=-1)
    with pytest.raises(TypeError, match="a Circuit name is a str"):
        Circuit(None)  # type: ignore[arg-type]
    assert "failures=5, window=30.0, cool_down=10.0" in repr(Circuit("c"))
    assert issubclass(CircuitOpenError, DFlowError)


def _until(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
