"""PullingJobTool and the job routes, in one process (local mode, the server on a real socket):
a tool call becomes a job for the run's session, pulled with a long poll and reported over
HTTP; the timeout; one session never sees or answers another's jobs (nor its events);
expired tokens; garbage, oversized, repeated and concurrent reports change nothing; the long
polls a server holds, per session and in all; a job's wait and timer kept out of the
generic routes, and a run squatting a job timer's id."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import dflow
import dflow.server
import dflow_agents.pulling
from dflow import DFlow
from dflow.server import ServerThread, Tokens, create_app
from dflow.server.runs import start_in_session
from dflow_agents import ToolCallAgent
from dflow_agents._jobboard import timer_trace
from dflow_agents.pulling import (
    SESSION_KEY,
    InMemoryJobBoard,
    Job,
    PullingJobTool,
    agent_routes,
    job_routes,
    pulling_tool,
)
from dflow_agents.testing import FunctionModel
from tests.support.http_api import SessionClient
from tests.support.pulled import ask_user, fetch_or_ask

ADMIN = "admin-token-of-the-pulling-tests-0123456789"
SECRET = "server-secret-of-the-pulling-tests-0123456789"
MAX_REPORT = 4096

board = InMemoryJobBoard()


@pulling_tool(board, timeout=20, name="open_page")
def fetch_page(url: str) -> str:
    """Fetch a page in the user's browser and return its text.

    Args:
        url: the page's address
    """


ask = PullingJobTool(ask_user, board, timeout=0.5, name="ask_person")
agent = ToolCallAgent("pull-agent", FunctionModel(fetch_or_ask("open_page", "ask_person")), [fetch_page, ask])
squat = DFlow.from_call("pull-squat").map(lambda x: x).id("squatting").init("pull-squat")


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens(SECRET, ttl=600)


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime, tokens: Tokens) -> Iterator[str]:
    app = create_app(
        tokens=tokens,
        admin_token=ADMIN,
        routes=[job_routes(board, max_report_bytes=MAX_REPORT), agent_routes(agent)],
    )
    with ServerThread(app) as base:
        yield base


class Client(SessionClient):
    """One session's client (the browser plug-in)."""

    admin = ADMIN
    agent = "pull-agent"


def test_a_pulled_job_resumes_the_run_with_the_clients_result(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://shop.example/a")
    (job,) = me.pull()
    assert job["tool"] == "open_page" and job["arguments"] == {"url": "http://shop.example/a"}
    assert job["run"] == trace and job["state"] == "pending" and job["deadline"] > time.time() + 15
    assert me.status(trace)["status"] == "waiting"  # parked: no worker holds it
    r = me.report(job["id"], result="<h1>A shop</h1>")
    assert r.status_code == 200 and r.json() == {"id": job["id"], "state": "answered"}
    result = me.result(trace)
    assert result["status"] == "finished" and result["answer"] == "observed: <h1>A shop</h1>"
    assert result["session"] == me.session  # the agent's memory session is the client's session
    assert me.job(job["id"])["state"] == "answered"
    assert me.pull(wait=0) == []  # handed out once


def test_a_long_poll_returns_as_soon_as_a_job_is_posted(api: httpx.Client, url: str) -> None:
    me = Client(api)
    got: list[list[dict[str, Any]]] = []
    returned: list[float] = []

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=30) as other:
            got.append(other.get("/jobs", headers=me.h, params={"wait": 20}).json()["jobs"])
            returned.append(time.monotonic())

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)  # the poll is waiting
    posted = time.monotonic()
    trace = me.chat("fetch http://b")
    t.join(10)
    assert len(got[0]) == 1 and got[0][0]["arguments"] == {"url": "http://b"}
    assert posted < returned[0] < posted + 5, "the poll waited for the job, and returned with it"
    assert me.report(got[0][0]["id"], result="B").status_code == 200
    assert me.result(trace)["answer"] == "observed: B"


