"""The HTTP API (``dflow.server``) over real sockets, on the in-memory runtime: sessions and
their tokens, starting runs, status, the step events as server-sent events until the run
ends (or its token expires), with the live events its steps publish when asked (``?live=1``), answering a ``from_call``, cancelling; every token check
(missing, garbage, forged, expired, not canonical: 401; another session's run: 403; the admin
token for sessions); bodies that are too big, not JSON or not sent as JSON; a server without
an admin token (loopback host names only, no cross-site writes, no renewed sessions); a run
created again under its trace id in another session; route providers and the call types and
trace ids they reserve; ``dflow serve`` refusing an open server off loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends

import dflow
from dflow import DFlow
from dflow.errors import ConfigurationError
from dflow.server import (
    SESSION_KEY,
    AdminToken,
    Server,
    ServerThread,
    Session,
    TokenError,
    Tokens,
    create_app,
)
from tests.support import http_api
from tests.support.http_api import bearer, sse_events, start, wait_status

ADMIN = "admin-token-of-the-server-tests-0123456789"
SECRET = "server-secret-of-the-server-tests-0123456789"

echo = DFlow.from_call("srv-echo").map(lambda x: {"echo": x}).id("wrap").init("srv-echo")


def _ask(question: Any) -> DFlow[Any]:
    return DFlow.from_call("answer")


ask = (
    DFlow.from_call("srv-ask")
    .map(lambda q: f"Q: {q}")
    .id("question")
    .flat_map(_ask)
    .id("wait")
    .map(lambda a: {"answered": a})
    .id("done")
    .init("srv-ask")
)


async def _tell(text: str) -> str:
    for word in text.split():
        await dflow.live.publish({"word": word})
    return text.upper()


told = DFlow.from_call("srv-tell").map(_tell).id("tell").init("srv-tell")
session_of_run = (
    DFlow.from_call("srv-whose").map(lambda ctx, _: ctx.get(SESSION_KEY)).id("read").init("srv-whose")
)


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens(SECRET, ttl=600)


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime, tokens: Tokens) -> Iterator[str]:
    app = create_app(
        tokens=tokens, admin_token=ADMIN, pipelines=["srv-echo", "srv-ask", "srv-whose", "srv-tell"]
    )
    with ServerThread(app) as base:
        yield base


def new_session(api: httpx.Client) -> dict[str, Any]:
    return http_api.new_session(api, ADMIN)


def sse(api: httpx.Client, path: str, headers: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(event, id, data) of each event of a stream, read until the server ends it."""
    return sse_events(api, path, headers, content_type="text/event-stream")


# -- the happy paths --------------------------------------------------------------------------


def test_health_and_the_openapi_docs(api: httpx.Client) -> None:
    assert api.get("/health").json() == {"ok": True}
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {
        "/sessions",
        "/runs",
        "/runs/{trace_id}",
        "/runs/{trace_id}/events",
        "/runs/{trace_id}/calls/{call_type}",
        "/runs/{trace_id}/cancel",
    } <= set(paths)
    assert "requestBody" in paths["/runs"]["post"]


def test_the_admin_starts_a_run_in_a_new_session_and_its_token_reads_it(api: httpx.Client) -> None:
    r = start(api, ADMIN, "srv-echo", {"n": 1})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"trace_id", "session", "token", "expires_at"}
    done = wait_status(api, body["token"], body["trace_id"], until="done")
    assert done["result"] == {"echo": {"n": 1}} and done["finished"] is True and done["error"] is None
    # a second run with the session's token joins the session: no new token
    again = start(api, body["token"], "srv-whose")
    assert again.status_code == 201 and set(again.json()) == {"trace_id", "session"}
    assert again.json()["session"] == body["session"]
    whose = wait_status(api, body["token"], again.json()["trace_id"], until="done")
    assert whose["result"] == body["session"]  # the run's data names its session from its creation


