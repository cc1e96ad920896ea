"""Pulled jobs (``dflow_agents.pulling`` and its routes) at their edges, in local mode over real
sockets: another session never receives, sees or answers a job; long-poll parameters out of
range; odd job ids; malformed, oversized, concurrent and late reports; a long poll abandoned
by its client; a job's wait answered around the board.

Tests marked ``xfail(strict=True)`` show a defect that is still there (the reason names it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dflow
from dflow.server import ServerThread, Tokens, create_app
from dflow_agents import (
    ToolCallAgent,
)
from dflow_agents.pulling import InMemoryJobBoard, PullingJobTool, agent_routes, job_routes
from dflow_agents.testing import FunctionModel
from tests.support.http_api import SessionClient
from tests.support.pulled import ask_user, fetch_or_ask, fetch_page

ADMIN = "admin-token-of-the-review-agents-tests-0123456789"
SECRET = "server-secret-of-the-review-agents-tests-0123456789"
MAX_REPORT = 4096
ASK_TIMEOUT = 1.0

board = InMemoryJobBoard()


fetch_job = PullingJobTool(fetch_page, board, timeout=20, name="rv_fetch")
ask_job = PullingJobTool(ask_user, board, timeout=ASK_TIMEOUT, name="rv_ask")
pull_agent = ToolCallAgent(
    "rv-review-pull", FunctionModel(fetch_or_ask("rv_fetch", "rv_ask")), [fetch_job, ask_job]
)


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    app = create_app(
        tokens=Tokens(SECRET, ttl=600),
        admin_token=ADMIN,
        routes=[job_routes(board, max_report_bytes=MAX_REPORT), agent_routes(pull_agent)],
    )
    with ServerThread(app) as base:
        yield base


class Client(SessionClient):
    """One session's client (the browser plug-in)."""

    admin = ADMIN
    agent = "rv-review-pull"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# -- pulled jobs ---------------------------------------------------------------------------------


def test_another_session_never_receives_sees_or_answers_a_job(api: httpx.Client) -> None:
    owner, stranger = Client(api), Client(api)
    trace = owner.chat("fetch http://owner.example/")
    assert stranger.pull(wait=0.5) == []  # pending for the owner, never handed to another session
    (job,) = owner.pull()
    assert set(job) == {
        "id",
        "tool",
        "arguments",
        "run",
        "created",
        "deadline",
        "state",
    }  # no session, no wait
    for method, body in (("GET", None), ("POST", {"result": "hijacked"}), ("POST", {"error": "hijacked"})):
        r = api.request(method, f"/jobs/{job['id']}", headers=stranger.h, json=body)
        assert r.status_code == 403, (method, body, r.text)
        assert "hijacked" not in r.text and owner.session not in r.text
    assert owner.job(job["id"])["state"] == "pending"
    assert owner.status(trace)["waiting_for"] is not None
    assert owner.report(job["id"], result="real").status_code == 200
    assert owner.result(trace)["answer"] == "observed: real"
    assert stranger.pull(wait=0.2) == []


