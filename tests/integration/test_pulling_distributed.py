"""Pulled jobs with every part in its own process: ``dflow serve`` and ``dflow worker``
subprocesses serving ``tests.integration.apps.pulling_app`` on Redis Streams (and Kafka), the jobs
in Redis, and this test as the client (the browser plug-in) over real HTTP:

* the happy path: the job is pulled with a long poll, reported, and the run resumes on a
  worker; its steps stream as server-sent events;
* the timeout path: the run goes on with a timeout observation, a late report gets 410;
* a worker killed with ``kill -9`` while a pulled job is outstanding: a new worker takes
  the run on after the report;
* sessions apart (403), two concurrent reports (one wins, atomically in Redis), and no
  token in the server's log;
* the Redis job board itself: posted once, handed out once, decided once; one client's
  long polls do not each hold a Redis connection; sessions whose ids look alike never get
  each other's jobs.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

import dflow
from dflow.server import ServerThread, create_app
from dflow_agents.pulling import Job, RedisJobBoard, job_routes
from tests.support.http_api import SessionClient
from tests.support.workers import Served, kafka_transport, streams_transport

from .conftest import SECRET

pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ADMIN = "admin-token-of-the-pulling-integration-tests-0123"
SERVER_SECRET = "server-secret-of-the-pulling-integration-tests-01"


class Cluster(Served):
    """``dflow serve`` and a worker on one transport, the store and the jobs in Redis; ``http``
    a client of the server."""

    def __init__(self, redis_url: str, prefix: str, transport: str) -> None:
        env = {
            "DFLOW_SECRET": SECRET,
            "DFLOW_SERVER_SECRET": SERVER_SECRET,
            "DFLOW_SERVER_TOKEN": ADMIN,
            "DFLOW_TEST_REDIS": redis_url,
            "DFLOW_TEST_PREFIX": prefix,
            "DFLOW_TEST_ASK_TIMEOUT": "1.5",
            "DFLOW_AGENTS_BLOCK_NETWORK": "1",
        }
        super().__init__(
            "tests.integration.apps.pulling_app", redis_url, prefix, transport, env, "--log-level", "INFO"
        )
        self.http = httpx.Client(base_url=self.serve.url, timeout=60)

    def close(self) -> int:
        self.http.close()
        return super().close()


class Client(SessionClient):
    """One session's client over HTTP."""

    admin = ADMIN
    agent = "browser"
    wait, limit = 20, None
    timeout, poll = 60, 0.05

    def __init__(self, c: Cluster) -> None:
        super().__init__(c.http)


@pytest.fixture(scope="module")
def cluster(redis_url: str, module_prefix: str) -> Iterator[Cluster]:
    """Redis Streams: ``dflow serve`` and one worker, for the tests of this module."""
    with Cluster(redis_url, module_prefix, streams_transport(redis_url, module_prefix)) as c:
        yield c


def _happy_path(c: Cluster) -> None:
    me = Client(c)
    trace = me.chat("fetch http://shop.example/coats")
    (job,) = me.pull()
    assert job["tool"] == "fetch_page" and job["arguments"] == {"url": "http://shop.example/coats"}
    assert job["run"] == trace
    assert me.report(job["id"], result="3 coats").status_code == 200
    result = me.result(trace)
    assert result["status"] == "finished" and result["answer"] == "observed: 3 coats"
    events = me.events(trace)
    assert events[-1][0] == "end" and events[-1][1]["result"]["answer"] == "observed: 3 coats"
    assert [d["status"] for e, d in events if e == "step"][:2] == ["entry", "done"]


@pytest.mark.timeout(120)
def test_the_happy_path_over_http_with_worker_processes(cluster: Cluster) -> None:
    _happy_path(cluster)


@pytest.mark.timeout(180)
def test_the_happy_path_on_kafka(redis_url: str, prefix: str, kafka_bootstrap: str) -> None:
    with Cluster(redis_url, prefix, kafka_transport(kafka_bootstrap, prefix)) as c:
        _happy_path(c)


@pytest.mark.timeout(120)
def test_a_silent_client_times_out_and_a_late_report_is_410(cluster: Cluster) -> None:
    me = Client(cluster)
    trace = me.chat("ask which size?")
    (job,) = me.pull()
    assert job["tool"] == "ask_user"
    t0 = time.monotonic()
    result = me.result(trace)
    assert "JobTimeoutError" in result["answer"] and "within 1.5 s" in result["answer"]
    assert time.monotonic() - t0 < 15
    late = me.report(job["id"], result="M")
    assert late.status_code == 410
    assert cluster.http.get(f"/jobs/{job['id']}", headers=me.h).json()["state"] == "expired"