def test_events_stream_every_step_in_order_until_the_run_ends(api: httpx.Client) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "why?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")
    r = api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json={"because": 42})
    assert r.status_code == 202 and r.json()["delivered"] is True
    events = sse(api, f"/runs/{trace}/events", bearer(s["token"]))
    steps = [e for e in events if e[0] == "step"]
    assert [e[1] for e in steps] == [str(i) for i in range(len(steps))]
    assert [d["status"] for _, _, d in steps] == ["entry", "done", "done", "waiting", "done", "done"]
    assert steps[1][2]["output"] == "Q: why?" and steps[-1][2]["output"] == {"answered": {"because": 42}}
    assert events[-1][0] == "end"
    assert events[-1][2]["status"] == "done" and events[-1][2]["result"] == {"answered": {"because": 42}}
    # reconnecting with Last-Event-ID goes on after that step
    resumed = sse(api, f"/runs/{trace}/events", {**bearer(s["token"]), "Last-Event-ID": "3"})
    assert [e[1] for e in resumed if e[0] == "step"] == ["4", "5"] and resumed[-1][0] == "end"


def test_events_follow_a_live_run_and_end_when_it_does(api: httpx.Client, url: str) -> None:
    import threading

    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "live?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")

    def answer_later() -> None:
        time.sleep(0.3)
        with httpx.Client(base_url=url) as other:
            other.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json="yes")

    t = threading.Thread(target=answer_later)
    t.start()
    t0 = time.monotonic()
    events = sse(api, f"/runs/{trace}/events", bearer(s["token"]))
    t.join()
    assert time.monotonic() - t0 >= 0.25  # the stream stayed open while the run waited
    assert events[-1][0] == "end" and events[-1][2]["result"] == {"answered": "yes"}


def test_with_live_the_events_carry_what_a_step_published_before_its_step_event(api: httpx.Client) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-tell", "one two three").json()["trace_id"]
    wait_status(api, s["token"], trace, until="done")
    events = sse(api, f"/runs/{trace}/events?live=1", bearer(s["token"]))
    assert [(e, d["data"]["word"]) for e, _, d in events if e == "live"] == [
        ("live", "one"),
        ("live", "two"),
        ("live", "three"),
    ]
    live = [i for i, e in enumerate(events) if e[0] == "live"]
    tell = [i for i, e in enumerate(events) if e[0] == "step" and e[2]["output"] == "ONE TWO THREE"]
    assert live and tell and max(live) < tell[0], "a step's live events come before its record"
    assert {e[1] for e in events if e[0] == "live"} == {""}, (
        "live events have no id: Last-Event-ID counts steps"
    )
    assert events[live[0]][2]["seq"] == events[tell[0]][2]["seq"]
    plain = sse(api, f"/runs/{trace}/events", bearer(s["token"]))
    assert [e[0] for e in plain if e[0] == "live"] == [] and plain[-1][0] == "end"


def test_answering_a_call_the_run_is_not_waiting_for_keeps_it_or_with_if_waiting_is_409(
    api: httpx.Client,
) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")
    r = api.post(f"/runs/{trace}/calls/something-else?if_waiting=true", headers=bearer(s["token"]), json=1)
    assert r.status_code == 409 and "something-else" in r.json()["detail"]
    kept = api.post(f"/runs/{trace}/calls/something-else", headers=bearer(s["token"]), json=1)
    assert kept.status_code == 202, kept.text  # in the run's mailbox, for a from_call that never comes
    assert api.get(f"/runs/{trace}", headers=bearer(s["token"])).json()["status"] == "waiting"
    assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json=1).status_code == 202
    wait_status(api, s["token"], trace, until="done")
    assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json=2).status_code == 409