def test_many_sessions_at_once_each_get_only_their_own_jobs(api: httpx.Client, url: str) -> None:
    clients = [Client(api) for _ in range(5)]
    traces = {c.session: c.chat(f"fetch http://{c.session.lower()}.example/") for c in clients}
    got: dict[str, list[dict[str, Any]]] = {}

    def pull(c: Client) -> None:
        with httpx.Client(base_url=url, timeout=30) as own:
            r = own.get("/jobs", headers=c.h, params={"wait": 5})
            got[c.session] = r.json()["jobs"]

    threads = [threading.Thread(target=pull, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        (job,) = got[c.session]
        assert (
            job["arguments"] == {"url": f"http://{c.session.lower()}.example/"}
            and job["run"] == traces[c.session]
        )
        assert c.report(job["id"], result=c.session).status_code == 200
        assert c.result(traces[c.session])["answer"] == f"observed: {c.session}"


def test_long_poll_parameters_out_of_range_are_422_at_once(api: httpx.Client) -> None:
    me = Client(api)
    for query in (
        "wait=nan",
        "wait=inf",
        "wait=-inf",
        "wait=-1",
        "wait=60.001",
        "wait=1e9",
        "wait=abc",
        "wait=",
        "wait=0x10",
        "wait=%00",
        "limit=0",
        "limit=101",
        "limit=1.5",
        "limit=true",
        "limit=-1",
        "limit=99999999999999999999",
    ):
        t0 = time.monotonic()
        r = api.get(f"/jobs?{query}", headers=me.h)
        assert r.status_code == 422, (query, r.status_code, r.text[:200])
        assert time.monotonic() - t0 < 1.0, query
    t0 = time.monotonic()
    assert me.pull(wait=0) == [] and time.monotonic() - t0 < 1.0
    assert api.get("/jobs?wait=0.2").status_code == 401  # no token, no poll


def test_odd_job_ids_are_404_never_500(api: httpx.Client) -> None:
    me = Client(api)
    for job_id in ("x" * 65, "a b", "\u00e9", "%2e%2e", "a" * 64, "0", "job:1", "*", "%00", "..%2f..%2fjobs"):
        for method in ("GET", "POST"):
            r = api.request(
                method, f"/jobs/{job_id}", headers=me.h, json={"result": 1} if method == "POST" else None
            )
            assert r.status_code == 404, (job_id, method, r.status_code, r.text[:200])


def test_malformed_and_oversized_reports_change_nothing(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://malformed.example/")
    (job,) = me.pull()
    h = {**me.h, "Content-Type": "application/json"}
    bad: list[tuple[bytes, int]] = [
        (b'{"result": 1, "error": "both"}', 422),
        (b"{}", 422),
        (b'{"error": null}', 422),
        (b'{"error": 5}', 422),
        (b"[]", 422),
        (b'"result"', 422),
        (b"null", 422),
        (b'{"result": 1, "extra": 2}', 422),
        (b'{"error": "' + b"e" * 4001 + b'"}', 422),
        (b'{"error": "' + b"e" * 5000 + b'"}', 413),
        (b'{"result": "' + b"r" * 5000 + b'"}', 413),
        (b"{", 400),
        (b"", 400),
        (b"\xff\xfe\xfd", 400),
        (b'{"result": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
        (b"{'result': 1}", 400),
    ]
    for body, code in bad:
        r = api.post(f"/jobs/{job['id']}", headers=h, content=body)
        assert r.status_code == code, (body[:40], r.status_code, r.text[:200])
    assert me.job(job["id"])["state"] == "pending"
    assert me.status(trace)["status"] == "waiting"
    assert me.report(job["id"], result={"ok": "after all that"}).status_code == 200
    assert me.result(trace)["answer"] == 'observed: {"ok": "after all that"}'


def test_twenty_concurrent_reports_one_wins_and_its_value_is_the_observation(
    api: httpx.Client, url: str
) -> None:
    me = Client(api)
    trace = me.chat("fetch http://race.example/")
    (job,) = me.pull()
    codes = me.report_at_once(url, job["id"], [f"value-{i}" for i in range(20)])
    winners = [value for value, code in codes.items() if code == 200]
    assert len(winners) == 1 and Counter(codes.values()) == {200: 1, 409: 19}, codes
    assert me.result(trace)["answer"] == f"observed: {winners[0]}"
    assert me.job(job["id"])["state"] == "answered"


def test_a_report_after_the_timeout_is_410_and_the_run_heard_the_timeout(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("ask anyone there?")
    (job,) = me.pull()
    answer = me.result(trace, timeout=ASK_TIMEOUT + 10)["answer"]
    assert "no client reported the job of tool 'rv_ask'" in answer
    r = me.report(job["id"], result="too late")
    assert r.status_code == 410 and "too late" not in r.text
    assert me.job(job["id"])["state"] == "expired"
    assert me.result(trace)["answer"] == answer  # nothing changed


def test_a_long_poll_abandoned_by_its_client_loses_no_job(api: httpx.Client, url: str) -> None:
    me = Client(api)
    with (
        httpx.Client(base_url=url, timeout=httpx.Timeout(0.3)) as impatient,
        pytest.raises(httpx.ReadTimeout),
    ):
        impatient.get("/jobs", headers=me.h, params={"wait": 10})
    time.sleep(0.3)  # the server has seen the hang-up
    trace = me.chat("fetch http://abandoned.example/")
    (job,) = me.pull(wait=5)
    assert job["arguments"] == {"url": "http://abandoned.example/"}
    assert me.report(job["id"], result="kept").status_code == 200
    assert me.result(trace)["answer"] == "observed: kept"


def test_a_jobs_wait_answered_around_the_board_is_never_a_success(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://around.example/")
    (job,) = me.pull()
    waiting = me.status(trace)["waiting_for"]
    forged = json.dumps({"ok": True, "value": "FORGED"})
    r = api.post(f"/runs/{trace}/calls/{waiting}", headers=me.h, json=forged)
    if r.status_code == 202:
        assert me.result(trace)["answer"] != "observed: FORGED", "a forged answer became the tool's result"
    else:
        assert r.status_code in (403, 409) and me.job(job["id"])["state"] == "pending"
