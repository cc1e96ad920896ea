"""What went wrong in a step reaches the log: a failed step, a retry, a run that failed or
was compensated, each line naming the run, the step, the attempt and the error's first
line, its traceback at DEBUG; in text and in JSON."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator

import pytest

import dflow
from dflow import DFlow
from dflow.context import StepRecord, StepStatus
from dflow.ops.failure_logs import log_commit
from dflow.ops.logs import JsonFormatter
from dflow.runtime import Runtime
from dflow.store import Advance, Claim
from dflow.wire.values import Message


class Lines:
    """What ``dflow.runtime`` logs, as text and as JSON lines."""

    def __init__(self) -> None:
        self.text, self.json = io.StringIO(), io.StringIO()
        self.handlers = [logging.StreamHandler(self.text), logging.StreamHandler(self.json)]
        self.handlers[0].setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        self.handlers[1].setFormatter(JsonFormatter())

    def of(self, trace_id: str) -> list[str]:
        return [line for line in self.text.getvalue().splitlines() if trace_id in line]

    def objects(self, trace_id: str) -> list[dict[str, object]]:
        found = [json.loads(line) for line in self.json.getvalue().splitlines()]
        return [o for o in found if o.get("run") == trace_id]


@pytest.fixture
def lines(local: Runtime) -> Iterator[Lines]:
    out = Lines()
    logger = logging.getLogger("dflow.runtime")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    for h in out.handlers:
        logger.addHandler(h)
    yield out
    for h in out.handlers:
        logger.removeHandler(h)
    logger.setLevel(level)


def _name() -> str:
    return f"fl-{uuid.uuid4().hex[:6]}"


def _boom(x: int) -> int:
    raise ValueError(f"no stock for item {x}\nsecond line of detail")


def test_a_failed_run_logs_its_step_at_warning_and_its_end_at_error_with_the_traceback_at_debug(
    lines: Lines,
) -> None:
    run = DFlow.from_call("go").map(_boom).id("reserve").init(_name()).call(7)
    with pytest.raises(dflow.RunFailedError):
        run.result(5)
    mine = lines.of(run.trace_id)
    assert (
        f"WARNING dflow: step reserve of run {run.trace_id} failed (attempt 1): ValueError: no stock for item 7 ..."
        in mine
    )
    assert (
        f"ERROR dflow: run {run.trace_id} failed at step reserve (attempt 1): ValueError: no stock for item 7 ..."
        in mine
    )
    assert "second line of detail" not in "\n".join(m for m in mine if not m.startswith("DEBUG"))
    assert "Traceback (most recent call last)" in lines.text.getvalue(), "the traceback, at DEBUG"
    objs = lines.objects(run.trace_id)
    levels = {(o["level"], o["step"], o["attempt"]) for o in objs}
    assert ("WARNING", "reserve", 0) in levels and ("ERROR", "reserve", 0) in levels
    assert any(o["level"] == "DEBUG" and "Traceback" in str(o["message"]) for o in objs)


def test_each_retry_is_logged_with_its_attempt_and_its_wait(lines: Lines) -> None:
    run = (
        DFlow.from_call("go")
        .map(_boom)
        .id("reserve")
        .retry(3, backoff=0.01, jitter=False)
        .init(_name())
        .call(1)
    )
    with pytest.raises(dflow.RunFailedError):
        run.result(5)
    retries = [line for line in lines.of(run.trace_id) if "retrying in" in line]
    assert [r.split("(attempt ")[1][0] for r in retries] == ["1", "2"], retries  # (text: counted from 1)
    assert all(r.startswith("WARNING") and r.endswith("ValueError: no stock for item 1 ...") for r in retries)
    assert [o["attempt"] for o in lines.objects(run.trace_id) if "retrying" in str(o["message"])] == [
        0,
        1,
    ]  # (ids: from 0)
    assert any(f"run {run.trace_id} failed at step reserve (attempt 3)" in x for x in lines.of(run.trace_id))


def _charge(x: int) -> int:
    return x


def _refund(x: int) -> None:
    return None


def test_a_compensated_run_logs_that_its_compensations_run_and_that_it_was_compensated(lines: Lines) -> None:
    run = (
        DFlow.from_call("go")
        .map(_charge)
        .id("charge")
        .compensate(_refund)
        .map(_boom)
        .id("ship")
        .init(_name())
        .call(3)
    )
    with pytest.raises(dflow.RunCompensatedError):
        run.result(5)
    mine = lines.of(run.trace_id)
    assert any(
        m.startswith("WARNING") and "failed at step ship; its compensations run: ValueError" in m
        for m in mine
    ), mine
    assert any(
        m.startswith("WARNING") and "was compensated after step ship failed: ValueError" in m for m in mine
    ), mine
    assert not any(m.startswith("ERROR") for m in mine), "a compensated run is no error of the worker's"


def test_a_step_an_error_handler_recovers_is_logged_as_recovered(lines: Lines) -> None:
    run = DFlow.from_call("go").map(_boom).id("reserve").on_error_return(lambda e: -1).init(_name()).call(2)
    assert run.result(5) == -1
    mine = lines.of(run.trace_id)
    assert any("failed (attempt 1); an error handler recovered: ValueError" in m for m in mine), mine
    assert not any(m.startswith("ERROR") for m in mine)


def test_a_retrys_wait_is_reckoned_on_the_runtime_clock_not_the_system_clock(lines: Lines) -> None:
    # (a runtime on a FakeClock stamps its records and due times with that clock's time, far
    # from the system's: the wait logged is the one the retry will take, 30 s)
    message = Message("fake-clock-run", 3, "reserve", 1)
    claim = Claim(message=message, token="t", frames=None, value=b"", data={})
    record = StepRecord(
        key="reserve",
        seq=3,
        status=StepStatus.RETRYING,
        attempt=1,
        started=1_000.0,
        duration=0.5,
        error={"type": "ValueError", "message": "no stock"},
    )
    log_commit(claim, [record], {}, Advance(frames=None, value=b"", message=message, at=1_030.5))
    assert lines.of("fake-clock-run") == [
        "WARNING dflow: step reserve of run fake-clock-run failed (attempt 2); retrying in 30.0s: ValueError: no stock"
    ]