def test_cancel_ends_the_run_and_its_stream(api: httpx.Client) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")
    r = api.post(f"/runs/{trace}/cancel", headers=bearer(s["token"]), json={"reason": "user left"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert "user left" in json.dumps(r.json()["error"])
    events = sse(api, f"/runs/{trace}/events", bearer(s["token"]))
    assert events[-1][0] == "end" and events[-1][2]["status"] == "cancelled"
    assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json=1).status_code == 409
    # cancelling again leaves it as it ended; an empty body is fine
    assert api.post(f"/runs/{trace}/cancel", headers=bearer(s["token"])).json()["status"] == "cancelled"


def test_a_session_lists_its_pipelines(api: httpx.Client) -> None:
    s = new_session(api)
    names = [p["name"] for p in api.get("/pipelines", headers=bearer(s["token"])).json()["pipelines"]]
    assert names == ["srv-ask", "srv-echo", "srv-tell", "srv-whose"]  # only those the app serves


# -- tokens -----------------------------------------------------------------------------------


def test_missing_garbage_forged_and_expired_tokens_are_401(api: httpx.Client, tokens: Tokens) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-echo", 1).json()["trace_id"]
    forged = Tokens("another-server-secret-0123456789abcdef").issue(s["session"])[0]
    expired = tokens.issue(s["session"], 60, now=time.time() - 120)[0]
    tampered = s["token"][:-2] + ("AA" if not s["token"].endswith("AA") else "BB")
    cases = {
        "missing": {},
        "not bearer": {"Authorization": f"Basic {s['token']}"},
        "garbage": bearer("garbage"),
        "garbage v1": bearer("dfs1.%%%.@@@"),
        "tampered": bearer(tampered),
        "forged": bearer(forged),
        "expired": bearer(expired),
        "admin is no session": bearer(ADMIN),
    }
    for what, headers in cases.items():
        for method, path in (
            ("GET", f"/runs/{trace}"),
            ("GET", f"/runs/{trace}/events"),
            ("POST", f"/runs/{trace}/cancel"),
            ("POST", f"/runs/{trace}/calls/x"),
        ):
            r = api.request(method, path, headers=headers, json={} if method == "POST" else None)
            assert r.status_code == 401, (what, path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            detail = r.json()["detail"]
            assert s["token"] not in detail and expired not in detail
    r = api.get(f"/runs/{trace}", headers=bearer(expired))
    assert "expired at" in r.json()["detail"] and "POST /sessions" in r.json()["detail"]
    r = api.get(f"/runs/{trace}", headers=bearer(forged))
    assert "signature" in r.json()["detail"]
    assert api.get(f"/runs/{trace}", headers=bearer(s["token"])).status_code == 200


def test_another_sessions_run_is_403_everywhere(api: httpx.Client) -> None:
    mine, theirs = new_session(api), new_session(api)
    trace = start(api, mine["token"], "srv-ask", "?").json()["trace_id"]
    wait_status(api, mine["token"], trace, until="waiting")
    other = bearer(theirs["token"])
    assert api.get(f"/runs/{trace}", headers=other).status_code == 403
    assert api.get(f"/runs/{trace}/events", headers=other).status_code == 403
    assert api.post(f"/runs/{trace}/calls/answer", headers=other, json="hijack").status_code == 403
    assert api.post(f"/runs/{trace}/cancel", headers=other).status_code == 403
    assert (
        wait_status(api, mine["token"], trace, until="waiting")["waiting_for"] == "answer"
    )  # nothing changed
    r = api.get(f"/runs/{trace}", headers=other)
    assert "another session" in r.json()["detail"]


def test_runs_not_started_in_a_session_are_403_and_unknown_runs_404(api: httpx.Client) -> None:
    s = new_session(api)
    outside = echo.call(5)  # started in this process, not through the API: no session
    assert outside.result(5) == {"echo": 5}
    assert api.get(f"/runs/{outside.trace_id}", headers=bearer(s["token"])).status_code == 403
    assert api.get("/runs/no-such-run", headers=bearer(s["token"])).status_code == 404
    assert api.get("/runs/bad%20id", headers=bearer(s["token"])).status_code == 422


def test_sessions_need_the_admin_token(api: httpx.Client) -> None:
    s = new_session(api)
    for headers in ({}, bearer("not-the-admin-token"), bearer(s["token"])):
        r = api.post("/sessions", headers=headers)
        assert r.status_code == 401 and "admin token" in r.json()["detail"]
    # a new session's run needs the admin token; a session's token starts runs in its session only
    assert api.post("/runs", json={"pipeline": "srv-echo"}).status_code == 401
    assert (
        api.post("/runs", headers=bearer("not-the-admin-token"), json={"pipeline": "srv-echo"}).status_code
        == 401
    )
    # the admin may mint a new token for an existing session, shorter-lived
    r = api.post("/sessions", headers=bearer(ADMIN), json={"session": s["session"], "ttl": 30})
    assert r.status_code == 201 and r.json()["session"] == s["session"]
    assert r.json()["expires_at"] <= time.time() + 31
    assert api.post("/sessions", headers=bearer(ADMIN), json={"ttl": 10**9}).status_code == 422
    assert api.post("/sessions", headers=bearer(ADMIN), json={"session": "a b"}).status_code == 422


def test_without_an_admin_token_sessions_are_open(runtime: dflow.Runtime) -> None:
    app = create_app(secret=SECRET, pipelines=[echo])
    with ServerThread(app) as base, httpx.Client(base_url=base) as api:
        s = api.post("/sessions").json()
        assert Tokens(SECRET).verify(s["token"]).id == s["session"]
        r = api.post("/runs", json={"pipeline": "srv-echo", "param": 2})
        assert r.status_code == 201 and "token" in r.json()
        assert wait_status(api, r.json()["token"], r.json()["trace_id"], until="done")["result"] == {
            "echo": 2
        }
        assert api.post("/runs", json={"pipeline": "srv-ask"}).status_code == 404  # not served by this app
        # but nobody renews a session there: session ids are readable in their tokens
        for headers in ({}, bearer(s["token"])):
            r = api.post("/sessions", headers=headers, json={"session": s["session"]})
            assert r.status_code in (401, 403) and "token" not in r.json(), r.text
        r = api.post("/sessions", json={"session": s["session"]})
        assert r.status_code == 403 and "admin token" in r.json()["detail"]


def test_an_open_server_answers_loopback_host_names_only(runtime: dflow.Runtime) -> None:
    app = create_app(secret=SECRET, pipelines=[echo])
    before = len(runtime.store._runs)  # type: ignore[attr-defined]
    with ServerThread(app) as base, httpx.Client(base_url=base) as api:
        port = base.rsplit(":", 1)[1]
        for host in (
            f"127.0.0.1:{port}",
            f"localhost:{port}",
            f"[::1]:{port}",
            "localhost",
            "LOCALHOST:1",
            "[::1]",
        ):
            assert api.get("/health", headers={"Host": host}).status_code == 200, host
        for host in (
            "rebind.evil.example",
            f"rebind.evil.example:{port}",
            "127.0.0.1.nip.io",
            "localhost.evil",
            "localhost:abc",
            "::1",
            f"10.0.0.1:{port}",
            "127.0.0.2",
            "localhost.",
        ):
            r = api.get("/health", headers={"Host": host})
            assert r.status_code == 421 and "localhost, 127.0.0.1 and [::1]" in r.json()["detail"], (
                host,
                r.text,
            )
            r = api.post("/runs", headers={"Host": host}, json={"pipeline": "srv-echo", "param": "rebound"})
            assert r.status_code == 421, (host, r.text)
            assert api.post("/sessions", headers={"Host": host}).status_code == 421
    assert len(runtime.store._runs) == before  # type: ignore[attr-defined]  # nothing was started


def test_an_open_server_refuses_writes_from_other_origins(runtime: dflow.Runtime) -> None:
    app = create_app(secret=SECRET, pipelines=[echo])
    with ServerThread(app) as base, httpx.Client(base_url=base) as api:
        before = len(runtime.store._runs)  # type: ignore[attr-defined]
        start_it = {"pipeline": "srv-echo", "param": "drive-by"}
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Origin": base.replace("127.0.0.1", "localhost")},  # another origin, on loopback
            {"Origin": base + "0"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": base, "Sec-Fetch-Site": "cross-site"},
        ):
            for path in ("/runs", "/sessions"):
                r = api.post(path, headers=headers, json=start_it if path == "/runs" else None)
                assert r.status_code == 403 and "web page" in r.json()["detail"], (headers, path, r.text)
        assert len(runtime.store._runs) == before  # type: ignore[attr-defined]
        # the server's own origin, and reads from anywhere (what they answer, a page cannot read)
        for headers in (
            {"Origin": base},
            {"Origin": base.upper()},
            {"Sec-Fetch-Site": "same-origin"},
            {"Sec-Fetch-Site": "none"},
        ):
            r = api.post("/runs", headers=headers, json={"pipeline": "srv-echo", "param": 3})
            assert r.status_code == 201, (headers, r.text)
        assert (
            api.get(
                "/health", headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
            ).status_code
            == 200
        )


def test_an_admin_server_checks_neither_host_nor_origin(api: httpx.Client) -> None:
    # its writes need a bearer token, which a web page cannot make a browser send
    assert api.get("/health", headers={"Host": "api.example.com"}).status_code == 200
    r = api.post(
        "/sessions", headers={**bearer(ADMIN), "Host": "api.example.com", "Origin": "https://app.example"}
    )
    assert r.status_code == 201


def test_bodies_must_be_sent_as_json(url: str, runtime: dflow.Runtime) -> None:
    with httpx.Client(base_url=url) as api:
        s = new_session(api)
        trace = start(api, s["token"], "srv-ask", "?").json()["trace_id"]
        wait_status(api, s["token"], trace, until="waiting")
        before = len(runtime.store._runs)  # type: ignore[attr-defined]
        body = b'{"pipeline": "srv-echo", "param": 1}'
        for kind in (
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/json",
            "application/jsonx",
            "",
            "application/json-patch",
        ):
            for method, path in (
                ("POST", "/runs"),
                ("POST", f"/runs/{trace}/calls/answer"),
                ("POST", f"/runs/{trace}/cancel"),
            ):
                r = api.request(
                    method, path, headers={**bearer(s["token"]), "Content-Type": kind}, content=body
                )
                assert r.status_code == 415 and "application/json" in r.json()["detail"], (kind, path, r.text)
            r = api.post("/sessions", headers={**bearer(ADMIN), "Content-Type": kind}, content=b"{}")
            assert r.status_code == 415
        assert len(runtime.store._runs) == before  # type: ignore[attr-defined]
        assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"
        for kind in ("application/json", "Application/JSON; charset=utf-8", "application/vnd.dflow+json"):
            r = api.post("/runs", headers={**bearer(s["token"]), "Content-Type": kind}, content=body)
            assert r.status_code == 201, (kind, r.text)


def test_tokens_unit() -> None:
    t = Tokens(SECRET, ttl=100)
    token, expires = t.issue("ann", now=1000.0)
    assert expires == 1100.0
    assert t.verify(token, now=1099.0) == Session("ann", 1100.0)
    # only the string issued verifies: no other spelling of the same bytes
    body, mac = token[5:].split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for other in (
        f"dfs1.{body}=.{mac}",
        f"dfs1.{body}.{mac}=",
        f"dfs1.{body}.{mac}==",
        f"dfs1.{body}\n.{mac}",
        f"dfs1.{body}.{mac[:-1]}{alphabet[alphabet.index(mac[-1]) ^ 1]}",  # other pad bits
        f"dfs1.{body}.{mac[:-1]}{alphabet[alphabet.index(mac[-1]) ^ 2]}",
        f"dfs1.{body.replace('-', '+').replace('_', '/')}.{mac.replace('-', '+').replace('_', '/')}",
        f"dfs1.{body}.{mac}A",
        f"dfs1. {body}.{mac}",
    ):
        if other != token:
            with pytest.raises(TokenError, match="not a dflow session token|does not verify"):
                t.verify(other, now=1099.0)
    with pytest.raises(TokenError) as err:
        t.verify(token, now=1100.0)
    assert err.value.expired
    with pytest.raises(TokenError, match="not a dflow session token"):
        t.verify("dfs1." + "A" * 600)
    with pytest.raises(ConfigurationError, match="at least 32"):
        Tokens("short")
    with pytest.raises(ValueError, match="session id"):
        t.issue("a\nb")
    with pytest.raises(ValueError, match="ttl"):
        t.issue("ann", ttl=10**9)
    assert Tokens().ephemeral and not t.ephemeral
    admin = AdminToken(ADMIN)
    assert admin.matches(ADMIN) and not admin.matches(ADMIN[:-1]) and not admin.matches("")
    assert ADMIN not in repr(admin)


# -- bad input --------------------------------------------------------------------------------


def test_bodies_that_are_too_big_or_not_json_are_refused_and_start_nothing(
    url: str, runtime: dflow.Runtime
) -> None:
    app_small = create_app(secret=SECRET, admin_token=ADMIN, pipelines=[echo], max_body=1000)
    before = len(runtime.store._runs)  # type: ignore[attr-defined]
    with ServerThread(app_small) as base, httpx.Client(base_url=base) as api:
        big = {"pipeline": "srv-echo", "param": "x" * 2000}
        r = api.post("/runs", headers=bearer(ADMIN), json=big)
        assert r.status_code == 413 and "limit of 1000 bytes" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds as it is read
            yield b'{"pipeline": "srv-echo", "param": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'"}'

        r = api.post("/runs", headers=bearer(ADMIN), content=chunks())
        assert r.status_code == 413
        r = api.post(
            "/runs", headers={**bearer(ADMIN), "Content-Type": "application/json"}, content=b"{not json"
        )
        assert r.status_code == 400 and "not JSON" in r.json()["detail"]
        r = api.post("/runs", headers=bearer(ADMIN), content=b"[" * 400 + b"]" * 400)
        assert r.status_code == 422  # JSON, but not a start request
        assert api.post("/runs", headers=bearer(ADMIN)).status_code == 400
        r = api.post("/runs", headers=bearer(ADMIN), json={"pipeline": "srv-echo", "bogus": 1})
        assert r.status_code == 422 and "bogus" in r.json()["detail"]
        r = api.post("/runs", headers=bearer(ADMIN), json={"pipeline": "nope"})
        assert r.status_code == 404 and "echo" in r.json()["detail"]
        r = api.post("/runs", headers=bearer(ADMIN), json={"pipeline": "srv-echo", "trace_id": "has/slash"})
        assert r.status_code == 422
    assert len(runtime.store._runs) == before  # type: ignore[attr-defined]  # nothing was started


def test_nan_and_infinity_are_not_json(api: httpx.Client) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")
    h = {**bearer(s["token"]), "Content-Type": "application/json"}
    for constant in (b"NaN", b"Infinity", b"-Infinity", b"[1, NaN]", b'{"a": {"b": Infinity}}'):
        r = api.post("/runs", headers=h, content=b'{"pipeline": "srv-echo", "param": ' + constant + b"}")
        assert r.status_code == 400 and "not a JSON value" in r.json()["detail"], (constant, r.text)
        r = api.post(f"/runs/{trace}/calls/answer", headers=h, content=constant)
        assert r.status_code == 400, (constant, r.text)
    assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"
    r = api.post("/runs", headers=h, content=b'{"pipeline": "srv-echo", "param": [1e308, -0.0, "NaN"]}')
    assert r.status_code == 201  # numbers JSON has, and a string, are fine
    assert wait_status(api, s["token"], r.json()["trace_id"], until="done")["result"] == {
        "echo": [1e308, -0.0, "NaN"]
    }


def test_an_event_stream_ends_with_an_error_when_its_token_expires(api: httpx.Client, tokens: Tokens) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "srv-ask", "?").json()["trace_id"]
    wait_status(api, s["token"], trace, until="waiting")
    short, expires = tokens.issue(s["session"], 1)
    t0 = time.time()
    events = sse(api, f"/runs/{trace}/events", bearer(short))
    assert expires <= time.time() < expires + 3 and time.time() - t0 < 4  # it ended at the expiry
    assert [e[0] for e in events] == ["step"] * (len(events) - 1) + ["error"] and len(events) >= 2
    assert "token expired" in events[-1][2]["error"] and events[-1][2]["trace_id"] == trace
    assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"  # the run goes on
    # a hostile Last-Event-ID is no index: the whole stream
    assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json=1).status_code == 202
    wait_status(api, s["token"], trace, until="done")
    whole = sse(api, f"/runs/{trace}/events", bearer(s["token"]))
    for last in (b"\xb2", b"\xd9\xa3", "\u0663".encode(), b"1" * 5000, b"+1", b"1 2", b"-0"):
        again = sse(api, f"/runs/{trace}/events", {**bearer(s["token"]), "Last-Event-ID": last})
        assert again == whole or (len(last) > 18 and [e[0] for e in again] == ["end"]), last[:10]