@pytest.mark.timeout(120)
def test_a_worker_killed_while_a_pulled_job_is_outstanding(cluster: Cluster) -> None:
    me = Client(cluster)
    trace = me.chat("fetch http://shop.example/shoes")
    (job,) = me.pull()
    cluster.workers.kill_one()  # kill -9: no worker is left
    assert not cluster.workers.alive()
    assert me.report(job["id"], result="2 pairs").status_code == 200  # the run is resumed in the store
    cluster.workers.start(1)  # a new worker takes the run on
    assert me.result(trace)["answer"] == "observed: 2 pairs"


@pytest.mark.timeout(120)
def test_sessions_apart_and_concurrent_reports_on_redis(cluster: Cluster) -> None:
    me, them = Client(cluster), Client(cluster)
    trace = me.chat("fetch http://shop.example/hats")
    assert them.pull(wait=0.5) == []
    (job,) = me.pull()
    http = cluster.http
    assert http.get(f"/jobs/{job['id']}", headers=them.h).status_code == 403
    assert them.report(job["id"], result="forged").status_code == 403
    assert http.get(f"/runs/{trace}/events", headers=them.h).status_code == 403
    codes = me.report_at_once(cluster.serve.url, job["id"], ["left", "right"])
    assert sorted(codes.values()) == [200, 409]
    winner = next(v for v, code in codes.items() if code == 200)
    assert me.result(trace)["answer"] == f"observed: {winner}"


@pytest.mark.timeout(120)
def test_expired_tokens_garbage_oversized_and_repeated_reports_change_nothing(cluster: Cluster) -> None:
    from dflow.server import Tokens

    me = Client(cluster)
    trace = me.chat("fetch http://shop.example/socks")
    (job,) = me.pull()
    http, path = cluster.http, f"/jobs/{job['id']}"
    expired = Tokens(SERVER_SECRET).issue(me.session, 60, now=time.time() - 61)[0]
    old = {"Authorization": f"Bearer {expired}"}
    for r in (
        http.get("/jobs", headers=old),
        http.post(path, headers=old, json={"result": "x"}),
        http.get(f"/runs/{trace}/events", headers=old),
    ):
        assert r.status_code == 401 and "expired" in r.json()["detail"]
    assert (
        http.post(
            path, headers={**me.h, "Content-Type": "application/json"}, content=b"\x00garbage"
        ).status_code
        == 400
    )
    assert http.post(path, headers=me.h, json={"answer": 1}).status_code == 422
    assert http.post(path, headers=me.h, json={"result": "x" * (1024 * 1024 + 1)}).status_code == 413
    assert http.get(path, headers=me.h).json()["state"] == "pending"  # nothing changed
    assert me.report(job["id"], result="4 pairs").status_code == 200
    assert me.report(job["id"], result="5 pairs").status_code == 409
    assert me.result(trace)["answer"] == "observed: 4 pairs"


@pytest.mark.timeout(60)
def test_no_token_reaches_the_servers_log(cluster: Cluster) -> None:
    me = Client(cluster)
    trace = me.chat("fetch http://x")
    (job,) = me.pull()
    me.report(job["id"], result="x")
    me.result(trace)
    time.sleep(0.2)
    log = cluster.serve.output()
    assert f"POST /jobs/{job['id']}" in log  # the access log is on
    assert me.token not in log and ADMIN not in log and SERVER_SECRET not in log
    assert me.token.split(".")[2] not in log  # not even its signature


# -- the Redis board, directly ------------------------------------------------------------------


def _job(job_id: str, session: str = "s1", in_seconds: float = 30) -> Job:
    now = time.time()
    return Job(
        id=job_id,
        tool="t",
        arguments={"a": 1},
        session=session,
        run="r",
        trace="r/1-0",
        call_type="c",
        created=now,
        deadline=now + in_seconds,
    )


