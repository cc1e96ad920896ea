"""A hostile review of issue 9's Redis parts, against real Redis: the job board's long polls
(what a client holding one token can make the server hold open), sessions whose ids look
alike on the board, plan template names with special characters; and a real ``dflow serve``
process: given an admin token too short to be one, and, without an admin token on loopback
(its default), what a web page in the user's browser can make it do (a cross-site form post,
DNS rebinding). ``dflow serve`` serves this module, whose pipeline ``rv-serve-echo`` it offers.

Tests marked ``xfail(strict=True)`` show a defect that is still there (the reason names it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

import dflow
from dflow import DFlow
from dflow.server import ServerThread, create_app
from dflow_agents.pulling import Job, RedisJobBoard, job_routes
from dflow_agents.templates import PlanTemplate, RedisPlanTemplates

from .conftest import SECRET
from .workers import Serve

ADMIN = "admin-token-of-the-review-redis-tests-0123456789"
POLLS = 40

#: what the open ``dflow serve`` below offers (it imports this module)
rv_serve_echo = DFlow.from_call("rv-serve-echo").map(lambda x: {"echo": x}).id("wrap").init("rv-serve-echo")


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
                codes.append(c.get("/jobs", params={"wait": 3}, headers={"Authorization": f"Bearer {token}"})
                             .status_code)

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
                job = Job(id=f"job-{sessions.index(s)}", tool="t", arguments={"for": s}, session=s, run="r",
                          trace="r", call_type="c", created=now, deadline=now + 30)
                assert await board.post(job)
            got = {s: [j.arguments["for"] for j in await board.pull(s, wait=0.05, limit=100)] for s in sessions}
            got["again"] = [j.id for s in sessions for j in await board.pull(s, wait=0.05, limit=100)]
            return got
        finally:
            await board.aclose()

    got = asyncio.run(go())
    for s in sessions:
        assert got[s] == [s], (s, got[s])
    assert got["again"] == []  # each job was handed out once


def test_plan_template_names_with_special_characters_are_refused_and_write_nothing(
    redis_url: str, prefix: str
) -> None:
    async def go() -> None:
        store = RedisPlanTemplates(redis_url, prefix=prefix)
        try:
            for name in ("a b", "a*", "{a}", "a}b", "*", "a\nb", "a\r\nFLUSHALL", "\u00e9", "", "x" * 65, "a/b"):
                for op in (store.get(name), store.versions(name), store.delete(name)):
                    with pytest.raises(ValueError, match="template name"):
                        await op
            # names that are odd but allowed are kept apart, and none of them is the names set
            odd = ["names", "latest", "a:b", "a", "a.b", "a@b", "1", "_-_"]
            for name in odd:
                await store.save(PlanTemplate(name=name, title=f"title of {name}", steps=["s"]))
            assert await store.names() == sorted(odd)
            for name in odd:
                got = await store.get(name)
                assert (got.title, got.version) == (f"title of {name}", 1)
                assert await store.versions(name) == [1]
            assert await store.delete("names")
            assert await store.names() == sorted(n for n in odd if n != "names")
        finally:
            await store.aclose()

    asyncio.run(go())
    r = redis.Redis.from_url(redis_url)
    try:
        keys = sorted(k.decode() for k in r.scan_iter(f"{prefix}:*"))
    finally:
        r.close()
    expected = sorted([f"{prefix}:names"] + [f"{prefix}:{{{n}}}" for n in ("latest", "a:b", "a", "a.b", "a@b", "1",
                                                                          "_-_")])
    assert keys == expected


def test_dflow_serve_refuses_a_short_admin_token_without_showing_it(redis_url: str) -> None:
    short = "shortadmintoken-QWERTY"
    env = {**os.environ, "DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": short,
           "DFLOW_SERVER_SECRET": "server-secret-of-the-review-redis-tests-0123456789"}
    out = subprocess.run(
        [sys.executable, "-m", "dflow.cli", "serve", "json", "--store", redis_url, "--transport", redis_url,
         "--host", "0.0.0.0", "--port", "0"],
        check=False, capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "at least 32" in out.stderr and "DFLOW_SERVER_TOKEN" in out.stderr
    assert short not in out.stderr and short not in out.stdout
    assert "listening" not in out.stderr


@pytest.fixture
def open_serve(redis_url: str, prefix: str) -> Iterator[str]:
    """``dflow serve`` of this module on 127.0.0.1 without DFLOW_SERVER_TOKEN (an open server,
    as the README runs it locally); its URL. No worker: runs are only created."""
    env = {"DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": "",
           "DFLOW_SERVER_SECRET": "server-secret-of-the-review-redis-tests-0123456789"}
    serve = Serve("tests.integration.test_review_issue9_redis", f"{redis_url}?stream={prefix}:steps",
                  f"{redis_url}?prefix={prefix}", env, "--host", "127.0.0.1", grace=1)
    try:
        yield serve.url
    finally:
        serve.stop()
        serve.log.unlink(missing_ok=True)


def test_an_open_dflow_serve_starts_runs_for_a_same_origin_json_client(open_serve: str) -> None:
    """What the two tests below refuse must stay possible for the legitimate local client."""
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post("/runs", json={"pipeline": "rv-serve-echo", "param": 1})
        assert r.status_code == 201, r.text
        assert api.get(f"/runs/{r.json()['trace_id']}", headers={"Authorization": f"Bearer {r.json()['token']}"}
                       ).status_code == 200


def test_an_open_dflow_serve_refuses_a_cross_site_form_post(open_serve: str) -> None:
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post("/runs", content=b'{"pipeline": "rv-serve-echo", "param": "drive-by"}', headers={
            "Content-Type": "text/plain;charset=UTF-8", "Origin": "http://evil.example",
            "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors",
        })
        assert r.status_code in (400, 403, 415), (r.status_code, r.text[:200])


def test_an_open_dflow_serve_refuses_foreign_host_names(open_serve: str) -> None:
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post("/runs", json={"pipeline": "rv-serve-echo", "param": "rebound"},
                     headers={"Host": "rebind.evil.example"})
        assert r.status_code in (400, 403, 421), (r.status_code, r.text[:200])