def test_a_job_not_reported_in_time_resumes_the_run_with_a_timeout(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("ask favourite colour?")
    (job,) = me.pull()
    assert job["tool"] == "ask_person"
    result = me.result(trace)
    assert result["status"] == "finished"
    assert "JobTimeoutError" in result["answer"] and "within 0.5 s" in result["answer"]
    late = me.report(job["id"], result="blue")
    assert late.status_code == 410 and "deadline" in late.json()["detail"]
    assert me.job(job["id"])["state"] == "expired"
    assert me.result(trace) == result  # the late report changed nothing


def test_another_session_never_sees_or_answers_the_job_nor_the_runs_events(api: httpx.Client) -> None:
    me, them = Client(api), Client(api)
    trace = me.chat("fetch http://private")
    deadline = time.monotonic() + 5
    while not (jobs := board._queues.get(me.session)):  # noqa: F841 - posted (without pulling it)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert them.pull(wait=0.3) == []
    job_id = next(iter(board._queues[me.session]))
    assert api.get(f"/jobs/{job_id}", headers=them.h).status_code == 403
    r = them.report(job_id, result="forged")
    assert r.status_code == 403 and "another session" in r.json()["detail"]
    assert api.get(f"/runs/{trace}/events", headers=them.h).status_code == 403
    assert api.get(f"/runs/{trace}", headers=them.h).status_code == 403
    (job,) = me.pull()
    assert job["id"] == job_id and job["state"] == "pending"  # nothing changed
    assert me.report(job_id, result="mine").status_code == 200
    assert me.result(trace)["answer"] == "observed: mine"


def test_an_expired_token_is_401_on_the_job_routes(api: httpx.Client, tokens: Tokens) -> None:
    me = Client(api)
    trace = me.chat("fetch http://c")
    (job,) = me.pull()
    expired = tokens.issue(me.session, 60, now=time.time() - 61)[0]
    h = {"Authorization": f"Bearer {expired}"}
    for r in (
        api.get("/jobs", headers=h),
        api.get(f"/jobs/{job['id']}", headers=h),
        api.post(f"/jobs/{job['id']}", headers=h, json={"result": "x"}),
        api.get(f"/runs/{trace}/events", headers=h),
    ):
        assert r.status_code == 401 and "expired" in r.json()["detail"]
    assert api.get("/jobs", headers={"Authorization": "Bearer garbage"}).status_code == 401
    assert api.get("/jobs").status_code == 401
    assert me.job(job["id"])["state"] == "pending"
    assert me.report(job["id"], result="C").status_code == 200
    assert me.result(trace)["answer"] == "observed: C"


def test_garbage_and_oversized_reports_are_refused_and_change_nothing(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://d")
    (job,) = me.pull()
    path = f"/jobs/{job['id']}"
    json_h = {**me.h, "Content-Type": "application/json"}
    refused = {
        "not json": (api.post(path, headers=json_h, content=b"{oops"), 400),
        "empty": (api.post(path, headers=me.h), 400),
        "a list": (api.post(path, headers=me.h, json=[1, 2]), 422),
        "no field": (api.post(path, headers=me.h, json={}), 422),
        "both": (api.post(path, headers=me.h, json={"result": 1, "error": "x"}), 422),
        "error not text": (api.post(path, headers=me.h, json={"error": 5}), 422),
        "error null": (api.post(path, headers=me.h, json={"error": None}), 422),
        "unknown field": (api.post(path, headers=me.h, json={"result": 1, "extra": 2}), 422),
        "oversized": (api.post(path, headers=me.h, json={"result": "x" * MAX_REPORT}), 413),
        "NaN": (api.post(path, headers=json_h, content=b'{"result": NaN}'), 400),
        "Infinity": (api.post(path, headers=json_h, content=b'{"result": [1, -Infinity]}'), 400),
        "sent as text": (
            api.post(path, headers={**me.h, "Content-Type": "text/plain"}, content=b'{"result": 1}'),
            415,
        ),
        "unknown job": (api.post("/jobs/0123456789abcdef", headers=me.h, json={"result": 1}), 404),
        "bad job id": (api.post("/jobs/..%2F..", headers=me.h, json={"result": 1}), 404),
    }
    for what, (r, status) in refused.items():
        assert r.status_code == status, (what, r.status_code, r.text)
        assert r.json()["detail"], what
    assert me.job(job["id"])["state"] == "pending" and me.status(trace)["status"] == "waiting"
    assert me.report(job["id"], result="D").status_code == 200
    assert me.result(trace)["answer"] == "observed: D"


def test_a_second_report_is_409_and_the_first_stands(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://e")
    (job,) = me.pull()
    assert me.report(job["id"], result="first").status_code == 200
    again = me.report(job["id"], result="second")
    assert again.status_code == 409 and "reported already" in again.json()["detail"]
    assert me.result(trace)["answer"] == "observed: first"


def test_two_concurrent_reports_one_wins(api: httpx.Client, url: str) -> None:
    me = Client(api)
    trace = me.chat("fetch http://f")
    (job,) = me.pull()
    codes = me.report_at_once(url, job["id"], ["left", "right"])
    assert sorted(codes.values()) == [200, 409]
    winner = next(v for v, c in codes.items() if c == 200)
    assert me.result(trace)["answer"] == f"observed: {winner}"


def test_a_clients_error_is_a_failed_observation(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://blocked")
    (job,) = me.pull()
    assert me.report(job["id"], error="the page is behind a login").status_code == 200
    answer = me.result(trace)["answer"]
    assert (
        "Error: tool 'open_page' failed" in answer and "JobFailedError: the page is behind a login" in answer
    )


def test_two_jobs_of_one_turn_are_pulled_together_and_answered_in_any_order(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://one http://two")
    jobs: list[dict[str, Any]] = []
    while len(jobs) < 2:
        jobs += me.pull()
    by_url = {j["arguments"]["url"]: j for j in jobs}
    assert me.report(by_url["http://two"]["id"], result="TWO").status_code == 200
    assert me.status(trace)["status"] == "waiting"  # the turn waits for both
    assert me.report(by_url["http://one"]["id"], result="ONE").status_code == 200
    assert me.result(trace)["answer"] == "observed: ONE | TWO"  # in call order


def test_a_run_without_a_session_hears_so_at_once(url: str) -> None:
    t0 = time.monotonic()
    result = agent.run("fetch http://nowhere").result(10)  # started in process, not through the server
    assert time.monotonic() - t0 < 5  # not the tool's 20 s timeout
    assert "the run has no session" in result.answer and "dflow serve" in result.answer


def test_a_report_for_a_cancelled_run_is_409(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://g")
    (job,) = me.pull()
    assert api.post(f"/runs/{trace}/cancel", headers=me.h).status_code == 200
    r = me.report(job["id"], result="too late")
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
    assert me.status(trace)["status"] == "cancelled"


# -- the board and the tool, as objects -------------------------------------------------------


def _job(job_id: str, session: str = "s1", deadline: float | None = None) -> Job:
    now = time.time()
    return Job(
        id=job_id,
        tool="t",
        arguments={},
        session=session,
        run="r",
        trace="r/1-0",
        call_type="c",
        created=now,
        deadline=now + 30 if deadline is None else deadline,
    )


def test_the_in_memory_board_posts_hands_out_and_settles_each_job_once() -> None:
    import asyncio

    async def main() -> None:
        b = InMemoryJobBoard()
        assert await b.post(_job("a")) and not await b.post(_job("a"))  # posted once
        await b.post(_job("gone", deadline=time.time() - 1))
        assert [j.id for j in await b.pull("s1", wait=0, limit=10)] == [
            "a"
        ]  # past its deadline: not handed out
        assert await b.pull("s1", wait=0, limit=10) == []  # handed out once
        assert await b.pull("s2", wait=0, limit=10) == []  # nor to another session
        assert await b.settle("a", "answered") and not await b.settle("a", "expired")
        got = await b.get("a")
        assert got is not None and got.state == "answered"
        gone = await b.get("gone")
        assert gone is not None and gone.state == "pending" and gone.public()["state"] == "expired"
        assert await b.get("zzz") is None and not await b.settle("zzz", "answered")

    asyncio.run(main())


def test_a_pull_on_one_loop_wakes_on_a_post_from_another_thread() -> None:
    import asyncio

    b = InMemoryJobBoard()

    async def pull() -> tuple[list[Job], float]:
        t0 = time.monotonic()
        jobs = await b.pull("s1", wait=10, limit=5)
        return jobs, time.monotonic() - t0

    def post_later() -> None:
        time.sleep(0.2)
        asyncio.run(b.post(_job("x")))

    t = threading.Thread(target=post_later)
    t.start()
    jobs, waited = asyncio.run(pull())
    t.join()
    assert [j.id for j in jobs] == ["x"] and 0.15 < waited < 5


def test_the_tool_is_described_by_its_signature_and_checks_its_arguments() -> None:
    assert fetch_page.is_flow and fetch_page.name == "open_page"
    assert fetch_page.spec.parameters["required"] == ["url"]
    assert fetch_page.description == "Fetch a page in the user's browser and return its text."
    assert "pulling tool" in repr(fetch_page)
    with pytest.raises(ValueError, match="timeout"):
        PullingJobTool(ask_user, board, timeout=0)
    with pytest.raises(TypeError, match="JobBoard"):
        PullingJobTool(ask_user, object(), timeout=1)  # type: ignore[arg-type]
    bad = fetch_page.flow({"url": 5})
    assert not isinstance(bad, DFlow) and "url" in bad.observation  # validated before any job


def test_the_session_key_is_the_servers() -> None:
    assert SESSION_KEY == dflow.server.SESSION_KEY


def test_the_job_timers_are_not_served_and_their_ids_cannot_be_chosen(api: httpx.Client) -> None:
    me = Client(api)
    names = [p["name"] for p in api.get("/pipelines", headers=me.h).json()["pipelines"]]
    assert "agent.pull-agent" in names and not [n for n in names if n.startswith("_")]
    r = api.post("/runs", headers=me.h, json={"pipeline": "_dflow_agents.job-timer:fetch_page"})
    assert r.status_code == 404
    # a run of its own under a job timer's id would keep that timer from being started
    for trace in (timer_trace("0" * 32), "dflow-job-timer.x"):
        r = api.post(
            "/runs",
            headers=me.h,
            json={"pipeline": "agent.pull-agent", "param": {"query": "ask"}, "trace_id": trace},
        )
        assert r.status_code == 422 and "reserved" in r.json()["detail"], r.text
        assert api.get(f"/runs/{trace}", headers=me.h).status_code == 404


def test_a_jobs_wait_is_answered_through_the_job_board_only(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://around")
    (job,) = me.pull()  # a single call waits in the run itself
    waiting = me.status(trace)["waiting_for"]
    assert waiting == f"dflow_agents.job:open_page:{job['id']}"  # each job waits under a call type of its own
    for call_type in (waiting, "dflow_agents.job:open_page", "dflow_agents.job:"):
        r = api.post(f"/runs/{trace}/calls/{call_type}", headers=me.h, json='{"ok": true, "value": "FORGED"}')
        assert r.status_code == 403 and "POST /jobs/{id}" in r.json()["detail"], r.text
    assert me.job(job["id"])["state"] == "pending" and me.status(trace)["waiting_for"] == waiting
    # code in the process may still answer the wait directly: what it says is no report
    DFlow.call(waiting, {"forged": True}, trace)
    assert "not through the job board" in me.result(trace)["answer"]
    assert me.report(job["id"], result="late").status_code == 409  # the run no longer waits


def test_the_timer_of_an_answered_job_changes_nothing(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("ask shoe size?")
    (job,) = me.pull()
    assert me.report(job["id"], result="42").status_code == 200
    result = me.result(trace)
    assert result["answer"] == "observed: 42"
    time.sleep(0.8)  # past the job's 0.5 s deadline: its timer was cancelled, or fired and found it answered
    assert me.job(job["id"])["state"] == "answered" and me.result(trace) == result


def test_answer_job_is_the_report_for_python_clients(api: httpx.Client) -> None:
    import asyncio

    from dflow_agents.pulling import JobAnsweredError, JobForbiddenError, JobNotFoundError, answer_job

    me = Client(api)
    trace = me.chat("fetch http://py")
    (job,) = me.pull()
    with pytest.raises(JobForbiddenError):
        asyncio.run(answer_job(board, "someone-else", job["id"], result="x"))
    with pytest.raises(JobNotFoundError):
        asyncio.run(answer_job(board, me.session, "f" * 32, result="x"))
    done = asyncio.run(answer_job(board, me.session, job["id"], result={"title": "Py"}))
    assert done.state == "answered" and done.run == trace
    with pytest.raises(JobAnsweredError):
        asyncio.run(answer_job(board, me.session, job["id"], result="again"))
    assert me.result(trace)["answer"] == 'observed: {"title": "Py"}'


def test_a_run_started_through_the_server_cannot_use_another_sessions_memory(api: httpx.Client) -> None:
    mine, other = Client(api), Client(api)
    r = api.post(
        "/runs",
        headers=mine.h,
        json={"pipeline": "agent.pull-agent", "param": {"query": "ask hi", "session": other.session}},
    )
    assert r.status_code == 201, r.text
    trace = r.json()["trace_id"]
    deadline = time.monotonic() + 10
    while not (st := mine.status(trace))["finished"]:
        assert time.monotonic() < deadline, st
        time.sleep(0.01)
    assert (
        st["status"] == "failed"
        and "PermissionError" in str(st["error"])
        and other.session in str(st["error"])
    )
    r = api.post(
        "/runs",
        headers=mine.h,
        json={"pipeline": "agent.pull-agent", "param": {"query": "ask hi", "session": mine.session}},
    )
    assert r.status_code == 201, r.text
    (job,) = mine.pull()
    assert mine.report(job["id"], result="yes").status_code == 200
    assert "yes" in str(mine.result(r.json()["trace_id"]))


def test_long_polls_are_capped_per_session_and_in_all(url: str) -> None:
    polls_board = InMemoryJobBoard()
    app = create_app(
        tokens=Tokens(SECRET, ttl=600),
        admin_token=ADMIN,
        routes=[job_routes(polls_board, max_polls_per_session=2, max_polls=3)],
    )
    with ServerThread(app) as base, httpx.Client(base_url=base, timeout=30) as api:
        a, b, c = Client(api), Client(api), Client(api)
        got: dict[str, tuple[int, list[str]]] = {}

        def poll(who: Client, key: str) -> None:
            with httpx.Client(base_url=base, timeout=30) as own:
                r = own.get("/jobs", headers=who.h, params={"wait": 20})
                got[key] = (r.status_code, [j["id"] for j in r.json()["jobs"]])

        threads = [threading.Thread(target=poll, args=args) for args in ((a, "a1"), (a, "a2"), (b, "b"))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10

        def waiting(session: str) -> int:
            return len(polls_board._waiters.get(session, []))  # the polls waiting on the board

        while (waiting(a.session), waiting(b.session)) != (2, 1):
            assert time.monotonic() < deadline, got
            time.sleep(0.01)
        r = api.get("/jobs", headers=c.h, params={"wait": 5})
        assert r.status_code == 429 and "holds 3 long polls, its limit" in r.json()["detail"], r.text
        assert r.headers["retry-after"]
        r = api.get("/jobs", headers=a.h, params={"wait": 5})
        assert r.status_code == 429 and "this session has 2 long polls open" in r.json()["detail"]
        for who in (a, c):  # a poll that does not wait is never refused
            assert api.get("/jobs", headers=who.h, params={"wait": 0}).json() == {"jobs": []}
        for n, (session, _key) in enumerate(((a.session, "a"), (a.session, "a"), (b.session, "b"))):
            asyncio.run(polls_board.post(_job(f"job-{n}", session=session)))
            while len(got) < n + 1:
                assert time.monotonic() < deadline, got
                time.sleep(0.01)
        for t in threads:
            t.join()
        assert got == {"a1": got["a1"], "a2": got["a2"], "b": (200, ["job-2"])}
        assert sorted([got["a1"], got["a2"]]) == [(200, ["job-0"]), (200, ["job-1"])]
        # every slot is free again, also those of polls whose client hung up
        with httpx.Client(base_url=base, timeout=httpx.Timeout(0.3)) as impatient:
            for _ in range(2):
                with pytest.raises(httpx.ReadTimeout):
                    impatient.get("/jobs", headers=a.h, params={"wait": 10})
        time.sleep(0.3)  # the server has seen the hang-ups
        for who in (a, a, b, c):
            r = api.get("/jobs", headers=who.h, params={"wait": 0.05})
            assert r.status_code == 200, r.text
    with pytest.raises(ValueError, match="max_polls_per_session"):
        job_routes(polls_board, max_polls_per_session=0)
    with pytest.raises(ValueError, match="max_polls"):
        job_routes(polls_board, max_polls=True)


def test_a_run_squatting_a_jobs_timer_id_is_no_timer_and_the_model_hears_so(
    api: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = Client(api)
    job_id = uuid.uuid4()
    monkeypatch.setattr(dflow_agents.pulling, "uuid", SimpleNamespace(uuid4=lambda: job_id))  # a known job id
    squatter = asyncio.run(start_in_session(squat, "mine now", me.session, timer_trace(job_id.hex)))
    trace = me.chat("fetch http://squatted")
    answer = me.result(trace)["answer"]
    assert "could not be posted" in answer and "not its timer" in answer, answer
    assert me.pull(wait=0) == []  # no job without its timer
    st = me.status(squatter.trace_id)
    assert (st["status"], st["result"]) == ("done", "mine now")  # the squatter's run is left as it was


def test_a_jobs_timer_started_before_is_recognised() -> None:
    runner = ask.runner  # a timeout of 0.5 s
    job_id = uuid.uuid4().hex
    assert asyncio.run(runner._start_timer(job_id)) is False  # started now
    assert asyncio.run(runner._start_timer(job_id)) is False  # started before (on_init again): it waits
    dflow.Run(timer_trace(job_id)).result(10)
    assert asyncio.run(runner._start_timer(job_id)) is True  # it fired: the job's deadline has passed


class _BrokenBoard(InMemoryJobBoard):
    """A board whose store is down."""

    async def pull(self, session: str, *, wait: float, limit: int) -> list[Job]:
        raise ConnectionError("Error 111 connecting to the board's Redis")


def test_a_board_that_fails_is_a_503_the_client_can_retry_not_a_500(url: str) -> None:
    app = create_app(tokens=Tokens(SECRET, ttl=600), admin_token=ADMIN, routes=[job_routes(_BrokenBoard())])
    with ServerThread(app) as base, httpx.Client(base_url=base, timeout=30) as api:
        me = Client(api)
        for wait in (0, 2):
            r = api.get("/jobs", headers=me.h, params={"wait": wait})
            assert r.status_code == 503 and "ConnectionError" in r.json()["detail"], r.text
            assert r.headers["retry-after"] == "1"
