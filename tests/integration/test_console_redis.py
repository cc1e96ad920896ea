"""The web console of a real ``dflow serve`` process, with a ``dflow worker`` process
running the steps, on Redis (a fresh key prefix, so counts are exact): the runs list's
counts, filters and cursor pages come from the Redis store; a run page's tree, its live
stream and answering its ``from_call``; an agent run's conversation, read by the server
process from the run's data. And a ``dflow serve`` whose redis-server is killed: the API and
the console answer 503 with ``Retry-After``."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from typing import Any

import httpx
import redis

import dflow
from dflow import Run
from tests.support import console_app, http_api
from tests.support.console import csrf_of, login, stream_events
from tests.support.http_api import bearer
from tests.support.workers import Serve, Served, streams_transport

from .conftest import SECRET, require

ADMIN = "admin-token-of-the-console-integration-test-01"


def _status(run: Run[Any], want: str) -> None:
    deadline = time.monotonic() + 20
    while run.status().value != want:
        assert time.monotonic() < deadline, f"{run} is {run.status().value}, not {want}"
        time.sleep(0.05)


def test_the_console_of_dflow_serve_on_redis(redis_url: str, prefix: str) -> None:
    transport = streams_transport(redis_url, prefix)
    env = {"DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": ADMIN, "DFLOW_AGENTS_BLOCK_NETWORK": "1"}
    with Served("tests.support.console_app", redis_url, prefix, transport, env) as served:
        dflow.configure(
            transport, served.workers.store, secret=SECRET, consume=False
        )  # a client: no steps here
        try:
            counted = [console_app.counting.call(i) for i in range(5)]
            assert [r.result(20) for r in counted] == [(i + 1) * 2 for i in range(5)]
            asked = console_app.asking.call("which?")
            _status(asked, "waiting")
            agent = console_app.weather.run("Which city is warmest: Oslo, Rome or Tokyo?")
            assert agent.result(20).answer == "Rome is the warmest (14 °C)"
            with httpx.Client(base_url=served.serve.url, timeout=30) as c:
                assert c.get("/console/").status_code == 303  # the admin token is set: log in first
                login(c, ADMIN)
                c.headers["X-DFlow-CSRF"] = csrf_of(c)
                # the runs list: exact counts, pages by cursor, filters, from the Redis store
                everything = c.get("/console/api/runs").json()
                assert everything["counts"] == {
                    "running": 0,
                    "sleeping": 0,
                    "waiting": 1,
                    "done": 6,
                    "failed": 0,
                    "cancelled": 0,
                    "compensated": 0,
                    "timed_out": 0,
                }
                assert (
                    c.get("/console/api/runs", params={"pipeline": "ci-count"}).json()["counts"]["done"] == 5
                )
                seen: list[str] = []
                cursor = None
                for _ in range(5):
                    params: dict[str, Any] = {
                        "pipeline": "ci-count",
                        "limit": 2,
                        **({"cursor": cursor} if cursor else {}),
                    }
                    page = c.get("/console/api/runs", params=params).json()
                    seen += [r["trace_id"] for r in page["runs"]]
                    cursor = page["cursor"]
                    if cursor is None:
                        break
                # each once, newest first (runs started within one millisecond come in trace id order)
                assert sorted(seen) == sorted(r.trace_id for r in counted) and len(set(seen)) == len(seen)
                made = {r.trace_id: r.info().created for r in counted}
                assert [int(made[t] * 1000) for t in seen] == sorted(
                    (int(made[t] * 1000) for t in seen), reverse=True
                )
                waiting = c.get("/console/api/runs", params={"status": "waiting"}).json()["runs"]
                assert [(r["trace_id"], r["pipeline"], r["waiting_for"]) for r in waiting] == [
                    (asked.trace_id, "ci-ask", "ci-answer")
                ]
                html = c.get("/console/").text
                assert all(r.trace_id in html for r in (*counted, asked, agent))
                # a run page, followed live while the console answers its call
                page_html = c.get(f"/console/runs/{asked.trace_id}").text
                assert ">question<" in page_html and 'data-call="ci-answer"' in page_html
                r = c.post(
                    f"/console/api/runs/{asked.trace_id}/answer",
                    json={"call_type": "ci-answer", "payload": {"pick": "that one"}},
                )
                assert r.status_code == 202, r.text
                events = stream_events(c, f"/console/api/runs/{asked.trace_id}/stream")
                assert events[-1] == ("end", {"trace_id": asked.trace_id, "status": "done"})
                assert asked.result(20) == {"question": "Q: which?", "answer": {"pick": "that one"}}
                # the agent's page: the turn's tool step with its three calls, and the conversation
                parts = c.get(f"/console/api/runs/{agent.trace_id}/tree").json()
                names = re.findall(r'class="nm">([^<]*)', parts["tree"])
                assert names[:4] == ["agent.ci-weather", "start", "loop", "tool temperature"], names
                conv = parts["conversation"]
                assert "Conversation · ci-weather" in conv and conv.count('class="msg tool"') == 4
                assert conv.index("I will check the three cities") < conv.index("Rome is the warmest")
        finally:
            dflow.shutdown()


def _own_redis_server() -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server of this test's own (nothing persisted), and its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        finally:
            client.close()


def test_dflow_serve_answers_503_with_retry_after_when_its_store_is_gone() -> None:
    require("redis-server", shutil.which("redis-server") is not None)
    proc, url = _own_redis_server()
    serve = None
    try:
        env = {"DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": ADMIN, "DFLOW_AGENTS_BLOCK_NETWORK": "1"}
        serve = Serve("tests.support.console_app", streams_transport(url, "gone"), f"{url}?prefix=gone", env)
        with httpx.Client(base_url=serve.url, timeout=60) as api:
            session = http_api.new_session(api, ADMIN)
            r = http_api.start(api, session["token"], "ci-count", 1)  # no worker: it stays running
            assert r.status_code == 201, r.text
            trace = r.json()["trace_id"]
            proc.kill()
            proc.wait()
            asked = {
                "a run's status": lambda: api.get(f"/runs/{trace}", headers=bearer(session["token"])),
                "a new run": lambda: http_api.start(api, session["token"], "ci-count", 2),
                "the console's runs": lambda: api.get("/console/api/runs", headers=bearer(ADMIN)),
                "the console's run": lambda: api.get(
                    f"/console/api/runs/{trace}/tree", headers=bearer(ADMIN)
                ),
            }
            for what, ask in asked.items():
                t0 = time.monotonic()
                r = ask()
                assert r.status_code == 503, (what, r.status_code, r.text)
                assert r.headers["retry-after"] == "2" and r.headers["content-type"] == "application/json"
                assert r.json() == {
                    "detail": "the store is unavailable (StoreUnavailableError): retry in a few seconds"
                }
                assert time.monotonic() - t0 < 15, what  # an answer, not a hang
            page = api.get("/console/", headers={**bearer(ADMIN), "Accept": "text/html"})
            assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
            assert page.headers["retry-after"] == "2"
            assert "the store is unavailable (StoreUnavailableError): retry in a few seconds" in page.text
            assert "Try again" in page.text, "a page for the operator's browser, not JSON"
        serve.stop()
        answered = [
            line for line in serve.output().splitlines() if "answered 503: StoreUnavailableError" in line
        ]
        assert len(answered) == len(asked) + 1, serve.output()[-3000:]  # the cause, in the server's log
        assert all("cannot reach Redis" in line for line in answered)
    finally:
        if serve is not None:
            serve.stop()
        proc.kill()
        proc.wait()
