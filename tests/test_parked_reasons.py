"""A client learns why its run does not finish when its step is parked (a worker took it
and could not run it: here, its flow is signed with a key the worker lacks): the timeout of
``result()`` says so and why, ``RunInfo.parked`` holds the reason, and the console's runs
list marks it and can show the parked runs alone."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow, Run, RunStatus
from dflow.memory.store import MemoryStore, MemoryTransport
from dflow.model import registry
from dflow.runtime import Runtime
from dflow.runtime.process import _current
from dflow.server import ServerThread, create_app
from tests.support.console import csrf_of, login

ADMIN = "admin-token-of-the-parked-tests-0123456789"


@pytest.fixture
def other_key() -> Iterator[None]:
    """This process starts runs with one key; the only worker has another."""
    transport = MemoryTransport()
    store = MemoryStore(transport=transport)
    dflow.configure(transport, store, consume=False, secret=os.urandom(32), poll_interval=0.05)
    worker = Runtime(transport, store, secret=os.urandom(32), poll_interval=0.05, deadlock_interval=None)
    host = _current()
    host.thread.submit(worker.start()).result(5)
    yield
    host.thread.submit(worker.stop(1)).result(10)
    dflow.shutdown()


def _parked_run() -> Run[Any]:
    run = DFlow.from_call("go").map(lambda x: x + 1).id("inc").init(f"pk-{uuid.uuid4().hex[:6]}").call(1)
    deadline = time.monotonic() + 10
    while run.info().parked is None:
        assert time.monotonic() < deadline, "the step was not parked"
        time.sleep(0.02)
    return run


@pytest.mark.usefixtures("other_key")
def test_the_timeout_of_a_parked_runs_result_says_it_is_parked_and_why() -> None:
    run = _parked_run()
    with pytest.raises(dflow.RunTimeoutError) as caught:
        run.result(0.3)
    text = str(caught.value)
    assert f"run {run.trace_id!r} did not finish within 0.3s; run {run.trace_id!r} is parked" in text, text
    assert "signed with a key" in text, text
    assert run.status() is RunStatus.RUNNING
    assert "signed with a key" in (run.info().parked or "")


@pytest.mark.usefixtures("other_key")
def test_the_runs_list_marks_parked_runs_and_shows_them_alone_when_asked() -> None:
    parked = _parked_run()
    ended = _parked_run()
    ended.cancel("not needed")
    assert ended.info().parked is None, "a run that ended is parked no more"
    with ServerThread(create_app(admin_token=ADMIN)) as url, httpx.Client(base_url=url, timeout=30) as api:
        login(api, ADMIN)
        api.headers["X-DFlow-CSRF"] = csrf_of(api)
        everything = api.get("/console/").text
        assert parked.trace_id in everything and ended.trace_id in everything
        assert '<span class="badge st-failed">parked</span>' in everything
        only = api.get("/console/", params={"parked": "1"}).text
        assert parked.trace_id in only and ended.trace_id not in only
        assert "parked: " in only and "signed with a key" in only
        assert 'name="parked" value="1" checked' in only
        listed = api.get("/console/api/runs", params={"parked": "1"}).json()["runs"]
        assert [r["trace_id"] for r in listed] == [parked.trace_id]
        assert "signed with a key" in listed[0]["parked"]
        bad = api.get("/console/api/runs", params={"parked": "maybe"})
        assert bad.status_code == 422 and "parked is 1" in bad.text


def _pause(x: int) -> DFlow[int]:
    return DFlow.delay(x, 0.3)


def _orders(name: str, step_id: str) -> Any:
    return DFlow.from_call("go").flat_map(_pause).id("pause").map(lambda x: x).id(step_id).init(name)


def _forget(pipeline: Any) -> None:
    """This process no longer builds ``pipeline`` (as a worker deployed with other code)."""
    head = pipeline._chain.keys[0]
    registry._pipelines.pop(head, None)
    for ref in (registry.static_ref(head), "p:" + head):
        registry._by_ref.pop(ref, None)


def test_a_step_parked_after_an_id_rename_names_the_pipeline_the_step_and_the_ids_that_differ(
    local: Runtime,
) -> None:
    name = f"orders-{uuid.uuid4().hex[:6]}"
    before = _orders(name, "reserve")
    run = before.call(1)  # its next step, after the pause, is 'reserve' of the pipeline as built now
    _forget(before)
    _orders(name, "reserve-v2")  # the code deployed meanwhile
    deadline = time.monotonic() + 10
    while (note := run.info().parked) is None:
        assert time.monotonic() < deadline, "the step was not parked"
        time.sleep(0.02)
    assert note == (
        f"step 'delay/pause' (key 'delay/pause>reserve') of pipeline {name!r}: the pipeline {name!r} built in this worker "
        "differs from the one that started the run: the run's flow has the ids 'reserve' where the pipeline "
        "built here has 'reserve-v2' (ids renamed since the run started? deploy the same modules on every worker)"
    )
    assert "p:" not in note


def test_a_step_of_a_pipeline_not_built_here_names_the_pipelines_that_are() -> None:
    note = registry.missing_flow_note("billing", "charge>mail")
    assert note.startswith(
        "step 'charge' (key 'charge>mail') of pipeline 'billing': no pipeline named 'billing' is built in "
        "this worker (it builds "
    ), note
    assert note.endswith("); import the module that builds it")