def test_a_run_created_again_under_its_trace_id_is_read_afresh(url: str, runtime: dflow.Runtime) -> None:
    """Two apps are two server processes, each with its index of runs by session: a run that
    expired and was created again under its trace id in another session is the new session's
    on both."""
    other = create_app(tokens=Tokens(SECRET, ttl=600), admin_token=ADMIN, pipelines=["srv-echo"])
    with (
        ServerThread(other) as other_url,
        httpx.Client(base_url=url) as a,
        httpx.Client(base_url=other_url) as b,
    ):
        first, second = new_session(a), new_session(b)
        trace = f"again-{time.time_ns()}"
        assert start(a, first["token"], "srv-echo", 1, trace_id=trace).status_code == 201
        assert wait_status(a, first["token"], trace, until="done")["result"] == {"echo": 1}  # a knows it now
        del runtime.store._runs[trace]  # type: ignore[attr-defined]  # it expired
        assert a.get(f"/runs/{trace}", headers=bearer(first["token"])).status_code == 404
        assert start(b, second["token"], "srv-echo", 2, trace_id=trace).status_code == 201
        for api in (a, b):
            assert api.get(f"/runs/{trace}", headers=bearer(first["token"])).status_code == 403
            assert wait_status(api, second["token"], trace, until="done")["result"] == {"echo": 2}
        # the same, when the first server started the run but never read it
        trace = f"again-{time.time_ns()}"
        assert start(a, first["token"], "srv-echo", 3, trace_id=trace).status_code == 201
        wait_status(b, first["token"], trace, until="done")
        del runtime.store._runs[trace]  # type: ignore[attr-defined]
        assert start(b, second["token"], "srv-echo", 4, trace_id=trace).status_code == 201
        assert a.get(f"/runs/{trace}", headers=bearer(first["token"])).status_code == 403
        assert wait_status(a, second["token"], trace, until="done")["result"] == {"echo": 4}


