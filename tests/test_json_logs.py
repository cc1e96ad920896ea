"""The JSON log lines of workers: one object a line, the run and step on the lines of a step."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from dflow import DFlow
from dflow.ops.logs import JsonFormatter, StepLogContext, current_step
from dflow.runtime import Runtime
from dflow.store import Claim

log = logging.getLogger("tests.json_logs")


@pytest.fixture
def lines(local: Runtime) -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter({"worker": "w-1"}))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    local.add_observer(StepLogContext())
    yield out
    log.removeHandler(handler)


def _say(x: int) -> int:
    log.info("step sees %s\nacross lines", x)
    return x


async def _say_async(x: int) -> int:
    log.warning("async step sees %s", x)
    return x


def test_lines_logged_in_steps_carry_their_run_and_step(lines: io.StringIO) -> None:
    run = (
        DFlow.from_call("go")
        .map(_say)
        .id("say")
        .map(_say_async)
        .id("later")
        .init(f"j-{uuid.uuid4().hex[:6]}")
        .call(5)
    )
    assert run.result(5) == 5
    log.info("outside")
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert [r["message"] for r in records] == ["step sees 5\nacross lines", "async step sees 5", "outside"]
    first, second, outside = records
    assert (first["run"], first["step"], first["seq"], first["attempt"]) == (run.trace_id, "say>later", 1, 0)
    assert (second["run"], second["step"], second["seq"], second["level"]) == (
        run.trace_id,
        "later",
        2,
        "WARNING",
    )
    assert "run" not in outside and outside["worker"] == "w-1" and outside["logger"] == "tests.json_logs"
    assert current_step() is None  # reset after each step


def test_extra_ids_exceptions_and_the_step_context_reset() -> None:
    formatter = JsonFormatter()
    try:
        raise KeyError("k")
    except KeyError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("it",), exc_info=True)
        import sys

        record.exc_info = sys.exc_info()
    record.dflow_run = "r1"
    record.dflow_step = "a>b"
    out = json.loads(formatter.format(record))
    assert out["run"] == "r1" and out["step"] == "a>b" and out["message"] == "failed it"
    assert "KeyError: 'k'" in out["exception"] and out["time"].endswith("+00:00")

    from dflow.wire.values import Message

    observer = StepLogContext()
    claim = Claim(Message("r2", 3, "k>l", 1), "token", None, b"", {})
    token = observer.started(claim, "p", "k")
    assert current_step() == ("r2", "k>l", 3, 1)
    observer.aborted(token, RuntimeError("store down"))
    assert current_step() is None
    started = time.time()
    assert json.loads(formatter.format(logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)))[
        "time"
    ][:4] == time.strftime("%Y", time.gmtime(started))


def test_steps_run_in_a_thread_log_with_their_ids(lines: io.StringIO) -> None:
    run = DFlow.from_call("go").map(_say).id("threaded").in_thread().init(f"j-{uuid.uuid4().hex[:6]}").call(7)
    assert run.result(5) == 7
    (record,) = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert (record["run"], record["step"], record["seq"]) == (run.trace_id, "threaded", 1)
