"""The console's workers page (``/console/workers``) and its JSON (``/console/api/workers``)
over real sockets, on the in-memory runtime: the runtime of this process is listed with its
host, process and queues, the step it runs now (linking to its run) and its steps a second;
a beat from a worker of another process shows too, with what it runs; a page needs the login."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow
from dflow.client import _current
from dflow.server import ServerThread, create_app
from dflow.workers import StepNow, WorkerBeat
from tests.support.console import csrf_of, login

ADMIN = "admin-token-of-the-console-workers-tests-0123"
_release = threading.Event()  # (a module's: a step's function may not capture a lock)


def held(x: int) -> int:
    _release.wait(20)
    return x


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    with ServerThread(create_app(admin_token=ADMIN)) as base:
        yield base


@pytest.fixture
def browser(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        login(c, ADMIN)
        c.headers["X-DFlow-CSRF"] = csrf_of(c)
        yield c


def _worker(browser: httpx.Client, worker_id: str, running: bool, within: float = 15.0) -> dict[str, Any]:
    """The worker's entry in the JSON once it is there (running a step, when ``running``)."""
    deadline = time.monotonic() + within
    while True:
        listed = browser.get("/console/api/workers")
        assert listed.status_code == 200
        found = [w for w in listed.json()["workers"] if w["worker_id"] == worker_id]
        if found and bool(found[0]["running"]) == running:
            return found[0]
        assert time.monotonic() < deadline, f"worker {worker_id} not listed so: {listed.json()}"
        time.sleep(0.1)


def test_the_workers_page_lists_this_runtime_with_the_step_it_runs_linking_to_its_run(
    browser: httpx.Client, runtime: dflow.Runtime
) -> None:
    _release.clear()
    try:
        done = [DFlow.direct_run(i, lambda x: DFlow.just(x).map(lambda v: v + 1).id("inc")) for i in range(5)]
        assert [r.result(10) for r in done] == [1, 2, 3, 4, 5]
        run = DFlow.direct_run(7, lambda x: DFlow.just(x).map(held).id("held").in_thread())
        me = _worker(browser, runtime.worker_id, running=True)
        assert (me["host"], me["pid"], me["queues"]) == (socket.gethostname(), os.getpid(), [])
        assert [(s["trace_id"], s["key"]) for s in me["running"]] == [(run.trace_id, "held")]
        assert me["running_count"] == 1 and me["steps_per_second"] > 0 and me["beat"] >= me["started"]
        page = browser.get("/console/workers")
        assert page.status_code == 200
        row = re.search(
            rf'<tr class="worker-row" data-worker="{re.escape(runtime.worker_id)}">(.*?)</tr>', page.text
        )
        assert row is not None, page.text
        assert f'href="/console/runs/{run.trace_id}"' in row.group(
            1
        ) and f"step {me['running'][0]['seq']} held" in row.group(1)
        assert "every queue" in row.group(1) and socket.gethostname() in row.group(1)
        assert '<a href="/console/workers">Workers</a>' in browser.get("/console/").text, "the nav links it"
    finally:
        _release.set()
    assert run.result(10) == 7
    assert _worker(browser, runtime.worker_id, running=False)["running_count"] == 0


def test_a_beat_of_another_process_shows_on_the_page_with_what_it_runs_escaped(
    browser: httpx.Client,
) -> None:
    other = WorkerBeat(
        worker_id="box-9:<b>77</b>:1",
        host="box-9",
        pid=77,
        queues=("gpu",),
        started=time.time() - 600,
        beat=time.time(),
        running=(StepNow("run-of-box-9", 3, "embed"),),
        running_count=12,
        steps_per_second=4.25,
    )
    store = dflow.current_runtime().store
    _current().run(store.worker_beats.beat(other, 30))
    try:
        listed = _worker(browser, other.worker_id, running=True)
        assert listed == other.to_json()
        page = browser.get("/console/workers").text
        assert "box-9:&lt;b&gt;77&lt;/b&gt;:1" in page and "<b>77</b>" not in page
        assert 'href="/console/runs/run-of-box-9"' in page and "and 11 more" in page and "4.25" in page
    finally:
        _current().run(store.worker_beats.gone(other.worker_id))
    assert all(
        w["worker_id"] != other.worker_id for w in browser.get("/console/api/workers").json()["workers"]
    )


def test_the_workers_page_and_its_json_need_the_login(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as anon:
        page = anon.get("/console/workers")
        assert page.status_code == 303 and page.headers["location"].startswith("/console/login")
        assert anon.get("/console/api/workers").status_code == 401


def test_no_worker_alive_says_how_one_gets_listed() -> None:
    from dflow.server.console.workers_html import workers_page

    page = workers_page([], csrf="", logout=False)
    assert "No worker is alive" in page and "dflow worker" in page
    assert asyncio.run(_no_beats()) == []


async def _no_beats() -> list[WorkerBeat]:
    from dflow.workers import NO_WORKER_BEATS

    await NO_WORKER_BEATS.beat(WorkerBeat("w", "h", 1, (), 0.0, 0.0))
    return await NO_WORKER_BEATS.alive()