def test_json_nested_beyond_reason_is_400(api: httpx.Client) -> None:
    r = api.post("/runs", headers=bearer(ADMIN), content=b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"]


def test_a_taken_trace_id_is_409(api: httpx.Client) -> None:
    s = new_session(api)
    trace = f"mine-{time.time_ns()}"
    assert start(api, s["token"], "srv-echo", 1, trace_id=trace).status_code == 201
    r = start(api, s["token"], "srv-echo", 2, trace_id=trace)
    assert r.status_code == 409
    assert wait_status(api, s["token"], trace, until="done")["result"] == {"echo": 1}


# -- extension --------------------------------------------------------------------------------


def test_route_providers_add_routes_that_use_the_sessions(runtime: dflow.Runtime) -> None:
    seen: list[Server] = []

    def provider(server: Server) -> APIRouter:
        seen.append(server)
        router = APIRouter()

        @router.get("/whoami")
        async def whoami(session: Session = Depends(server.require_session)) -> dict[str, str]:
            return {"session": session.id}

        return router

    app = create_app(secret=SECRET, admin_token=ADMIN, routes=[provider, lambda server: None])
    assert seen == [app.state.dflow]
    with ServerThread(app) as base, httpx.Client(base_url=base) as api:
        s = api.post("/sessions", headers=bearer(ADMIN)).json()
        assert api.get("/whoami", headers=bearer(s["token"])).json() == {"session": s["session"]}
        assert api.get("/whoami").status_code == 401
    with pytest.raises(TypeError, match="not an APIRouter"):
        create_app(routes=[lambda server: "nope"])  # type: ignore[list-item, arg-type, return-value]


def test_route_providers_reserve_their_call_types_and_trace_ids(runtime: dflow.Runtime) -> None:
    def provider(server: Server) -> None:
        server.reserve_call_prefix("my-ext:", "POST /mine")
        server.reserve_trace_prefix("my-ext.")

    app = create_app(secret=SECRET, admin_token=ADMIN, pipelines=[ask], routes=[provider])
    with ServerThread(app) as base, httpx.Client(base_url=base) as api:
        s = new_session(api)
        for trace in ("my-ext.1", "my-ext.x"):
            r = start(api, s["token"], "srv-ask", "?", trace_id=trace)
            assert r.status_code == 422 and "reserved" in r.json()["detail"], r.text
        trace = start(api, s["token"], "srv-ask", "?", trace_id="my-ext-not-reserved").json()["trace_id"]
        wait_status(api, s["token"], trace, until="waiting")
        for call_type in ("my-ext:", "my-ext:answer"):
            r = api.post(f"/runs/{trace}/calls/{call_type}", headers=bearer(s["token"]), json=1)
            assert r.status_code == 403 and "POST /mine" in r.json()["detail"], r.text
        assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json=1).status_code == 202
    for bad in ("", "a b", "\u00e9", "x" * 129, 5):
        with pytest.raises(ValueError, match="reserved prefix"):
            app.state.dflow.reserve_call_prefix(bad, "x")
        with pytest.raises(ValueError, match="reserved prefix"):
            app.state.dflow.reserve_trace_prefix(bad)


def test_dflow_serve_refuses_an_open_server_off_loopback() -> None:
    env = {**os.environ, "DFLOW_SECRET": SECRET, "DFLOW_SERVER_TOKEN": ""}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflow.cli",
            "serve",
            "json",
            "--store",
            "redis://127.0.0.1:1/0",
            "--transport",
            "redis://127.0.0.1:1/0",
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2 and "DFLOW_SERVER_TOKEN" in out.stderr
