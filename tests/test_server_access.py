"""Who may do what over ``dflow serve``'s HTTP API (``dflow.server``), over real sockets on the
in-memory runtime.

Attacks: tampered, forged, re-signed, swapped and malleable tokens; tokens outside the
``Authorization`` header; very long and non-ASCII bearer values; another session's runs
(status, events, calls, cancel) and chosen or guessed trace ids; private and unserved
pipelines; garbage, non-standard and oddly typed bodies; answering calls a run does not wait
for; server-sent events on unknown, finished and foreign runs, with hostile ``Last-Event-ID``;
the binding rules; and, on a server without an admin token, renewing an expired token from
the session id it carries (cross-site posts and DNS rebinding against such a server are in
``tests/integration/test_security_redis.py``, against a real ``dflow serve``).

Tests marked ``xfail(strict=True)`` show a defect that is still there (the reason names it).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow
from dflow.server import ServerThread, Tokens, create_app, is_loopback
from tests.support import http_api
from tests.support.http_api import bearer, sse_events, start, wait_status

ADMIN = "admin-token-of-the-review-server-tests-0123456789"
SECRET = "server-secret-of-the-review-server-tests-0123456789"


def _wait_for_answer(question: Any) -> DFlow[Any]:
    return DFlow.from_call("answer")


echo = DFlow.from_call("rv-srv-echo").map(lambda x: {"echo": x}).id("wrap").init("rv-srv-echo")
ask = (
    DFlow.from_call("rv-srv-ask")
    .map(lambda q: f"Q: {q}")
    .id("question")
    .flat_map(_wait_for_answer)
    .id("wait")
    .map(lambda a: {"answered": a})
    .id("done")
    .init("rv-srv-ask")
)
private = DFlow.from_call("_rv-srv-private").map(lambda x: x).id("p").init("_rv-srv-private")
SERVED = ["rv-srv-echo", "rv-srv-ask"]


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens(SECRET, ttl=600)


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime, tokens: Tokens) -> Iterator[str]:
    # pipelines=None: every pipeline of this process but the "_" ones (the default of dflow serve)
    app = create_app(tokens=tokens, admin_token=ADMIN)
    with ServerThread(app) as base:
        yield base


@pytest.fixture(scope="module")
def open_url(runtime: dflow.Runtime, tokens: Tokens) -> Iterator[str]:
    """A server without an admin token (what ``dflow serve`` runs on loopback by default)."""
    app = create_app(tokens=tokens, pipelines=SERVED)
    with ServerThread(app) as base:
        yield base


def new_session(api: httpx.Client, **body: Any) -> dict[str, Any]:
    return http_api.new_session(api, ADMIN, **body)


def waiting_run(api: httpx.Client, token: str) -> str:
    r = start(api, token, "rv-srv-ask", "?")
    assert r.status_code == 201, r.text
    trace = str(r.json()["trace_id"])
    wait_status(api, token, trace, until="waiting")
    return trace


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _parts(token: str) -> tuple[bytes, bytes]:
    body, mac = token.removeprefix("dfs1.").split(".")
    return _unb64(body), _unb64(mac)


def _token(body: bytes, mac: bytes) -> str:
    return f"dfs1.{_b64(body)}.{_b64(mac)}"


def assert_refused(api: httpx.Client, trace: str, token: str | bytes, what: str) -> None:
    """401 on every route of the run, and the token is never echoed."""
    shown = token.decode("latin-1") if isinstance(token, bytes) else token
    for method, path in (
        ("GET", f"/runs/{trace}"),
        ("GET", f"/runs/{trace}/events"),
        ("POST", f"/runs/{trace}/calls/answer"),
        ("POST", f"/runs/{trace}/cancel"),
    ):
        r = api.request(method, path, headers=bearer(token), json="x" if method == "POST" else None)
        assert r.status_code == 401, (what, method, path, r.status_code, r.text)
        assert shown not in r.text or len(shown) < 8, (what, "the token is echoed")


# -- tokens ------------------------------------------------------------------------------------


def test_every_single_bit_flip_of_a_token_is_refused(api: httpx.Client, tokens: Tokens) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    body, mac = _parts(s["token"])
    tried = 0
    for which in ("body", "mac"):
        data = body if which == "body" else mac
        for i in range(len(data)):
            for bit in (0, 7):
                flipped = bytearray(data)
                flipped[i] ^= 1 << bit
                forged = _token(bytes(flipped), mac) if which == "body" else _token(body, bytes(flipped))
                r = api.get(f"/runs/{trace}", headers=bearer(forged))
                assert r.status_code == 401, (which, i, bit, r.text)
                tried += 1
    assert tried >= 4 * 32
    assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"


def test_swapped_resigned_and_unkeyed_tokens_are_refused(api: httpx.Client, tokens: Tokens) -> None:
    mine, theirs = new_session(api), new_session(api)
    trace = waiting_run(api, mine["token"])
    my_body, my_mac = _parts(mine["token"])
    their_body, their_mac = _parts(theirs["token"])
    session, _, expiry = my_body.decode().partition("\n")
    later = f"{session}\n{int(expiry) + 10**6}".encode()
    cases = {
        "their session with my signature": _token(their_body, my_mac),
        "my session with their signature": _token(my_body, their_mac),
        "a later expiry, old signature": _token(later, my_mac),
        "HMAC with the raw secret (no domain key)": _token(
            my_body, hmac.digest(SECRET.encode(), my_body, "sha256")
        ),
        "unkeyed SHA-256": _token(my_body, hashlib.sha256(my_body).digest()),
        "HMAC keyed with the admin token": _token(my_body, hmac.digest(ADMIN.encode(), my_body, "sha256")),
        "empty signature": f"dfs1.{_b64(my_body)}.",
        "half a signature": _token(my_body, my_mac[:16]),
        "signature twice": _token(my_body, my_mac + my_mac),
        "no signature part": f"dfs1.{_b64(my_body)}",
        "three parts": f"{mine['token']}.{_b64(my_mac)}",
        "another version prefix": "dfs2." + mine["token"][5:],
        "signed by another server": Tokens("another-server-secret-0123456789-abcdef").issue(session)[0],
        "none 'algorithm'": f"dfs1.{_b64(my_body)}.{_b64(b'none')}",
    }
    for what, forged in cases.items():
        assert_refused(api, trace, forged, what)
    assert (
        wait_status(api, mine["token"], trace, until="waiting")["waiting_for"] == "answer"
    )  # nothing changed


def test_tokens_travel_in_the_authorization_header_only(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    attempts = [
        {"params": {"token": s["token"]}},
        {"params": {"access_token": s["token"]}},
        {"params": {"authorization": f"Bearer {s['token']}"}},
        {"headers": {"Cookie": f"token={s['token']}; access_token={s['token']}"}},
        {"headers": {"X-Auth-Token": s["token"], "X-Api-Key": s["token"]}},
        {"headers": {"Authorization": f"Token {s['token']}"}},
        {"headers": {"Authorization": f"Basic {s['token']}"}},
        {"headers": {"Authorization": s["token"]}},
        {"headers": {"Proxy-Authorization": f"Bearer {s['token']}"}},
    ]
    for how in attempts:
        r = api.get(f"/runs/{trace}", **how)
        assert r.status_code == 401, (how, r.text)
        assert s["token"] not in r.text


def test_very_long_non_ascii_and_control_bearer_values_are_401(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    values: list[str | bytes] = [
        "dfs1." + "A" * 600,
        "dfs1." + "A" * 7000 + "." + "B" * 43,
        s["token"] + "A" * 600,  # a valid token with a long tail
        "dfs1.\u00e9\u00e9.\u00e9".encode(),  # UTF-8 bytes, read as Latin-1 by the server
        b"dfs1.\xff\xfe.\x80",
        "dfs1.\u0410\u0411".encode(),
        s["token"].encode() + b"\xc3\xa9",
        "dfs1..",
        "dfs1.",
        ".",
    ]
    for value in values:
        r = api.get(f"/runs/{trace}", headers=bearer(value))
        assert r.status_code == 401, (value[:40], r.status_code, r.text[:200])
    assert wait_status(api, s["token"], trace, until="waiting")["status"] == "waiting"


def test_a_token_string_that_is_not_exactly_the_issued_one_is_refused(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    body, mac = s["token"][5:].split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet[
        alphabet.index(mac[-1]) ^ 1
    ]  # the same 4 data bits, another pad bit (32 bytes: 2 pad bits)
    variants = {
        "a '!' inserted": f"dfs1.{body}!.{mac}",
        "a space inserted": f"dfs1.{body} .{mac}",
        "a tab inserted": f"dfs1.{body}\t.{mac}",
        "padding appended": f"dfs1.{body}==.{mac}",
        "the pad bits of the last character": f"dfs1.{body}.{mac[:-1]}{last}",
    }
    accepted = [
        what
        for what, v in variants.items()
        if api.get(f"/runs/{trace}", headers=bearer(v)).status_code != 401
    ]
    assert accepted == []


def test_the_admin_token_is_compared_whole(api: httpx.Client) -> None:
    s = new_session(api)
    r = api.post("/sessions", headers=bearer(s["token"]))
    assert r.status_code == 401  # a session token is no admin token
    for value in (
        ADMIN[:-1],
        ADMIN + "x",
        ADMIN.upper(),
        "x" + ADMIN,
        ADMIN[:32],
        "dfs1." + ADMIN,
        ADMIN.encode().hex(),
    ):
        r = api.post("/sessions", headers=bearer(value))
        assert r.status_code == 401, (value[:20], r.text)
        assert ADMIN not in r.text
        r = api.post("/runs", headers=bearer(value), json={"pipeline": "rv-srv-echo", "param": 1})
        assert r.status_code == 401, (value[:20], r.text)


# -- sessions and their runs --------------------------------------------------------------------


def test_another_session_cannot_see_answer_or_cancel_a_run(api: httpx.Client) -> None:
    mine, theirs = new_session(api), new_session(api)
    trace = waiting_run(api, mine["token"])
    other = bearer(theirs["token"])
    for method, path, body in (
        ("GET", f"/runs/{trace}", None),
        ("GET", f"/runs/{trace}/events", None),
        ("POST", f"/runs/{trace}/calls/answer", "hijack"),
        ("POST", f"/runs/{trace}/calls/other", "hijack"),
        ("POST", f"/runs/{trace}/cancel", {"reason": "hijack"}),
    ):
        r = api.request(method, path, headers=other, json=body)
        assert r.status_code == 403, (method, path, r.text)
        assert "hijack" not in r.text and mine["session"] not in r.text
    state = wait_status(api, mine["token"], trace, until="waiting")
    assert state["waiting_for"] == "answer" and state["result"] is None


def test_a_chosen_trace_id_cannot_take_over_or_reveal_another_sessions_run(api: httpx.Client) -> None:
    mine, theirs = new_session(api), new_session(api)
    chosen = f"rv-shared-{uuid.uuid4().hex[:8]}"
    assert start(api, mine["token"], "rv-srv-ask", "mine", trace_id=chosen).status_code == 201
    wait_status(api, mine["token"], chosen, until="waiting")
    r = start(api, theirs["token"], "rv-srv-echo", "theirs", trace_id=chosen)
    assert r.status_code == 409
    assert api.get(f"/runs/{chosen}", headers=bearer(theirs["token"])).status_code == 403
    # spellings of the id that are not the id reach nothing
    for spelled in (chosen.upper(), f"{chosen}%20", f"%20{chosen}", f"{chosen}.", f"{chosen}%00"):
        r = api.get(f"/runs/{spelled}", headers=bearer(theirs["token"]))
        assert r.status_code in (404, 422), (spelled, r.status_code, r.text)
    assert wait_status(api, mine["token"], chosen, until="waiting")["waiting_for"] == "answer"


def test_two_sessions_racing_for_one_trace_id_one_wins_and_owns_it(url: str, api: httpx.Client) -> None:
    sessions = [new_session(api) for _ in range(6)]
    chosen = f"rv-race-{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(len(sessions))
    codes: dict[int, int] = {}

    def race(i: int) -> None:
        with httpx.Client(base_url=url, timeout=20) as c:
            barrier.wait()
            codes[i] = start(c, sessions[i]["token"], "rv-srv-ask", i, trace_id=chosen).status_code

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(sessions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, code in codes.items() if code == 201]
    assert len(winners) == 1 and sorted(codes.values()) == [201] + [409] * (len(sessions) - 1), codes
    (winner,) = winners
    for i, s in enumerate(sessions):
        r = api.get(f"/runs/{chosen}", headers=bearer(s["token"]))
        assert r.status_code == (200 if i == winner else 403), (i, r.text)
    assert wait_status(api, sessions[winner]["token"], chosen, until="waiting")["status"] == "waiting"


def test_generated_trace_ids_are_not_guessable(api: httpx.Client) -> None:
    s = new_session(api)
    traces = {start(api, s["token"], "rv-srv-echo", i).json()["trace_id"] for i in range(20)}
    assert len(traces) == 20
    for trace in traces:
        assert len(trace) >= 32 and int(trace, 16) >= 0  # 128 random bits, as hex


def test_private_unserved_and_oddly_named_pipelines_cannot_be_started(api: httpx.Client) -> None:
    s = new_session(api)
    listed = [p["name"] for p in api.get("/pipelines", headers=bearer(s["token"])).json()["pipelines"]]
    assert "rv-srv-echo" in listed and not [n for n in listed if n.startswith("_")]
    for name in (
        "_rv-srv-private",
        " _rv-srv-private",
        "rv-srv-echo ",
        "RV-SRV-ECHO",
        "rv-srv-echo\x00",
        "rv-srv-echo/../_rv-srv-private",
        "",
        "x" * 512,
    ):
        r = start(api, s["token"], name)
        assert r.status_code == 404, (name[:30], r.status_code, r.text[:200])
    for bad in ([1], {"name": "rv-srv-echo"}, None, 5, "x" * 513):
        r = api.post("/runs", headers=bearer(s["token"]), json={"pipeline": bad})
        assert r.status_code == 422, (bad, r.text[:200])
    # a duplicate key does not smuggle a private pipeline in: the last one is the one checked
    r = api.post(
        "/runs",
        headers={**bearer(s["token"]), "Content-Type": "application/json"},
        content=b'{"pipeline": "rv-srv-echo", "pipeline": "_rv-srv-private"}',
    )
    assert r.status_code == 404


# -- calls, cancel, events ----------------------------------------------------------------------


def test_answering_what_the_run_does_not_wait_for_changes_nothing(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    for call_type in ("other", "ANSWER", "answer ", "x" * 3000, "%00", "\u00e9", "rv-srv-ask", "_dflow"):
        r = api.post(
            f"/runs/{trace}/calls/{call_type}?if_waiting=true", headers=bearer(s["token"]), json="injected"
        )
        assert r.status_code in (404, 409), (call_type[:20], r.status_code, r.text[:200])
    # without if_waiting, a call of another type is kept for a wait of its type: not this one's
    kept = api.post(f"/runs/{trace}/calls/other", headers=bearer(s["token"]), json="injected")
    assert kept.status_code == 202, kept.text
    assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"
    assert api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json="real").status_code == 202
    assert wait_status(api, s["token"], trace, until="done")["result"] == {"answered": "real"}
    r = api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), json="late")
    assert r.status_code == 409
    assert wait_status(api, s["token"], trace, until="done")["result"] == {"answered": "real"}


def test_answer_bodies_that_are_not_json_change_nothing(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    for body in (b"", b"   ", b"{", b"\xff\xfe\x00", b"[" * 50_000 + b"]" * 50_000, b"{'single': 'quotes'}"):
        r = api.post(
            f"/runs/{trace}/calls/answer",
            headers={**bearer(s["token"]), "Content-Type": "application/json"},
            content=body,
        )
        assert r.status_code == 400, (body[:20], r.status_code, r.text[:200])
    r = api.post(f"/runs/{trace}/calls/answer", headers=bearer(s["token"]), content=b"x" * (1024 * 1024 + 1))
    assert r.status_code == 413
    assert wait_status(api, s["token"], trace, until="waiting")["waiting_for"] == "answer"


def test_cancel_refuses_garbage_and_a_run_stays_as_it_ended(api: httpx.Client) -> None:
    s = new_session(api)
    trace = waiting_run(api, s["token"])
    for body in ({"reason": 5}, {"reason": "x" * 1001}, {"why": "extra"}, [1], "text"):
        r = api.post(f"/runs/{trace}/cancel", headers=bearer(s["token"]), json=body)
        assert r.status_code == 422, (body, r.text[:200])
    assert wait_status(api, s["token"], trace, until="waiting")["status"] == "waiting"
    done = start(api, s["token"], "rv-srv-echo", 1).json()["trace_id"]
    wait_status(api, s["token"], done, until="done")
    r = api.post(f"/runs/{done}/cancel", headers=bearer(s["token"]))
    assert r.status_code == 200 and r.json()["status"] == "done" and r.json()["result"] == {"echo": 1}
    assert api.post("/runs/no-such-run-rv/cancel", headers=bearer(s["token"])).status_code == 404


def test_events_of_unknown_foreign_and_finished_runs(api: httpx.Client) -> None:
    mine, theirs = new_session(api), new_session(api)
    trace = start(api, mine["token"], "rv-srv-echo", {"n": 1}).json()["trace_id"]
    wait_status(api, mine["token"], trace, until="done")
    assert api.get("/runs/rv-no-such-run/events", headers=bearer(mine["token"])).status_code == 404
    assert api.get("/runs/bad%20id/events", headers=bearer(mine["token"])).status_code == 422
    assert api.get(f"/runs/{trace}/events", headers=bearer(theirs["token"])).status_code == 403
    events = sse_events(api, f"/runs/{trace}/events", bearer(mine["token"]))
    assert [e[0] for e in events] == ["step", "step", "end"] and events[-1][2]["result"] == {"echo": {"n": 1}}
    for last in ("abc", "-1", "1e3", "0x1", ""):  # not an index: the whole stream
        again = sse_events(api, f"/runs/{trace}/events", {**bearer(mine["token"]), "Last-Event-ID": last})
        assert [e[0] for e in again] == ["step", "step", "end"], last
    beyond = sse_events(api, f"/runs/{trace}/events", {**bearer(mine["token"]), "Last-Event-ID": "9" * 30})
    assert [e[0] for e in beyond] == ["end"]


def test_a_hostile_last_event_id_still_gets_a_whole_stream(api: httpx.Client) -> None:
    s = new_session(api)
    trace = start(api, s["token"], "rv-srv-echo", 1).json()["trace_id"]
    wait_status(api, s["token"], trace, until="done")
    for last in (b"\xb2", b"1" * 5000):
        try:
            events = sse_events(api, f"/runs/{trace}/events", {**bearer(s["token"]), "Last-Event-ID": last})
        except httpx.HTTPError as exc:
            pytest.fail(f"Last-Event-ID {last[:10]!r}: the stream broke ({type(exc).__name__}: {exc})")
        assert events and events[-1][0] == "end", last[:10]


def test_an_event_stream_ends_when_its_token_expires(api: httpx.Client, url: str) -> None:
    s = new_session(api, ttl=3)
    renewed = new_session(api, session=s["session"])  # the same session, a longer-lived token
    trace = waiting_run(api, s["token"])
    received: list[tuple[float, str]] = []
    opened: list[int] = []

    def follow() -> None:
        with (
            httpx.Client(base_url=url, timeout=20) as c,
            c.stream("GET", f"/runs/{trace}/events", headers=bearer(s["token"])) as r,
        ):
            opened.append(r.status_code)
            for line in r.iter_lines():
                if line.startswith("event: "):
                    received.append((time.time(), line[7:]))

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(max(0.0, s["expires_at"] - time.time()) + 0.5)  # the streaming token has expired
    assert (
        api.post(f"/runs/{trace}/calls/answer", headers=bearer(renewed["token"]), json="late").status_code
        == 202
    )
    wait_status(api, renewed["token"], trace, until="done")
    reader.join(10)
    assert not reader.is_alive() and opened == [200]  # the stream was opened while the token was valid
    after = [event for at, event in received if at > s["expires_at"] and event == "step"]
    assert after == [], f"steps streamed with an expired token: {after}"


# -- bodies -------------------------------------------------------------------------------------


def test_start_bodies_of_the_wrong_shape_are_422_and_start_nothing(api: httpx.Client) -> None:
    s = new_session(api)
    h = {**bearer(s["token"]), "Content-Type": "application/json"}
    for body in (
        b"null",
        b"[]",
        b'"rv-srv-echo"',
        b"1",
        b'{"pipeline": "rv-srv-echo", "trace_id": 5}',
        b'{"pipeline": "rv-srv-echo", "trace_id": ["a"]}',
        b'{"pipeline": "rv-srv-echo", "session": "x"}',
        b'{"pipeline": "rv-srv-echo", "token": "x"}',
    ):
        r = api.post("/runs", headers=h, content=body)
        assert r.status_code == 422, (body, r.status_code, r.text[:200])
    for trace in ("a/b", "../x", " x", "x" * 129, "\u00e9", ""):
        r = start(api, s["token"], "rv-srv-echo", 1, trace_id=trace)
        assert r.status_code in (404, 422), (trace[:20], r.status_code)
        assert api.get(f"/runs/{trace}", headers=bearer(s["token"])).status_code != 200


def test_sessions_refuse_bad_ids_and_lifetimes(api: httpx.Client) -> None:
    for body in (
        {"session": "a b"},
        {"session": "a\nb"},
        {"session": "x" * 129},
        {"session": "\u00e9"},
        {"session": ""},
        {"session": 5},
        {"ttl": 0},
        {"ttl": -5},
        {"ttl": 10**9},
        {"ttl": "forever"},
        {"ttl": 0.5},
        {"extra": 1},
    ):
        r = api.post("/sessions", headers=bearer(ADMIN), json=body)
        assert r.status_code == 422, (body, r.status_code, r.text[:200])
        assert "token" not in r.json()


def test_non_standard_json_constants_are_refused(api: httpx.Client) -> None:
    s = new_session(api)
    h = {**bearer(s["token"]), "Content-Type": "application/json"}
    codes = {}
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        r = api.post("/runs", headers=h, content=b'{"pipeline": "rv-srv-echo", "param": ' + constant + b"}")
        codes[constant] = r.status_code
    assert codes == {b"NaN": 400, b"Infinity": 400, b"-Infinity": 400}


# -- binding, and a server without an admin token ------------------------------------------------


def test_only_loopback_addresses_count_as_loopback() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in (
        "0.0.0.0",
        "::",
        "",
        "10.0.0.1",
        "192.168.1.1",
        "example.com",
        "localhost.example.com",
        "127.0.0.1.nip.io",
        "0",
        "169.254.169.254",
        "[::]",
    ):
        assert not is_loopback(host), host


def test_an_open_server_still_keeps_sessions_apart(open_url: str) -> None:
    with httpx.Client(base_url=open_url, timeout=20) as api:
        first = api.post("/runs", json={"pipeline": "rv-srv-ask", "param": "a"}).json()
        second = api.post("/runs", json={"pipeline": "rv-srv-ask", "param": "b"}).json()
        assert first["session"] != second["session"]
        r = api.get(f"/runs/{first['trace_id']}", headers=bearer(second["token"]))
        assert r.status_code == 403
        assert api.get(f"/runs/{first['trace_id']}").status_code == 401  # no token: no run
        # with no admin token, only "no token" is the admin: a wrong token is not
        assert api.post("/sessions", headers=bearer("x" * 40)).status_code == 401


def test_an_expired_token_cannot_be_renewed_by_anyone_on_an_open_server(
    open_url: str, tokens: Tokens
) -> None:
    with httpx.Client(base_url=open_url, timeout=20) as api:
        owner = api.post("/runs", json={"pipeline": "rv-srv-ask", "param": "secret plans"}).json()
        expired, _ = tokens.issue(owner["session"], 60, now=time.time() - 3600)
        assert api.get(f"/runs/{owner['trace_id']}", headers=bearer(expired)).status_code == 401
        session_id = _unb64(expired.split(".")[1]).decode().split("\n")[0]  # anyone can read it
        r = api.post("/sessions", json={"session": session_id})
        assert r.status_code in (401, 403), "a stranger got a fresh token for someone else's session"
