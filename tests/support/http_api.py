"""Helpers for tests of the HTTP API that ``dflow serve`` offers (``dflow.server``), over a
real socket: bearer headers, sessions, runs and their statuses, server-sent events, and
:class:`SessionClient`, one session's client of the pulled-job routes (a browser plug-in).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx


def bearer(token: str | bytes) -> dict[str, Any]:
    """The ``Authorization`` header that carries ``token`` (bytes are sent as they are)."""
    return {"Authorization": (b"Bearer " + token) if isinstance(token, bytes) else f"Bearer {token}"}


def new_session(api: httpx.Client, admin: str, **body: Any) -> dict[str, Any]:
    """A new session (``POST /sessions`` with the ``admin`` token and ``body``, if any): its
    ``session``, ``token`` and ``expires_at``."""
    r = api.post("/sessions", headers=bearer(admin), json=body or None)
    assert r.status_code == 201, r.text
    return dict(r.json())


def start(api: httpx.Client, token: str, pipeline: str, param: Any = None, **extra: Any) -> httpx.Response:
    """``POST /runs`` of ``pipeline`` with ``param`` (and ``extra`` fields), as ``token``."""
    return api.post("/runs", headers=bearer(token), json={"pipeline": pipeline, "param": param, **extra})


def wait_status(
    api: httpx.Client, token: str, trace: str, *, until: str, timeout: float = 10
) -> dict[str, Any]:
    """The run's status once it is ``until``; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        r = api.get(f"/runs/{trace}", headers=bearer(token))
        assert r.status_code == 200, r.text
        if r.json()["status"] == until:
            return dict(r.json())
        assert time.monotonic() < deadline, f"run {trace} is {r.json()['status']}, not {until}"
        time.sleep(0.01)


def sse_events(
    api: httpx.Client, path: str, headers: dict[str, Any], *, content_type: str | None = None
) -> list[tuple[str, str, Any]]:
    """(event, id, data) of each event of the stream at ``path``, read until the server ends
    it; with ``content_type``, the response's type must start with it."""
    events: list[tuple[str, str, Any]] = []
    with api.stream("GET", path, headers=headers) as r:
        assert r.status_code == 200, r.read()
        if content_type is not None:
            assert r.headers["content-type"].startswith(content_type)
        fields: dict[str, str] = {}
        for line in r.iter_lines():
            if not line:
                if "data" in fields:
                    events.append(
                        (fields.get("event", "message"), fields.get("id", ""), json.loads(fields["data"]))
                    )
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return events


class SessionClient:
    """One session's client (the browser plug-in): a new session made with the ``admin``
    token; it chats with the agent ``agent`` (``agent_routes``), pulls and reports its jobs
    (``job_routes``) and reads its runs.

    A subclass names ``admin`` and ``agent``; ``wait`` and ``limit`` are what a pull asks for
    unless told (no ``limit`` when it is ``None``), ``timeout`` and ``poll`` how long and how
    often :meth:`result` reads the run's status.
    """

    admin: str
    agent: str
    wait: float = 5
    limit: int | None = 10
    timeout: float = 10
    poll: float = 0.01

    def __init__(self, api: httpx.Client) -> None:
        r = api.post("/sessions", headers=bearer(self.admin))
        assert r.status_code == 201, r.text
        self.api = api
        self.session: str = r.json()["session"]
        self.token: str = r.json()["token"]
        self.h = bearer(self.token)

    def chat(self, query: str) -> str:
        """Start a run of the agent on ``query`` in this session; its trace id."""
        r = self.api.post(f"/agents/{self.agent}/runs", headers=self.h, json={"query": query})
        assert r.status_code == 201, r.text
        return str(r.json()["trace_id"])

    def pull(self, wait: float | None = None) -> list[dict[str, Any]]:
        """The session's jobs (``GET /jobs``), waiting up to ``wait`` seconds for one."""
        params: dict[str, float] = {"wait": self.wait if wait is None else wait}
        if self.limit is not None:
            params["limit"] = self.limit
        r = self.api.get("/jobs", headers=self.h, params=params)
        assert r.status_code == 200, r.text
        return list(r.json()["jobs"])

    def report(self, job_id: str, **body: Any) -> httpx.Response:
        """``POST /jobs/{job_id}`` with ``body`` (``result=`` or ``error=``)."""
        return self.api.post(f"/jobs/{job_id}", headers=self.h, json=body)

    def report_at_once(self, base_url: str, job_id: str, values: Sequence[Any]) -> dict[Any, int]:
        """Report each of ``values`` as the job's result, each from a client of its own, all
        at once; the status code each report got, by value."""
        barrier = threading.Barrier(len(values))
        codes: dict[Any, int] = {}

        def report(value: Any) -> None:
            with httpx.Client(base_url=base_url, timeout=30) as own:
                barrier.wait()
                codes[value] = own.post(f"/jobs/{job_id}", headers=self.h, json={"result": value}).status_code

        threads = [threading.Thread(target=report, args=(v,)) for v in values]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return codes

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /jobs/{job_id}``, which must answer 200."""
        r = self.api.get(f"/jobs/{job_id}", headers=self.h)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def status(self, trace: str) -> dict[str, Any]:
        """``GET /runs/{trace}``."""
        return dict(self.api.get(f"/runs/{trace}", headers=self.h).json())

    def result(self, trace: str, timeout: float | None = None) -> dict[str, Any]:
        """The run's result once it is done (it must end ``done``); fails after ``timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            st = self.status(trace)
            if st["finished"]:
                assert st["status"] == "done", st
                return dict(st["result"])
            assert time.monotonic() < deadline, st
            time.sleep(self.poll)

    def events(self, trace: str) -> list[tuple[str, Any]]:
        """(event, data) of each of the run's server-sent events, until the stream ends."""
        return [(event, data) for event, _, data in sse_events(self.api, f"/runs/{trace}/events", self.h)]