def test_the_redis_board_posts_hands_out_and_settles_each_job_once(redis_url: str, prefix: str) -> None:
    async def main() -> None:
        b = RedisJobBoard(redis_url, prefix=f"{prefix}:jobs")
        try:
            assert await b.post(_job("a")) and not await b.post(_job("a"))
            await b.post(_job("b"))
            await b.post(_job("gone", in_seconds=-1))
            assert [j.id for j in await b.pull("s1", wait=0, limit=10)] == ["a", "b"]
            assert await b.pull("s1", wait=0, limit=10) == []  # handed out once; "gone" is past its deadline
            assert await b.pull("s2", wait=0, limit=10) == []
            settled = await asyncio.gather(*(b.settle("a", "answered") for _ in range(8)))
            assert sorted(settled) == [False] * 7 + [True]  # once, atomically
            assert not await b.settle("a", "expired")
            got = await b.get("a")
            assert got is not None and got.state == "answered" and got.arguments == {"a": 1}
            assert await b.get("nope") is None
            ttl = redis.Redis.from_url(redis_url).pttl(f"{prefix}:jobs:job:a")
            assert 3_600_000 < ttl <= 3_630_000  # forgotten an hour after its deadline
        finally:
            await b.aclose()

    asyncio.run(main())


def test_a_redis_long_poll_wakes_on_a_post_and_a_cancelled_pull_hands_jobs_back(
    redis_url: str, prefix: str
) -> None:
    async def main() -> None:
        b = RedisJobBoard(redis_url, prefix=f"{prefix}:jobs")
        try:

            async def post_later() -> None:
                await asyncio.sleep(0.2)
                await b.post(_job("late"))

            t0 = time.monotonic()
            jobs, _ = await asyncio.gather(b.pull("s1", wait=10, limit=5), post_later())
            assert [j.id for j in jobs] == ["late"] and 0.15 < time.monotonic() - t0 < 5
            assert await b.pull("s1", wait=0.2, limit=5) == []  # waited, nothing came
            pull = asyncio.ensure_future(b.pull("s2", wait=10, limit=5))
            await asyncio.sleep(0.1)
            pull.cancel()
            await asyncio.gather(pull, return_exceptions=True)
            await b.post(_job("kept", session="s2"))
            assert [j.id for j in await b.pull("s2", wait=1, limit=5)] == ["kept"]
        finally:
            await b.aclose()

    asyncio.run(main())


# -- the job board's long polls and sessions, without worker processes ---------------------

POLLS = 40


def _connections(url: str, name: str) -> int:
    r = redis.Redis.from_url(url)
    try:
        return sum(1 for c in r.client_list() if c.get("name") == name)
    finally:
        r.close()


def test_one_clients_long_polls_do_not_each_hold_a_redis_connection(
    local: dflow.Runtime, redis_url: str, prefix: str
) -> None:
    name = f"rv-{uuid.uuid4().hex[:8]}"
    board = RedisJobBoard(redis_url, prefix=prefix, client_name=name)
    app = create_app(secret=SECRET, admin_token=ADMIN, routes=[job_routes(board)])
    with ServerThread(app) as base:
        with httpx.Client(base_url=base) as api:
            token = api.post("/sessions", headers={"Authorization": f"Bearer {ADMIN}"}).json()["token"]
        codes: list[int] = []

        def poll() -> None:
            with httpx.Client(base_url=base, timeout=20) as c:
                codes.append(
                    c.get(
                        "/jobs", params={"wait": 3}, headers={"Authorization": f"Bearer {token}"}
                    ).status_code
                )

        threads = [threading.Thread(target=poll) for _ in range(POLLS)]
        for t in threads:
            t.start()
        time.sleep(1.5)  # every poll is waiting now
        held = _connections(redis_url, name)
        for t in threads:
            t.join()
    assert len(codes) == POLLS
    assert held <= 10, f"{POLLS} long polls of one session held {held} Redis connections"


def test_sessions_that_look_alike_never_get_each_others_jobs(redis_url: str, prefix: str) -> None:
    sessions = ["a", "a:b", "a*", "a:queue:a", "queue", "job", "A", "a-"]

    async def go() -> dict[str, list[str]]:
        board = RedisJobBoard(redis_url, prefix=prefix)
        try:
            now = time.time()
            for s in sessions:
                job = Job(
                    id=f"job-{sessions.index(s)}",
                    tool="t",
                    arguments={"for": s},
                    session=s,
                    run="r",
                    trace="r",
                    call_type="c",
                    created=now,
                    deadline=now + 30,
                )
                assert await board.post(job)
            got = {
                s: [j.arguments["for"] for j in await board.pull(s, wait=0.05, limit=100)] for s in sessions
            }
            got["again"] = [j.id for s in sessions for j in await board.pull(s, wait=0.05, limit=100)]
            return got
        finally:
            await board.aclose()

    got = asyncio.run(go())
    for s in sessions:
        assert got[s] == [s], (s, got[s])
    assert got["again"] == []  # each job was handed out once
