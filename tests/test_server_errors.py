"""How the HTTP API and the console refuse a request: each refusal's status, body and headers
(``Content-Type``, ``WWW-Authenticate``, ``Retry-After``) are pinned here, one row per kind
of refusal, so that a change to any of them shows up as a change of the API. The server's
error table (``dflow.server.errors``) makes them; this file checks what a client receives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow
from dflow.server import Server, ServerThread, Tokens, create_app
from tests.support import http_api
from tests.support.console import login
from tests.support.http_api import bearer, start, wait_status

ADMIN = "admin-token-of-the-server-error-tests-01234"
SECRET = "server-secret-of-the-server-error-tests-0123"
WAITING = "err-waiting"  # the trace ids of the runs the refusals are about
DONE = "err-done"
THEIRS = "err-theirs"
EXPIRED_AT = 1_700_000_000.0  # when the expired token expired (its message says so)


def _ask(question: Any) -> DFlow[Any]:
    return DFlow.from_call("err-answer")


echo = DFlow.from_call("err-echo").map(lambda x: {"echo": x}).id("wrap").init("err-echo")
ask = DFlow.from_call("err-ask").flat_map(_ask).id("wait").map(lambda a: {"got": a}).id("got").init("err-ask")


def _reserving(server: Server) -> None:
    server.reserve_call_prefix("err-ext:", "POST /ext")
    server.reserve_trace_prefix("err-ext.")


@dataclass
class World:
    """The clients and the state the refusals are made against."""

    api: httpx.Client  #: the app with an admin token (bodies up to 16 MiB)
    small: httpx.Client  #: the same, with bodies of at most 1000 bytes
    open: httpx.Client  #: an app without an admin token
    browser: httpx.Client  #: logged into the console with a cookie
    mine: str  #: a session token of the session that started the runs
    theirs: str  #: a session token of another session
    expired: str  #: an expired token of the first session
    forged: str  #: a token of the first session signed with another secret


@pytest.fixture(scope="module")
def world(runtime: dflow.Runtime) -> Iterator[World]:
    tokens = Tokens(SECRET, ttl=600)
    served = ["err-echo", "err-ask"]
    big = create_app(
        tokens=tokens, admin_token=ADMIN, pipelines=served, routes=[_reserving], max_body=16 << 20
    )
    small = create_app(tokens=tokens, admin_token=ADMIN, pipelines=served, max_body=1000)
    opened = create_app(tokens=tokens, pipelines=served)
    with (
        ServerThread(big) as big_url,
        ServerThread(small) as small_url,
        ServerThread(opened) as open_url,
        httpx.Client(base_url=big_url, timeout=30) as api,
        httpx.Client(base_url=small_url, timeout=30) as small_api,
        httpx.Client(base_url=open_url, timeout=30) as open_api,
        httpx.Client(base_url=big_url, timeout=30) as browser,
    ):
        mine = http_api.new_session(api, ADMIN)
        theirs = http_api.new_session(api, ADMIN)
        assert start(api, mine["token"], "err-ask", "?", trace_id=WAITING).status_code == 201
        assert start(api, mine["token"], "err-echo", 1, trace_id=DONE).status_code == 201
        assert start(api, theirs["token"], "err-ask", "?", trace_id=THEIRS).status_code == 201
        wait_status(api, mine["token"], WAITING, until="waiting")
        wait_status(api, mine["token"], DONE, until="done")
        wait_status(api, theirs["token"], THEIRS, until="waiting")
        login(browser, ADMIN)
        yield World(
            api,
            small_api,
            open_api,
            browser,
            mine["token"],
            theirs["token"],
            tokens.issue(mine["session"], 60, now=EXPIRED_AT - 60)[0],
            Tokens("another-server-secret-0123456789abcdef").issue(mine["session"])[0],
        )


def _json(content: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", "Content-Length": str(len(content))}


def _streamed() -> Iterator[bytes]:  # a body with no Content-Length, over the small app's limit
    yield b'{"pipeline": "err-echo", "param": "'
    for _ in range(10):
        yield b"y" * 200
    yield b'"}'


Ask = Callable[[World], httpx.Response]
ADMIN_H = bearer(ADMIN)

#: each kind of refusal: what is sent (to which app, as whom)
ASKED: dict[str, Ask] = {
    # sessions
    "a session without the admin token": lambda w: w.api.post("/sessions"),
    "a session with a bad body": lambda w: w.api.post("/sessions", headers=ADMIN_H, json={"bogus": 1}),
    "a session with a bad id": lambda w: w.api.post("/sessions", headers=ADMIN_H, json={"session": "a b"}),
    "a session with too long a ttl": lambda w: w.api.post("/sessions", headers=ADMIN_H, json={"ttl": 10**9}),
    "a renewed session on an open server": lambda w: w.open.post("/sessions", json={"session": "ann"}),
    # tokens
    "a run without a token": lambda w: w.api.post("/runs", json={"pipeline": "err-echo"}),
    "a run with a token that is no token": lambda w: w.api.post(
        "/runs", headers=bearer("garbage"), json={"pipeline": "err-echo"}
    ),
    "a run with a malformed session token": lambda w: w.api.post(
        "/runs", headers=bearer("dfs1.%%%.@@@"), json={"pipeline": "err-echo"}
    ),
    "a status without a token": lambda w: w.api.get(f"/runs/{WAITING}"),
    "a status with an expired token": lambda w: w.api.get(f"/runs/{WAITING}", headers=bearer(w.expired)),
    "a status with a forged token": lambda w: w.api.get(f"/runs/{WAITING}", headers=bearer(w.forged)),
    "the pipelines without a token": lambda w: w.api.get("/pipelines"),
    # runs
    "an unserved pipeline": lambda w: start(w.api, w.mine, "nope"),
    "a start with a bad body": lambda w: w.api.post(
        "/runs", headers=bearer(w.mine), json={"pipeline": "err-echo", "bogus": 1}
    ),
    "a start that is no object": lambda w: w.api.post("/runs", headers=bearer(w.mine), json=[1]),
    "a trace id a run cannot have": lambda w: start(w.api, w.mine, "err-echo", trace_id="has/slash"),
    "a reserved trace id": lambda w: start(w.api, w.mine, "err-echo", trace_id="err-ext.1"),
    "a taken trace id": lambda w: start(w.api, w.mine, "err-echo", 2, trace_id=DONE),
    "a parameter over the runtime's limit": lambda w: start(
        w.api, w.mine, "err-echo", "x" * (9 << 20), trace_id="err-too-big"
    ),
    "the status of no run": lambda w: w.api.get("/runs/no-such-run", headers=bearer(w.mine)),
    "the status of a bad trace id": lambda w: w.api.get("/runs/bad%20id", headers=bearer(w.mine)),
    "the status of another session's run": lambda w: w.api.get(f"/runs/{THEIRS}", headers=bearer(w.mine)),
    "the events of another session's run": lambda w: w.api.get(
        f"/runs/{THEIRS}/events", headers=bearer(w.mine)
    ),
    "a call the run does not wait for, refused with if_waiting": lambda w: w.api.post(
        f"/runs/{WAITING}/calls/other?if_waiting=true", headers=bearer(w.mine), json=1
    ),
    "a call to a run that ended": lambda w: w.api.post(
        f"/runs/{DONE}/calls/err-answer", headers=bearer(w.mine), json=1
    ),
    "a call of a reserved type": lambda w: w.api.post(
        f"/runs/{WAITING}/calls/err-ext:x", headers=bearer(w.mine), json=1
    ),
    "a call over the runtime's limit": lambda w: w.api.post(
        f"/runs/{WAITING}/calls/err-answer", headers=bearer(w.mine), json="x" * (9 << 20)
    ),
    "a cancel with a bad body": lambda w: w.api.post(
        f"/runs/{WAITING}/cancel", headers=bearer(w.mine), json={"reason": 5}
    ),
    # bodies
    "a body not sent as JSON": lambda w: w.api.post(
        "/runs", headers={**bearer(w.mine), "Content-Type": "text/plain"}, content=b"{}"
    ),
    "a body whose length is over the limit": lambda w: w.small.post(
        "/runs", headers=ADMIN_H, json={"pipeline": "err-echo", "param": "x" * 2000}
    ),
    "a body that grows over the limit": lambda w: w.small.post("/runs", headers=ADMIN_H, content=_streamed()),
    "a missing body": lambda w: w.api.post("/runs", headers=bearer(w.mine)),
    "a body that is not JSON": lambda w: w.api.post(
        "/runs", headers={**bearer(w.mine), **_json(b"{not json")}, content=b"{not json"
    ),
    "a body with NaN": lambda w: w.api.post(
        "/runs", headers={**bearer(w.mine), **_json(b"[NaN]")}, content=b"[NaN]"
    ),
    "a body nested too deeply": lambda w: w.api.post(
        "/runs", headers=bearer(w.mine), content=b"[" * 100_000 + b"]" * 100_000
    ),
    # an open server
    "an open server under another host name": lambda w: w.open.get(
        "/health", headers={"Host": "evil.example"}
    ),
    "a write from another origin to an open server": lambda w: w.open.post(
        "/sessions", headers={"Origin": "http://evil.example"}
    ),
    "a cross-site write to an open server": lambda w: w.open.post(
        "/sessions", headers={"Sec-Fetch-Site": "cross-site"}
    ),
    # the console
    "the console's runs without a login": lambda w: w.api.get("/console/api/runs"),
    "the console's runs with a bad status": lambda w: w.api.get(
        "/console/api/runs", headers=ADMIN_H, params={"status": "bogus"}
    ),
    "the console's runs with a bad limit": lambda w: w.api.get(
        "/console/api/runs", headers=ADMIN_H, params={"limit": "0"}
    ),
    "the console's runs with too long a pipeline": lambda w: w.api.get(
        "/console/api/runs", headers=ADMIN_H, params={"pipeline": "p" * 20_000}
    ),
    "the console's runs with a cursor of no store": lambda w: w.api.get(
        "/console/api/runs", headers=ADMIN_H, params={"cursor": "garbage"}
    ),
    "the console's page of a bad run id": lambda w: w.api.get("/console/runs/bad%20id", headers=ADMIN_H),
    "the console's tree of a bad run id": lambda w: w.api.get(
        "/console/api/runs/bad%20id/tree", headers=ADMIN_H
    ),
    "the console's tree of no run": lambda w: w.api.get(
        "/console/api/runs/no-such-run/tree", headers=ADMIN_H
    ),
    "the console's step that is no number": lambda w: w.api.get(
        f"/console/api/runs/{DONE}/steps/abc", headers=ADMIN_H
    ),
    "the console's step a run does not have": lambda w: w.api.get(
        f"/console/api/runs/{DONE}/steps/99", headers=ADMIN_H
    ),
    "the console's static file that is not served": lambda w: w.api.get("/console/static/nope.js"),
    "the console's cancel of no run": lambda w: w.api.post(
        "/console/api/runs/no-such-run/cancel", headers=ADMIN_H, json={}
    ),
    "the console's answer the run does not wait for": lambda w: w.api.post(
        f"/console/api/runs/{WAITING}/answer", headers=ADMIN_H, json={"call_type": "other", "payload": 1}
    ),
    "the console's answer to a run that is no branch": lambda w: w.api.post(
        f"/console/api/runs/{WAITING}/answer",
        headers=ADMIN_H,
        json={"call_type": "err-answer", "run": DONE},
    ),
    "the console's answer of a reserved type": lambda w: w.api.post(
        f"/console/api/runs/{WAITING}/answer", headers=ADMIN_H, json={"call_type": "err-ext:x"}
    ),
    "the console's answer to no run": lambda w: w.api.post(
        "/console/api/runs/no-such-run/answer", headers=ADMIN_H, json={"call_type": "x"}
    ),
    "the console's rerun of a waiting run": lambda w: w.api.post(
        f"/console/api/runs/{WAITING}/rerun", headers=ADMIN_H, json={"seq": 1}
    ),
    "the console's rerun from a step a run does not have": lambda w: w.api.post(
        f"/console/api/runs/{DONE}/rerun", headers=ADMIN_H, json={"seq": 9}
    ),
    "the console's rerun of no run": lambda w: w.api.post(
        "/console/api/runs/no-such-run/rerun", headers=ADMIN_H, json={"seq": 1}
    ),
    "the console's rerun with a bad body": lambda w: w.api.post(
        f"/console/api/runs/{DONE}/rerun", headers=ADMIN_H, json={"seq": -1}
    ),
    "the console's action without the anti-forgery token": lambda w: w.browser.post(
        f"/console/api/runs/{WAITING}/cancel", json={}
    ),
    "the console's action from another origin": lambda w: w.browser.post(
        f"/console/api/runs/{WAITING}/cancel", headers={"Origin": "http://evil.example"}, json={}
    ),
    "the console's action marked cross-site": lambda w: w.browser.post(
        f"/console/api/runs/{WAITING}/cancel", headers={"Sec-Fetch-Site": "cross-site"}, json={}
    ),
    "the console's login not sent as a form": lambda w: w.api.post("/console/login", json={"token": "x"}),
    "the console's login form too big": lambda w: w.api.post("/console/login", data={"token": "x" * 5000}),
    "the console's login form that is no form": lambda w: w.api.post(
        "/console/login",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        content=b"token=\xff\xfe",
    ),
}

JSON = {"content-type": "application/json"}
BEARER = {**JSON, "www-authenticate": "Bearer"}
#: what each refusal answers: its status, its ``detail``, its headers
PINNED: dict[str, tuple[int, str, dict[str, str]]] = {
    "a session without the admin token": (
        401,
        "creating sessions needs the admin token (DFLOW_SERVER_TOKEN) as the bearer token",
        BEARER,
    ),
    "a session with a bad body": (422, "invalid body: bogus: Extra inputs are not permitted", JSON),
    "a session with a bad id": (422, "a session id is 1 to 128 letters, digits and _ : @ -, got 'a b'", JSON),
    "a session with too long a ttl": (
        422,
        "a token's ttl is seconds between 1 and 86400, got 1000000000.0",
        JSON,
    ),
    "a renewed session on an open server": (
        403,
        "only the admin token (DFLOW_SERVER_TOKEN) renews an existing session's token, and this server has none: create a new session (POST /sessions without 'session')",
        JSON,
    ),
    "a run without a token": (
        401,
        "starting a run needs a session token (or the admin token to start a new session)",
        BEARER,
    ),
    "a run with a token that is no token": (
        401,
        "the bearer token is neither a session token nor the admin token",
        BEARER,
    ),
    "a run with a malformed session token": (401, "the bearer token is not a dflow session token", BEARER),
    "a status without a token": (
        401,
        "this needs a session token: send the header 'Authorization: Bearer <token>'",
        BEARER,
    ),
    "a status with an expired token": (
        401,
        "the session token expired at 2023-11-14T22:13:20Z; ask for a new one (POST /sessions)",
        BEARER,
    ),
    "a status with a forged token": (
        401,
        "the session token's signature does not verify (forged, or issued by another server)",
        BEARER,
    ),
    "the pipelines without a token": (
        401,
        "this needs a session token: send the header 'Authorization: Bearer <token>'",
        BEARER,
    ),
    "an unserved pipeline": (404, "no pipeline 'nope' is served; served: err-ask, err-echo", JSON),
    "a start with a bad body": (422, "invalid body: bogus: Extra inputs are not permitted", JSON),
    "a start that is no object": (
        422,
        "invalid body: body: Input should be a valid dictionary or instance of StartRun",
        JSON,
    ),
    "a trace id a run cannot have": (
        422,
        "the trace id 'has/slash' contains '/', which only branch runs of zip/any have",
        JSON,
    ),
    "a reserved trace id": (
        422,
        "trace ids starting with 'err-ext.' are reserved for the server's own runs: choose another",
        JSON,
    ),
    "a taken trace id": (409, "a run 'err-done' exists already: choose another trace_id, or none", JSON),
    "a parameter over the runtime's limit": (
        413,
        "the parameter of run 'err-too-big' is 9437189 bytes, over the limit of 8388608 bytes",
        JSON,
    ),
    "the status of no run": (404, "no run 'no-such-run' (never started, or expired)", JSON),
    "the status of a bad trace id": (
        422,
        "the trace id 'bad id' may only contain letters, digits and _ . : @ -",
        JSON,
    ),
    "the status of another session's run": (
        403,
        "run 'err-theirs' belongs to another session: this token cannot see or change it",
        JSON,
    ),
    "the events of another session's run": (
        403,
        "run 'err-theirs' belongs to another session: this token cannot see or change it",
        JSON,
    ),
    "a call the run does not wait for, refused with if_waiting": (
        409,
        "run 'err-waiting' waits for call 'err-answer', not 'other'",
        JSON,
    ),
    "a call to a run that ended": (
        409,
        "run 'err-done' has finished (done); it takes no more calls (got 'err-answer')",
        JSON,
    ),
    "a call of a reserved type": (
        403,
        "calls of type err-ext:... are answered through their own route (POST /ext), not this one",
        JSON,
    ),
    "a call over the runtime's limit": (
        413,
        "the payload of call 'err-answer' to run 'err-waiting' is 9437189 bytes, over the limit of 8388608 bytes",
        JSON,
    ),
    "a cancel with a bad body": (422, "invalid body: reason: Input should be a valid string", JSON),
    "a body not sent as JSON": (
        415,
        "the body must be JSON, sent with 'Content-Type: application/json' (not 'text/plain')",
        JSON,
    ),
    "a body whose length is over the limit": (
        413,
        "the body is 2034 bytes, over the limit of 1000 bytes",
        JSON,
    ),
    "a body that grows over the limit": (413, "the body is over the limit of 1000 bytes", JSON),
    "a missing body": (400, "the request needs a JSON body", JSON),
    "a body that is not JSON": (
        400,
        "the body is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        JSON,
    ),
    "a body with NaN": (
        400,
        "the body is not JSON: NaN is not a JSON value (RFC 8259); send a number, a string or null",
        JSON,
    ),
    "a body nested too deeply": (400, "the body is not JSON: nested too deeply", JSON),
    "an open server under another host name": (
        421,
        "this server has no admin token (DFLOW_SERVER_TOKEN), so it answers only to the host names localhost, 127.0.0.1 and [::1], not 'evil.example': use one of those, or give the server an admin token",
        JSON,
    ),
    "a write from another origin to an open server": (
        403,
        "a request from the web page of another origin ('http://evil.example') may not change anything on a server without an admin token: call it from this machine's programs, not a web page",
        JSON,
    ),
    "a cross-site write to an open server": (
        403,
        "a request that the browser marks as cross-site may not change anything on a server without an admin token: call it from this machine's programs, not a web page",
        JSON,
    ),
    "the console's runs without a login": (
        401,
        "the console needs you to log in (GET /console/login) with the server's admin token (DFLOW_SERVER_TOKEN), or a script to send it as 'Authorization: Bearer <token>'",
        BEARER,
    ),
    "the console's runs with a bad status": (
        422,
        "status 'bogus' is not a run status: use one of running, sleeping, waiting, done, failed, cancelled, compensated, timed_out",
        JSON,
    ),
    "the console's runs with a bad limit": (422, "limit is a number of runs from 1 to 200, got '0'", JSON),
    "the console's runs with too long a pipeline": (
        422,
        "pipeline is 20000 characters long, over the limit of 16384",
        JSON,
    ),
    "the console's runs with a cursor of no store": (
        400,
        "malformed run cursor 'garbage': pass back the cursor of the page before, unchanged (or none for the first page) (start again from the first page)",
        JSON,
    ),
    "the console's page of a bad run id": (
        404,
        "'bad id' is not a run id: runs are named with letters, digits and _ . : @ - (a branch adds /<step>-<index>)",
        JSON,
    ),
    "the console's tree of a bad run id": (
        404,
        "'bad id' is not a run id: runs are named with letters, digits and _ . : @ - (a branch adds /<step>-<index>)",
        JSON,
    ),
    "the console's tree of no run": (404, "no run 'no-such-run' (never started, or expired)", JSON),
    "the console's step that is no number": (404, "'abc' is not a step number", JSON),
    "the console's step a run does not have": (404, "run 'err-done' has no step 99", JSON),
    "the console's static file that is not served": (
        404,
        "no static file 'nope.js': the console serves only console.css, console.js",
        JSON,
    ),
    "the console's cancel of no run": (404, "no run 'no-such-run' (never started, or expired)", JSON),
    "the console's answer the run does not wait for": (
        409,
        "run 'err-waiting' waits for call 'err-answer', not 'other'",
        JSON,
    ),
    "the console's answer to a run that is no branch": (
        422,
        "run 'err-done' is not this run nor one of its branches",
        JSON,
    ),
    "the console's answer of a reserved type": (
        403,
        "calls of type err-ext:... are answered through their own route (POST /ext), not this one",
        JSON,
    ),
    "the console's answer to no run": (
        404,
        "no run with trace id 'no-such-run' (never started, or expired)",
        JSON,
    ),
    "the console's rerun of a waiting run": (
        409,
        "run 'err-waiting' is still waiting: a rerun would race it. Cancel it first (Run.cancel, dflow cancel) or wait for it to end",
        JSON,
    ),
    "the console's rerun from a step a run does not have": (
        409,
        "run 'err-done' has no step 9 to rerun from: its steps are 1 to 1",
        JSON,
    ),
    "the console's rerun of no run": (404, "no run 'no-such-run' (never started, or expired)", JSON),
    "the console's rerun with a bad body": (
        422,
        "invalid body: seq: Input should be greater than or equal to 0",
        JSON,
    ),
    "the console's action without the anti-forgery token": (
        403,
        "this action needs the console page's anti-forgery token in the X-DFlow-CSRF header (reload the console page and try again)",
        JSON,
    ),
    "the console's action from another origin": (
        403,
        "a page of another origin ('http://evil.example') may not act in the console",
        JSON,
    ),
    "the console's action marked cross-site": (
        403,
        "the browser marks this request as coming from another site: the console refuses it",
        JSON,
    ),
    "the console's login not sent as a form": (
        415,
        "the login form is sent as application/x-www-form-urlencoded",
        JSON,
    ),
    "the console's login form too big": (413, "a login form is at most 4096 bytes", JSON),
    "the console's login form that is no form": (400, "the login form is not a URL-encoded form", JSON),
}


def test_every_refusal_keeps_its_status_body_and_headers(world: World) -> None:
    answered = {}
    for what, ask in ASKED.items():
        r = ask(world)
        shown = {
            k: r.headers[k] for k in ("content-type", "www-authenticate", "retry-after") if k in r.headers
        }
        answered[what] = (r.status_code, r.json()["detail"], shown)
    for what in ASKED:
        assert answered[what] == PINNED[what], what
    assert set(PINNED) == set(ASKED)
