"""What a run did, read from its step records, and waiting for a condition."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import dflow
from dflow import StepStatus


def runs_of(trace_id: str) -> Iterator[list[dflow.StepRecord]]:
    """The step records of a run and of its branches, recursively."""
    steps = list(dflow.Run(trace_id).context().steps)
    yield steps
    for s in steps:
        if s.status is StepStatus.FORKED:
            for child in s.output:
                yield from runs_of(child)


def worker_pids(trace_id: str) -> set[int]:
    """The processes that ran the steps of a run and its branches (a worker id is ``host:pid:n``)."""
    return {int(s.worker.split(":")[1]) for steps in runs_of(trace_id) for s in steps if s.worker}


def wait_for(what: str, ok: Callable[[], bool], timeout: float) -> None:
    """Return once ``ok()``; fail, naming ``what``, after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.05)


def committed_tool_calls(trace_id: str) -> Counter[str]:
    """The tool calls of a run's committed tool steps, by tool name: each turn's step holds its
    calls' results (a list); a flow tool's step, its call's."""
    outputs = [
        s.output
        for steps in runs_of(trace_id)
        for s in steps
        if s.status is StepStatus.DONE and s.key.split(">")[0].split("/")[0] == "tool"
    ]
    return Counter(r["name"] for out in outputs for r in (out if isinstance(out, list) else [out]))
