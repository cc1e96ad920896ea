"""The web console of a real ``dflow serve`` process, with a ``dflow worker`` process
running the steps, on Redis (a fresh key prefix, so counts are exact): the runs list's
counts, filters and cursor pages come from the Redis store; a run page's tree, its live
stream and answering its ``from_call``; an agent run's conversation, read by the server
process from the run's data."""

from __future__ import annotations

import time
from typing import Any

import httpx

import dflow
from dflow import Run
from tests.support import console_app
from tests.support.console import csrf_of, login, stream_events

from .conftest import SECRET
from .workers import Served, streams_transport

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
        dflow.configure(transport, served.workers.store, secret=SECRET, consume=False)  # a client: no steps here
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
                assert everything["counts"] == {"running": 0, "sleeping": 0, "waiting": 1, "done": 6, "failed": 0,
                                                "cancelled": 0, "compensated": 0}
                assert c.get("/console/api/runs", params={"pipeline": "ci-count"}).json()["counts"]["done"] == 5
                seen: list[str] = []
                cursor = None
                for _ in range(5):
                    params: dict[str, Any] = {"pipeline": "ci-count", "limit": 2, **({"cursor": cursor} if cursor else {})}
                    page = c.get("/console/api/runs", params=params).json()
                    seen += [r["trace_id"] for r in page["runs"]]
                    cursor = page["cursor"]
                    if cursor is None:
                        break
                # each once, newest first (runs started within one millisecond come in trace id order)
                assert sorted(seen) == sorted(r.trace_id for r in counted) and len(set(seen)) == len(seen)
                made = {r.trace_id: r.info().created for r in counted}
                assert [int(made[t] * 1000) for t in seen] == sorted((int(made[t] * 1000) for t in seen), reverse=True)
                waiting = c.get("/console/api/runs", params={"status": "waiting"}).json()["runs"]
                assert [(r["trace_id"], r["pipeline"], r["waiting_for"]) for r in waiting] == [
                    (asked.trace_id, "ci-ask", "ci-answer")]
                html = c.get("/console/").text
                assert all(r.trace_id in html for r in (*counted, asked, agent))
                # a run page, followed live while the console answers its call
                page_html = c.get(f"/console/runs/{asked.trace_id}").text
                assert ">question<" in page_html and 'data-call="ci-answer"' in page_html
                r = c.post(f"/console/api/runs/{asked.trace_id}/answer",
                           json={"call_type": "ci-answer", "payload": {"pick": "that one"}})
                assert r.status_code == 202, r.text
                events = stream_events(c, f"/console/api/runs/{asked.trace_id}/stream")
                assert events[-1] == ("end", {"trace_id": asked.trace_id, "status": "done"})
                assert asked.result(20) == {"question": "Q: which?", "answer": {"pick": "that one"}}
                # the agent's page: three tool steps side by side, and the conversation
                parts = c.get(f"/console/api/runs/{agent.trace_id}/tree").json()
                assert parts["tree"].count('class="branch"') == 3
                conv = parts["conversation"]
                assert "Conversation · ci-weather" in conv and conv.count('class="msg tool"') == 4
                assert conv.index("I will check the three cities") < conv.index("Rome is the warmest")
        finally:
            dflow.shutdown()
