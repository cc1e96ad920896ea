"""The web console (``dflow.server.console``) over real sockets, on the in-memory runtime:
logging in (the cookie's flags, a credential that is not the token, forged, expired and
foreign credentials), the runs list (counts, filters, cursor pages), a run's page (its step
tree with branches and flat_map flows, one step's values, the live stream), the actions
(cancel, answer a ``from_call``, re-run from a step) and what each refuses (no login, no
anti-forgery token, another origin), bad input to every endpoint (unknown runs, malformed
JSON, huge bodies, traversal in static paths), hostile stored text rendered inert,
stored text of any size shown cut (an error, an agent's message), an agent's conversation, and the open console of a server without an admin token."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow, Run
from dflow.context import RunInfo, RunStatus
from dflow.memory import MemoryStore
from dflow.server import Server, ServerThread, create_app
from dflow.server.console.auth import ConsoleAuth
from dflow.server.console.html import head_html
from dflow.server.console.tree import RunTree
from dflow.server.console.tree_html import tree_html
from dflow.server.console.views import ConsoleView
from dflow_agents.testing import ScriptedModel, call, reply
from dflow_agents.toolcall import ToolCallAgent
from dflow_agents.tools import tool
from tests.support.console import csrf_of, login, raw_request, stream_events

ADMIN = "admin-token-of-the-console-tests-0123456789"
ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "<script>alert('x')</script>"


def _answer_flow(question: Any) -> DFlow[Any]:
    return DFlow.from_call("con-answer")


ask = (
    DFlow.from_call("con-ask")
    .map(lambda q: f"Q: {q}")
    .id("question")
    .flat_map(_answer_flow)
    .id("wait")
    .map(lambda a: {"answered": a})
    .id("done")
    .init("con-ask")
)
twice = (
    DFlow.from_call("con-twice")
    .map(lambda x: x + 1)
    .id("inc")
    .map(lambda x: x * 2)
    .id("dbl")
    .init("con-twice")
)
forked = (
    DFlow.from_call("con-fork")
    .flat_map(
        lambda x: DFlow.zip(
            [
                DFlow.just(x).map(lambda v: v * 10).id("tens"),
                DFlow.from_call("con-branch").map(lambda v: v).id("given"),
            ]
        )
    )
    .id("fork")
    .map(lambda pair: sum(pair))
    .id("total")
    .init("con-fork")
)


def _boom(value: Any) -> Any:
    raise ValueError(f"{HOSTILE} failed on {value}")


hostile = (
    DFlow.from_call("con-hostile")
    .map(lambda x: f"<img src=x onerror=alert(1)> {x}")
    .id("shout")
    .name(f"<b>{HOSTILE}</b>")
    .map(_boom)
    .id("boom")
    .init("con-hostile")
)


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city} has 3 parks <i>{HOSTILE}</i>"


def _reserve_jobs(server: Server) -> None:
    """A route provider that keeps the call types ``con-job:...`` to its own route."""
    server.reserve_call_prefix("con-job:", "POST /con-jobs/{id}")


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    with ServerThread(create_app(admin_token=ADMIN, routes=[_reserve_jobs])) as base:
        yield base


@pytest.fixture
def anon(url: str) -> Iterator[httpx.Client]:
    """A client that has not logged in."""
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


@pytest.fixture
def browser(url: str) -> Iterator[httpx.Client]:
    """A logged-in client that sends the page's anti-forgery token, as the console's script does."""
    with httpx.Client(base_url=url, timeout=30) as c:
        login(c, ADMIN)
        c.headers["X-DFlow-CSRF"] = csrf_of(c)
        yield c


def wait_for(run: Run[Any], status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while run.status().value != status:
        assert time.monotonic() < deadline, f"{run} is {run.status().value}, not {status}"
        time.sleep(0.01)


def waiting_ask(question: str = "why?") -> Run[Any]:
    run = ask.call(question)
    wait_for(run, "waiting")
    return run


# -- logging in ---------------------------------------------------------------------------------


def test_the_console_needs_a_login_and_the_cookie_is_a_credential_not_the_token(anon: httpx.Client) -> None:
    r = anon.get("/console/?status=waiting")
    assert (
        r.status_code == 303
        and r.headers["location"] == "/console/login?next=%2Fconsole%2F%3Fstatus%3Dwaiting"
    )
    assert anon.get("/console/api/runs").status_code == 401
    form = anon.get("/console/login?next=/console/runs/x")
    assert form.status_code == 200 and 'name="token"' in form.text and 'value="/console/runs/x"' in form.text
    assert (
        "Content-Security-Policy" in form.headers
        and "script-src 'self'" in form.headers["content-security-policy"]
    )
    bad = anon.post("/console/login", data={"token": ADMIN + "x", "next": "/console/"})
    assert bad.status_code == 401 and "is not the admin token" in bad.text and "set-cookie" not in bad.headers
    r = anon.post("/console/login", data={"token": ADMIN, "next": "https://evil.example/"})
    assert r.status_code == 303 and r.headers["location"] == "/console/"  # never sent elsewhere
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert "Max-Age=28800" in cookie
    value = anon.cookies.get("dflow_console", path="/console")
    assert value and ADMIN not in value and value.startswith("c1.")
    assert anon.get("/console/").status_code == 200
    # the credential is not a token of the HTTP API, nor the other way round
    assert anon.get("/pipelines", headers={"Authorization": f"Bearer {value}"}).status_code == 401
    assert anon.post("/console/logout").status_code == 303
    assert anon.get("/console/").status_code == 303


def test_forged_expired_and_foreign_credentials_are_refused(url: str) -> None:
    mine = ConsoleAuth(ADMIN)
    fresh = mine.login(ADMIN)
    assert fresh is not None and mine.verify(fresh) is not None
    expired = mine.login(ADMIN, now=time.time() - 9 * 3600)
    foreign = ConsoleAuth("another-admin-token-0123456789abcdef0123").login(
        "another-admin-token-0123456789abcdef0123"
    )
    body, _, mac = fresh.rpartition(".")
    tampered = body[:-1] + ("A" if body[-1] != "A" else "B") + "." + mac
    longer = fresh.replace(fresh.split(".")[1], str(int(fresh.split(".")[1]) + 3600), 1)
    for what, value in {
        "expired": expired,
        "foreign": foreign,
        "tampered": tampered,
        "extended": longer,
        "garbage": "c1.x.y.z",
        "empty": "",
        "huge": "c1." + "A" * 5000,
    }.items():
        with httpx.Client(base_url=url, cookies={"dflow_console": value or ""}) as c:
            assert c.get("/console/").status_code == 303, what
            assert c.get("/console/api/runs").status_code == 401, what
    with httpx.Client(base_url=url, cookies={"dflow_console": fresh}) as c:
        assert c.get("/console/api/runs").status_code == 200  # any process with the admin token accepts it
    with httpx.Client(base_url=url) as c:
        assert c.get("/console/api/runs", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert c.get("/console/api/runs", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_login_refuses_bad_forms(anon: httpx.Client) -> None:
    assert anon.post("/console/login", json={"token": ADMIN}).status_code == 415
    big = anon.post(
        "/console/login",
        content=b"token=" + b"a" * 10_000,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert big.status_code == 413
    bad = anon.post(
        "/console/login",
        content=b"\xff\xfe=\xff",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert bad.status_code == 400
    cross = anon.post("/console/login", data={"token": ADMIN}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and "set-cookie" not in cross.headers


# -- the runs list ------------------------------------------------------------------------------


def test_the_runs_list_shows_counts_filters_and_pages(browser: httpx.Client) -> None:
    done = [twice.call(i) for i in range(5)]
    assert [r.result(10) for r in done] == [(i + 1) * 2 for i in range(5)]
    waiting = waiting_ask("listed?")
    page = browser.get("/console/")
    assert page.status_code == 200 and waiting.trace_id in page.text and done[-1].trace_id in page.text
    assert f'href="/console/runs/{waiting.trace_id}"' in page.text
    listed = browser.get("/console/api/runs", params={"pipeline": "con-twice", "limit": 2}).json()
    assert set(listed["counts"]) == {
        "running",
        "sleeping",
        "waiting",
        "done",
        "failed",
        "cancelled",
        "compensated",
        "timed_out",
    }
    assert listed["counts"]["done"] >= 5 and all(r["pipeline"] == "con-twice" for r in listed["runs"])
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"pipeline": "con-twice", "status": "done", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        got = browser.get("/console/api/runs", params=params).json()
        assert len(got["runs"]) <= 2 and all(r["status"] == "done" for r in got["runs"])
        seen += [r["trace_id"] for r in got["runs"]]
        cursor = got["cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) and {r.trace_id for r in done} <= set(seen)
    # the HTML page links the next page with its cursor, keeping the filters
    html = browser.get("/console/", params={"pipeline": "con-twice", "status": "done", "limit": 2}).text
    nxt = re.search(r'<a class="next" href="([^"]+)"', html)
    assert nxt is not None and "pipeline=con-twice" in nxt.group(1) and "cursor=" in nxt.group(1)
    waits = browser.get("/console/api/runs", params={"status": "waiting", "pipeline": "con-ask"}).json()
    row = next(r for r in waits["runs"] if r["trace_id"] == waiting.trace_id)
    assert row["waiting_for"] == "con-answer" and row["finished"] is False


def iso(t: float) -> str:
    """Time ``t`` in ISO 8601, UTC, to the microsecond, without its offset (as a form sends it)."""
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds")


def test_the_runs_list_keeps_the_runs_started_in_a_window_of_time(browser: httpx.Client) -> None:
    made = []
    for i in range(3):
        if made:  # each run in a millisecond of its own
            last = made[-1].info().created
            while time.time() < last + 0.005:
                time.sleep(0.001)
        made.append(twice.call(i))
    first, middle, last = (r.info().created for r in made)
    params = {"pipeline": "con-twice", "after": iso(middle), "before": iso(last)}
    listed = browser.get("/console/api/runs", params=params).json()
    assert [r["trace_id"] for r in listed["runs"]] == [made[1].trace_id]
    since = browser.get("/console/api/runs", params={"pipeline": "con-twice", "after": iso(first)}).json()
    assert [r["trace_id"] for r in since["runs"]] == [r.trace_id for r in reversed(made)], "newest first"
    paged = {**params, "before": iso(last + 1), "limit": 1}
    page = browser.get("/console/api/runs", params=paged).json()
    assert [r["trace_id"] for r in page["runs"]] == [made[2].trace_id] and page["cursor"]
    page = browser.get("/console/api/runs", params={**paged, "cursor": page["cursor"]}).json()
    assert [r["trace_id"] for r in page["runs"]] == [made[1].trace_id]
    # the page shows the window in its form (UTC, to the second) and its links keep it
    html = browser.get("/console/", params={**params, "after": iso(first), "limit": 1}).text
    assert made[2].trace_id not in html and made[1].trace_id in html
    assert (
        f'name="after" value="{iso(first)[:19]}"' in html
        and f'name="before" value="{iso(last)[:19]}"' in html
    )
    link = re.search(r'<a class="next" href="([^"]+)"', html)
    assert link is not None and "after=" in link.group(1) and "before=" in link.group(1)
    assert 'class="reset"' in html


def test_the_runs_list_pages_oldest_first_with_its_filters_and_links_to_either_order(
    browser: httpx.Client,
) -> None:
    made = []
    for i in range(3):
        if made:  # each run in a millisecond of its own
            last = made[-1].info().created
            while time.time() < last + 0.005:
                time.sleep(0.001)
        made.append(twice.call(i))
    assert [r.result(10) for r in made] == [2, 4, 6]
    since = {"pipeline": "con-twice", "status": "done", "after": iso(made[0].info().created)}
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        got = browser.get(
            "/console/api/runs", params={**since, "sort": "oldest", "limit": 1, "cursor": cursor or ""}
        )
        assert got.status_code == 200 and got.json()["sort"] == "oldest"
        seen += [r["trace_id"] for r in got.json()["runs"]]
        cursor = got.json()["cursor"]
        if not cursor:
            break
    assert seen[:3] == [r.trace_id for r in made], "oldest first, from the start of the window"
    newest = browser.get("/console/api/runs", params={**since, "sort": "newest"}).json()
    assert newest["sort"] == "newest" and [r["trace_id"] for r in newest["runs"]][-3:] == [
        r.trace_id for r in reversed(made)
    ]
    html = browser.get("/console/", params={**since, "limit": 1}).text
    control = re.search(r'<a class="chip" data-sort="oldest" href="([^"]+)"', html)
    assert (
        control is not None and "sort=oldest" in control.group(1) and "pipeline=con-twice" in control.group(1)
    )
    assert 'class="chip on" aria-current="true" data-sort="newest"' in html
    html = browser.get("/console/", params={**since, "limit": 1, "sort": "oldest"}).text
    assert made[0].trace_id in html and made[1].trace_id not in html
    assert '<input type="hidden" name="sort" value="oldest">' in html, "the filters keep the order"
    nxt = re.search(r'<a class="next" href="([^"]+)"', html)
    assert nxt is not None and "sort=oldest" in nxt.group(1) and "cursor=" in nxt.group(1)
    back = re.search(r'<a class="chip" data-sort="newest" href="([^"]+)"', html)
    assert back is not None and "sort=" not in back.group(1) and "cursor=" not in back.group(1)
    newest_cursor = browser.get("/console/api/runs", params={**since, "limit": 1}).json()["cursor"]
    wrong = browser.get("/console/api/runs", params={"sort": "oldest", "cursor": newest_cursor})
    assert wrong.status_code == 400 and "newest first, not oldest first" in wrong.json()["detail"]


def test_the_run_id_box_goes_to_the_one_run_whose_id_starts_so_or_lists_them_all(
    browser: httpx.Client,
) -> None:
    base = f"con-find-{time.time_ns()}-"
    runs = [twice.call(i, trace_id=f"{base}{name}") for i, name in enumerate(["b-x", "a1", "a2"])]
    assert [r.result(10) for r in runs] == [2, 4, 6]

    def go(text: str) -> httpx.Response:
        return browser.get("/console/", params={"run": text}, follow_redirects=False)

    for text, to in ((f"{base}a1", "a1"), (f"{base}b", "b-x")):  # an id, or the start of only one
        r = go(text)
        assert r.status_code == 303 and r.headers["location"] == f"/console/runs/{base}{to}", text
    several = go(f"{base}a")
    assert several.status_code == 200
    assert re.findall(r'data-trace="([^"]+)"', several.text) == [f"{base}a1", f"{base}a2"]
    assert f"2 runs whose id starts with &#x27;{base}a&#x27;, in id order." in several.text
    every = go(base)
    assert re.findall(r'data-trace="([^"]+)"', every.text) == [f"{base}a1", f"{base}a2", f"{base}b-x"]
    assert 'class="next"' not in every.text
    for text in (f"{base}zz", "not an id"):
        assert "never started, or expired" in go(text).text
    api = browser.get("/console/api/runs", params={"id": f"{base}a"}).json()
    assert [r["trace_id"] for r in api["runs"]] == [f"{base}a1", f"{base}a2"] and api["cursor"] is None
    assert browser.get("/console/api/runs", params={"id": base, "status": "failed"}).json()["runs"] == []
    one = browser.get("/console/api/runs", params={"id": base, "pipeline": "con-twice", "limit": 1}).json()
    assert [r["trace_id"] for r in one["runs"]] == [f"{base}a1"]
    bad = browser.get("/console/api/runs", params={"id": "a b"})
    assert bad.status_code == 400 and "does not start a run id" in bad.json()["detail"]


def _keyed(order: dict[str, Any]) -> int:
    dflow.set_business_key(order["key"])
    return int(order["n"])


keyed = DFlow.from_call("con-keyed").map(_keyed).id("keyed").init("con-keyed")


def test_the_business_key_box_lists_the_runs_a_step_gave_that_key_newest_first(browser: httpx.Client) -> None:
    key = f"order-{time.time_ns()}"
    runs = []
    for n, k in enumerate((key, f"{key}-other", key)):
        run = keyed.call({"key": k, "n": n})
        assert run.result(10) == n
        runs.append(run)
        while time.time() < run.info().created + 0.002:  # (the next run later)
            time.sleep(0.001)
    page = browser.get("/console/", params={"key": key})
    assert page.status_code == 200
    assert re.findall(r'data-trace="([^"]+)"', page.text) == [runs[2].trace_id, runs[0].trace_id]
    assert f'name="key" value="{key}"' in page.text and "Business key" in page.text
    assert f'<span class="key">{key}</span>' in page.text and 'class="reset"' in page.text
    api = browser.get("/console/api/runs", params={"key": key}).json()
    assert [r["trace_id"] for r in api["runs"]] == [runs[2].trace_id, runs[0].trace_id]
    assert {r["business_key"] for r in api["runs"]} == {key} and api["cursor"] is None
    assert browser.get("/console/api/runs", params={"key": key, "status": "failed"}).json()["runs"] == []
    assert browser.get("/console/api/runs", params={"key": f"{key}-none"}).json()["runs"] == []
    bad = browser.get("/console/api/runs", params={"key": "x" * 201})
    assert bad.status_code in (400, 422) and "200" in bad.json()["detail"], bad.text
    head = browser.get(f"/console/api/runs/{runs[1].trace_id}/tree").json()["head"]
    assert "Business key" in head and f"/console/?key={key}-other" in head


keyed_b = DFlow.from_call("con-keyed-b").map(_keyed).id("keyed").init("con-keyed-b")


def test_a_business_key_search_with_filters_finds_the_first_runs_that_pass_them_in_the_order_asked(
    browser: httpx.Client,
) -> None:
    key = f"order-{time.time_ns()}"
    # of the other pipeline, before more than a page of newer runs:
    older = keyed_b.call({"key": key, "n": 0})
    assert older.result(10) == 0
    newer = [keyed.call({"key": key, "n": n}) for n in range(1, 4)]
    for n, run in enumerate(newer, 1):
        assert run.result(10) == n
    infos = sorted((r.info() for r in [older, *newer]), key=lambda i: (i.created, i.trace_id))
    assert infos[0].trace_id == older.trace_id

    def found(**params: Any) -> list[str]:
        got = browser.get("/console/api/runs", params={"key": key, **params})
        assert got.status_code == 200, got.text
        return [r["trace_id"] for r in got.json()["runs"]]

    assert found(pipeline="con-keyed-b", limit=2) == [older.trace_id], "past newer runs of another pipeline"
    assert found(sort="oldest", limit=2) == [i.trace_id for i in infos[:2]]
    assert found(pipeline="con-keyed", sort="oldest", limit=1) == [infos[1].trace_id]
    assert found(status="done", limit=2) == [i.trace_id for i in infos[::-1][:2]]
    assert found(status="failed") == []


def test_an_id_search_with_filters_finds_the_runs_that_pass_them_past_the_first_the_id_starts(
    browser: httpx.Client,
) -> None:
    start = f"con-ids-{time.time_ns()}-"
    firsts = [keyed.call({"key": f"{start}k", "n": n}, trace_id=f"{start}{n}") for n in range(4)]
    last = keyed_b.call({"key": f"{start}k", "n": 4}, trace_id=f"{start}4")
    assert [r.result(10) for r in [*firsts, last]] == [0, 1, 2, 3, 4]

    def found(**params: Any) -> list[str]:
        got = browser.get("/console/api/runs", params={"id": start, **params})
        assert got.status_code == 200, got.text
        return [r["trace_id"] for r in got.json()["runs"]]

    assert found(pipeline="con-keyed-b", limit=2) == [last.trace_id], "past the first runs the id starts"
    assert found(limit=2) == [firsts[0].trace_id, firsts[1].trace_id], "unfiltered: in id order"
    assert found(status="failed") == []


def test_the_runs_list_shows_the_schedules_with_their_next_fire_times(
    runtime: dflow.Runtime, browser: httpx.Client
) -> None:
    from dflow.runtime.process import _current
    from dflow.schedules import Schedule

    book = runtime.store.schedules  # type: ignore[attr-defined]
    nightly = Schedule("con-nightly", "con-twice", cron="0 3 * * *")
    paused = Schedule("con-paused", "con-twice", every=60)
    at = 1_900_000_800_000  # a whole minute
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at / 1000))
    host = _current()
    host.run(book.put(nightly, at))
    host.run(book.put(paused, at))
    host.run(book.pause("con-paused"))
    try:
        html = browser.get("/console/").text
        assert '<section class="card schedules">' in html
        rows = re.findall(r'<tr class="schedule-row">(.*?)</tr>', html)
        assert len(rows) == 2
        assert "con-nightly" in rows[0] and "0 3 * * *" in rows[0] and shown in rows[0]
        assert "con-paused" in rows[1] and "every 60s" in rows[1] and ">paused<" in rows[1]
    finally:
        host.run(book.remove("con-nightly"))
        host.run(book.remove("con-paused"))
    assert "card schedules" not in browser.get("/console/").text, "no schedules: no card"


sleeper = (
    DFlow.from_call("con-sleep")
    .map(lambda x: x)
    .id("before")
    .flat_map(lambda x: DFlow.delay(x, 600))
    .id("nap")
    .init("con-sleep")
)


def test_the_runs_list_notes_errors_wake_times_and_waits_and_goes_to_a_run_by_its_id(
    browser: httpx.Client,
) -> None:
    failed = hostile.call("listed")
    with pytest.raises(dflow.RunFailedError):
        failed.result(10)
    napping = sleeper.call(1)
    wait_for(napping, "sleeping")
    waiting = waiting_ask("noted?")
    page = browser.get("/console/", params={"limit": 200}).text

    def note(run: Run[Any]) -> str:
        row = re.search(rf'<tr class="run-row" data-trace="{run.trace_id}">(.*?)</tr>', page, re.S)
        assert row is not None, run.trace_id
        return re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)[-1]

    assert note(failed).startswith("ValueError: &lt;script&gt;") and note(failed).endswith("&gt; listed")
    assert re.fullmatch(r"wakes in (599|600)s \(\d\d:\d\d:\d\d UTC\)", note(napping)), note(napping)
    assert note(waiting) == "waiting for con-answer"
    head = browser.get(f"/console/api/runs/{napping.trace_id}/tree").json()["head"]
    assert "<dt>Wakes</dt><dd>in " in head
    assert 'data-refresh="5"' in page  # the first page refreshes itself; a later one does not
    gone = browser.get("/console/", params={"run": waiting.trace_id}, follow_redirects=False)
    assert gone.status_code == 303 and gone.headers["location"] == f"/console/runs/{waiting.trace_id}"
    missing = browser.get("/console/", params={"run": "no-such-run"})
    assert missing.status_code == 200 and "No run &#x27;no-such-run&#x27; in this store" in missing.text
    odd = browser.get("/console/", params={"run": "<b>x</b>"})
    assert odd.status_code == 200 and "<b>x</b>" not in odd.text
    napping.cancel()
    waiting.cancel()


fanned = (
    DFlow.from_call("con-fan")
    .flat_map(
        lambda x: DFlow.zip(
            [DFlow.just(x).map(lambda v: v * 10).id("tens"), DFlow.just(x).map(lambda v: v).id("ones")]
        )
    )
    .id("fan")
    .map(lambda pair: sum(pair))
    .id("sum")
    .init("con-fan")
)


def test_a_run_page_draws_its_steps_and_its_branches_steps_on_a_timeline(browser: httpx.Client) -> None:
    run = fanned.call(3)
    assert run.result(10) == 33
    parts = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()
    svg = parts["timeline"]
    assert svg.startswith('<svg class="timeline"') and "style=" not in svg  # (no inline style: the CSP)
    bars = re.findall(r'<g class="bar st-(\w+)" data-run="([^"]+)" data-seq="(\d+)">', svg)
    steps = [s for s in run.context().steps if s.status is not dflow.StepStatus.ENTRY]
    mine = [(st, seq) for st, r, seq in bars if r == run.trace_id]
    assert mine == [(s.status.value, str(s.seq)) for s in steps], svg
    assert any(r != run.trace_id for _, r, _ in bars), "the branches' steps are on it too"
    xs = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', svg)]
    assert xs == sorted(xs) and all(180 <= x <= 1000 for x in xs), (
        "in order of their start, within the drawing"
    )
    page = browser.get(f"/console/runs/{run.trace_id}").text
    assert '<div id="timeline"><svg class="timeline"' in page
    waiting = waiting_ask("no step yet?")
    assert "<rect" in browser.get(f"/console/api/runs/{waiting.trace_id}/tree").json()["timeline"]
    waiting.cancel()


def _down(value: Any) -> Any:
    raise ConnectionError(f"the mail server is down for {value}")


backing_off = (
    DFlow.from_call("con-backoff")
    .map(_down)
    .id("mail")
    .retry(3, backoff=20, jitter=False)
    .init("con-backoff")
)


def test_a_run_waiting_out_a_retrys_backoff_shows_when_it_tries_again(browser: httpx.Client) -> None:
    run = backing_off.call(1)
    wait_for(run, "sleeping")  # (its first attempt failed: the retry's timer is set)
    page = browser.get("/console/", params={"status": "sleeping", "limit": 200}).text
    row = re.search(rf'<tr class="run-row" data-trace="{run.trace_id}">(.*?)</tr>', page, re.S)
    assert row is not None, page
    note = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)[-1]
    assert re.fullmatch(r"wakes in (19|20)s \(\d\d:\d\d:\d\d UTC\)", note), note
    parts = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()
    assert "<dt>Wakes</dt><dd>in " in parts["head"]
    assert "ConnectionError: the mail server is down for 1" in parts["tree"]
    run.cancel()


def test_the_runs_list_refuses_bad_filters(browser: httpx.Client) -> None:
    for params, status, words in (
        ({"status": "sleepy"}, 422, "not a run status"),
        ({"limit": "0"}, 422, "limit"),
        ({"limit": "many"}, 422, "limit"),
        ({"pipeline": "p" * 16_385}, 422, "over the limit"),
        ({"cursor": "not-a-cursor!"}, 400, "first page"),
        ({"cursor": "bm9jb2xvbg"}, 400, "malformed run cursor"),
        ({"cursor": "x" * 3000}, 422, "over the limit"),
        ({"after": "yesterday"}, 422, "'yesterday' is not a time"),
        ({"before": "2026-13-01"}, 422, "before '2026-13-01' is not a time"),
        ({"after": "2026-12-02T10:00", "before": "2026-12-02T09:00"}, 422, "must come before its end"),
        ({"after": "2" * 41}, 422, "over the limit"),
        (
            {"sort": "sideways"},
            422,
            "sort 'sideways' is not an order of the runs list: use one of newest, oldest",
        ),
    ):
        for path in ("/console/api/runs", "/console/"):
            r = browser.get(path, params=params)
            assert r.status_code == status and words in r.json()["detail"], (path, params, r.text)


# -- a run's page ---------------------------------------------------------------------------------


def test_a_run_page_draws_branches_side_by_side_and_flat_map_flows_nested(browser: httpx.Client) -> None:
    run = forked.call(4)
    wait_for(run, "waiting")
    html = browser.get(f"/console/runs/{run.trace_id}").text
    assert '<div class="fork">' in html and html.count('class="branch"') == 2
    assert f'href="/console/runs/{run.trace_id}/' in html  # each branch links to its own page
    assert '<ol class="flow nested">' in html  # the zip sits inside the flat_map's flow
    assert ">tens<" in html and ">con-branch<" in html and "waiting for call &#x27;con-branch&#x27;" in html
    assert 'class="answer" data-run="' + run.trace_id + "/" in html  # the branch's wait can be answered
    branch = browser.get(f"/console/runs/{run.trace_id}/2-0")  # a branch's own page (an id with a /)
    assert branch.status_code == 200 and "Branch of" in branch.text


_FLAKY: dict[str, int] = {}


def _flaky(ctx: Any, value: Any) -> Any:
    _FLAKY[ctx.trace_id] = _FLAKY.get(ctx.trace_id, 0) + 1
    if _FLAKY[ctx.trace_id] < 3:
        raise ConnectionError(f"try {_FLAKY[ctx.trace_id]} failed")
    return value


flaky = (
    DFlow.from_call("con-flaky")
    .map(_flaky)
    .id("shaky")
    .retry(3, backoff=0.01, jitter=False)
    .flat_map(lambda v: DFlow.delay(v, 30))
    .id("later")
    .init("con-flaky")
)


def test_retries_and_a_sleeping_run_are_drawn(browser: httpx.Client) -> None:
    run = flaky.call(1)
    deadline = time.monotonic() + 10
    while ">delay<" not in (html := browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["tree"]):
        assert time.monotonic() < deadline, html  # (a retry's backoff sleeps too: wait for the delay)
        time.sleep(0.02)
    assert run.status().value == "sleeping"
    nodes = re.findall(
        r'<li class="step st-(\w+)"><button[^>]*><span class="nm">([^<]*)</span><span class="badge '
        r'[^>]*>[^<]*</span><span class="meta">([^<]*)</span>',
        html,
    )
    attempts = [
        (status, meta.split(" · ")[1] if "attempt" in meta else "")
        for status, name, meta in nodes
        if name == "shaky"
    ]
    assert attempts == [("retrying", ""), ("retrying", "attempt 2"), ("done", "attempt 3")], nodes
    assert "ConnectionError: try 1 failed" in html and "sleeping until its timer fires" in html
    run.cancel()


def test_a_step_waiting_for_a_rate_limit_s_token_is_drawn_with_its_bucket(browser: httpx.Client) -> None:
    limited = (
        DFlow.from_call("con-limited")
        .map(lambda x: x)
        .id("call")
        .rate_limit(f"con-{time.monotonic_ns()}", rate=1, per=600)
        .init("con-limited")
    )
    first, second = limited.call(1), limited.call(2)
    assert first.result(10) == 1
    wait_for(second, "sleeping")
    html = browser.get(f"/console/api/runs/{second.trace_id}/tree").json()["tree"]
    assert re.search(r'<li class="step st-throttled"><button[^>]*><span class="nm">call</span>', html), html
    assert "rate_limit" in html and "con-" in html
    second.cancel()


def test_a_parked_run_says_why_in_its_header_and_its_tree() -> None:
    """(A run is parked when no worker knows its next step: drawn from the state the store
    gives, as a ``RunInfo``.)"""
    info = RunInfo(
        "parked-run",
        RunStatus.RUNNING,
        3,
        time.time() - 5,
        time.time(),
        pipeline="p",
        extra={"parked": "no worker knows step 'resize>store' <yet>", "park_count": 4},
    )
    head = head_html(info, "parked-run", "p")
    assert "Parked" in head and "4× — no worker knows step &#x27;resize&gt;store&#x27; &lt;yet&gt;" in head
    tree = RunTree(MemoryStore(), "parked-run")
    tree.root.info, tree.root.read = info, True
    assert "running the next step… (parked 4×: no worker knows step" in tree_html(tree)


def test_a_failed_or_compensated_runs_header_names_steps_by_their_ids_not_their_keys() -> None:
    """(A step's key holds the ids of the rest of its path, ``send>archive``: the header shows
    its id, ``send``, with the whole key on hover; so do the compensation lists.)"""
    error = {
        "type": "ValueError",
        "message": "no mail",
        "step": "send>archive",
        "compensated": ["charge>send>archive"],
        "undone": ["hotel>charge>send>archive"],
    }
    info = RunInfo("saga-run", RunStatus.COMPENSATED, 4, time.time() - 5, time.time(), error=error)
    head = head_html(info, "saga-run", "p")
    assert 'at step <code title="send&gt;archive">send</code>' in head, head
    assert 'Compensated: <code title="charge&gt;send&gt;archive">charge</code>' in head, head
    assert 'Left undone: <code title="hotel&gt;charge&gt;send&gt;archive">hotel</code>' in head, head
    assert ">send&gt;archive<" not in head and ">charge&gt;send&gt;archive<" not in head


def _full(_: Any) -> None:
    raise ValueError("the hotel is full")


booking = (
    DFlow.from_call("con-book")
    .map(lambda v: {"id": "c1", "amount": v})
    .id("charge")
    .compensate(lambda charge: {"refunded": charge["amount"]})
    .map(_full)
    .id("hotel")
    .init("con-book")
)


def test_a_compensation_step_shows_what_it_undid_as_its_input_and_what_it_returned_as_its_output(
    browser: httpx.Client,
) -> None:
    run = booking.call(40)
    with pytest.raises(dflow.RunCompensatedError):
        run.result(10)
    (undo,) = [s for s in run.context().steps if (s.name or "").startswith("compensate")]
    step = browser.get(f"/console/api/runs/{run.trace_id}/steps/{undo.seq}").json()
    assert step["name"] == "compensate charge", step
    assert json.loads(step["input"]) == {"id": "c1", "amount": 40}, "what the undone step output"
    assert json.loads(step["output"]) == {"refunded": 40}, "what the compensation returned"
    tree = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["tree"]
    assert ">compensate charge<" in tree and "charge&gt;hotel" not in tree


def test_a_step_shows_its_input_output_and_error(browser: httpx.Client) -> None:
    run = twice.call(20)
    assert run.result(10) == 42
    step = browser.get(f"/console/api/runs/{run.trace_id}/steps/2").json()
    assert (
        step["name"] == "dbl"
        and step["status"] == "done"
        and step["input"] == "21"
        and step["output"] == "42"
    )
    assert step["duration"] >= 0 and step["worker"] and step["error"] is None
    failed = hostile.call("x")
    with pytest.raises(dflow.RunFailedError):
        failed.result(10)
    err = browser.get(f"/console/api/runs/{failed.trace_id}/steps/2").json()
    assert (
        err["status"] == "failed"
        and err["error"]["type"] == "ValueError"
        and HOSTILE in err["error"]["message"]
    )
    assert "Traceback" in err["error"]["traceback"]
    head = browser.get(f"/console/api/runs/{failed.trace_id}/tree").json()["head"]
    assert 'at step <code title="boom">boom</code>' in head  # the step's id; its key on hover
    for path, status in (
        (f"/console/api/runs/{run.trace_id}/steps/99", 404),
        (f"/console/api/runs/{run.trace_id}/steps/-1", 404),
        (f"/console/api/runs/{run.trace_id}/steps/1e3", 404),
        ("/console/api/runs/no-such-run/steps/1", 404),
        ("/console/api/runs/bad%20id!/steps/1", 404),
        ("/console/api/runs/no-such-run/tree", 404),
    ):
        r = browser.get(path)
        assert r.status_code == status and r.json()["detail"], (path, r.text)
    page = browser.get("/console/runs/no-such-run")
    assert page.status_code == 404 and "does not exist" in page.text


big = DFlow.from_call("con-big").map(lambda n: "x" * n).id("grow").init("con-big")


def test_a_long_value_is_drawn_by_its_size_and_shown_whole_in_its_step(browser: httpx.Client) -> None:
    run = big.call(10_000)
    assert run.result(10) == "x" * 10_000
    tree = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["tree"]
    assert "10,003 bytes: select the step to see it" in tree and "x" * 200 not in tree
    assert browser.get(f"/console/api/runs/{run.trace_id}/steps/1").json()["output"] == "x" * 10_000


def test_hostile_stored_text_renders_inert(browser: httpx.Client) -> None:
    failed = hostile.call(HOSTILE)
    with pytest.raises(dflow.RunFailedError):
        failed.result(10)
    for text in (
        browser.get(f"/console/runs/{failed.trace_id}").text,
        browser.get(f"/console/api/runs/{failed.trace_id}/tree").json()["tree"],
        browser.get("/console/").text,
    ):
        assert "<script>alert" not in text and "<img src=x" not in text and "<b><script" not in text
    page = browser.get(f"/console/runs/{failed.trace_id}").text
    assert "&lt;b&gt;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&lt;/b&gt;" in page  # the step's name
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # its output
    assert (
        "ValueError" in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; failed" in page
    )  # the error
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/console/static/console.js" defer>']


def test_an_agent_run_shows_its_conversation(browser: httpx.Client) -> None:
    model = ScriptedModel(
        [
            reply(
                f"I will look both up {HOSTILE}",
                calls=[call("lookup", city="Oslo"), call("lookup", city="Bergen")],
            ),
            reply(calls=[call("terminate", status="success", conclusion="both have parks")]),
        ]
    )
    agent = ToolCallAgent("con-agent", model, [lookup])
    assert isinstance(agent, ConsoleView)  # an agent supplies its runs' conversations
    run = agent.run("parks in Oslo and Bergen?")
    assert run.result(10).answer == "both have parks"
    conv = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["conversation"]
    assert "Conversation · con-agent" in conv and "<script>" not in conv
    assert conv.count('<div class="msg other"><div class="who">model call</div>') == 2  # one per turn
    conv = re.sub(r'<div class="msg other">.*?(?=<div class="msg |</div></section>)', "", conv, flags=re.S)
    order = [
        "parks in Oslo and Bergen?",
        "I will look both up &lt;script&gt;",
        "lookup",
        "&quot;Oslo&quot;",
        "&quot;Bergen&quot;",
        "Oslo has 3 parks &lt;i&gt;",
        "Bergen has 3 parks",
        "terminate",
        "both have parks",
    ]
    at = [conv.find(piece) for piece in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at))
    assert conv.count('class="msg tool"') == 3 and conv.count('class="msg assistant"') == 2
    tree = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["tree"]
    assert tree.count('<span class="nm">tool lookup</span>') == 1, "the turn's tool step names its tool"
    plain = browser.get(f"/console/api/runs/{twice.call(1).trace_id}/tree").json()
    assert plain["conversation"] == ""  # not an agent's run: no conversation


@tool
def shout(text: str) -> DFlow[str]:
    """A flow tool: upper-cases, as a step of its own."""
    return DFlow.just(text).map(str.upper).id("upper")


def test_an_agent_s_tool_branches_are_headed_by_their_tool(browser: httpx.Client) -> None:
    model = ScriptedModel(
        [reply(calls=[call("shout", text="a"), call("lookup", city="Oslo")]), reply("done")]
    )
    run = ToolCallAgent("con-branch-agent", model, [shout, lookup]).run("go")
    assert run.result(10).answer == "done"
    tree = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["tree"]
    assert "branch 0 · tool shout" in tree and "branch 1 · tool lookup" in tree, tree


class _FussyView:
    """A console view that fails on the runs it is for (those with ``con-view/boom`` in their data)."""

    def console_conversation(self, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if "con-view/boom" in data:
            raise RuntimeError(f"cannot read {HOSTILE}")
        return None


fussy = dflow.shared(_FussyView(), "con-fussy-view")
fussed = (
    DFlow.from_call("con-fussed")
    .map(lambda ctx, x: ctx.put("con-view/boom", 1))
    .id("mark")
    .init("con-fussed")
)


def test_a_failing_view_is_reported_on_the_page_which_still_shows(browser: httpx.Client) -> None:
    assert isinstance(fussy, ConsoleView)
    run = fussed.call(1)
    run.result(10)
    page = browser.get(f"/console/runs/{run.trace_id}")
    assert page.status_code == 200 and ">mark<" in page.text
    assert (
        "This view failed: RuntimeError: cannot read &lt;script&gt;" in page.text
        and "<script>alert" not in page.text
    )


# -- actions ------------------------------------------------------------------------------------------


def test_actions_without_login_token_or_origin_are_refused_and_change_nothing(
    url: str, browser: httpx.Client
) -> None:
    run = waiting_ask("guarded?")
    body = {"call_type": "con-answer", "payload": 1}
    csrf = browser.headers["X-DFlow-CSRF"]
    cookie = browser.cookies.get("dflow_console", path="/console") or ""
    auth = ConsoleAuth(ADMIN)
    other = auth.verify(auth.login(ADMIN) or "")
    assert other is not None
    cases: list[tuple[str, dict[str, str], dict[str, str], int]] = [
        ("no login", {}, {"X-DFlow-CSRF": csrf}, 401),
        ("no token", {"dflow_console": cookie}, {}, 403),
        ("wrong token", {"dflow_console": cookie}, {"X-DFlow-CSRF": csrf[:-2] + "xx"}, 403),
        (
            "other origin",
            {"dflow_console": cookie},
            {"X-DFlow-CSRF": csrf, "Origin": "http://evil.example"},
            403,
        ),
        (
            "cross-site",
            {"dflow_console": cookie},
            {"X-DFlow-CSRF": csrf, "Sec-Fetch-Site": "cross-site"},
            403,
        ),
        ("another login's token", {"dflow_console": cookie}, {"X-DFlow-CSRF": auth.csrf(other)}, 403),
    ]
    for what, cookies, headers, status in cases:
        with httpx.Client(base_url=url, cookies=cookies, timeout=30) as c:
            for action, payload in (("answer", body), ("cancel", {}), ("rerun", {"seq": 1})):
                r = c.post(f"/console/api/runs/{run.trace_id}/{action}", json=payload, headers=headers)
                assert r.status_code == status, (what, action, r.text)
    assert run.status().value == "waiting"
    # the admin token as a bearer token (a script) needs no page token
    with httpx.Client(base_url=url) as c:
        r = c.post(f"/console/api/runs/{run.trace_id}/cancel", headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_answering_a_call_resumes_the_run_and_bad_answers_change_nothing(browser: httpx.Client) -> None:
    run = waiting_ask("answer me")
    path = f"/console/api/runs/{run.trace_id}/answer"
    bad: list[tuple[dict[str, Any], int, str]] = [
        ({"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400, "not JSON"),
        (
            {"content": b"payload=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}},
            415,
            "JSON",
        ),
        (
            {
                "content": b'{"call_type": "con-answer", "payload": "' + b"a" * 2_000_000 + b'"}',
                "headers": {"Content-Type": "application/json"},
            },
            413,
            "limit",
        ),
        ({"json": {"payload": 1}}, 422, "call_type"),
        ({"json": {"call_type": "con-answer", "payload": 1, "extra": 2}}, 422, "extra"),
        ({"json": {"call_type": "something-else", "payload": 1}}, 409, "something-else"),
        ({"json": {"call_type": "con-answer", "payload": 1, "run": "elsewhere"}}, 422, "not this run"),
        ({"json": {"call_type": "con-job:7", "payload": 1}}, 403, "their own route"),
        (
            {
                "content": b'{"call_type": "con-answer", "payload": NaN}',
                "headers": {"Content-Type": "application/json"},
            },
            400,
            "NaN",
        ),
    ]
    for kwargs, status, words in bad:
        r = browser.post(path, **kwargs)
        assert r.status_code == status and words in r.text, (kwargs.get("json"), r.text[:300])
    assert run.status().value == "waiting"
    assert browser.post("/console/api/runs/no-such-run/answer", json={"call_type": "x"}).status_code == 404
    assert browser.post("/console/api/runs/..%2f..%2fetc/answer", json={"call_type": "x"}).status_code == 404
    r = browser.post(path, json={"call_type": "con-answer", "payload": {"because": [1, 2]}})
    assert r.status_code == 202 and r.json()["delivered"] is True
    assert run.result(10) == {"answered": {"because": [1, 2]}}
    assert browser.post(path, json={"call_type": "con-answer", "payload": 2}).status_code == 409


def test_answering_a_branch_wait_resumes_the_join(browser: httpx.Client) -> None:
    run = forked.call(3)
    wait_for(run, "waiting")
    deadline = time.monotonic() + 10
    while (
        found := re.search(
            r'data-run="([^"]+)" data-call="con-branch"',
            browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["waits"],
        )
    ) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    branch = found.group(1)
    assert branch.startswith(run.trace_id + "/")
    r = browser.post(
        f"/console/api/runs/{run.trace_id}/answer",
        json={"call_type": "con-branch", "payload": 5, "run": branch},
    )
    assert r.status_code == 202, r.text
    assert run.result(10) == 35


def test_cancel_and_rerun(browser: httpx.Client) -> None:
    run = waiting_ask("cancel me")
    r = browser.post(f"/console/api/runs/{run.trace_id}/rerun", json={"seq": 1})
    assert r.status_code == 409 and "still waiting" in r.json()["detail"] and run.status().value == "waiting"
    r = browser.post(f"/console/api/runs/{run.trace_id}/cancel", json={"reason": "from a test"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert (
        browser.post(f"/console/api/runs/{run.trace_id}/cancel", json={"reason": "x" * 2000}).status_code
        == 422
    )
    assert browser.post("/console/api/runs/no-such-run/cancel").status_code == 404
    done = twice.call(5)
    assert done.result(10) == 12
    for payload, status in (({"seq": "2"}, 422), ({"seq": -1}, 422), ({}, 422), ({"seq": 99}, 409)):
        assert browser.post(f"/console/api/runs/{done.trace_id}/rerun", json=payload).status_code == status, (
            payload
        )
    r = browser.post(f"/console/api/runs/{done.trace_id}/rerun", json={"seq": 2})
    assert r.status_code == 201, r.text
    again = Run(r.json()["trace_id"])
    assert r.json()["url"] == f"/console/runs/{again.trace_id}" and again.result(10) == 12
    page = browser.get(r.json()["url"]).text
    assert "Rerun of" in page and f'href="/console/runs/{done.trace_id}"' in page


def test_a_second_rerun_from_the_console_is_refused_naming_the_first_until_asked_again(
    browser: httpx.Client,
) -> None:
    done = twice.call(7)
    assert done.result(10) == 16
    url = f"/console/api/runs/{done.trace_id}/rerun"
    first = browser.post(url, json={"seq": 2})
    assert first.status_code == 201, first.text
    rerun = first.json()["trace_id"]
    refused = browser.post(url, json={"seq": 2})
    assert refused.status_code == 409, refused.text
    assert refused.json()["rerun"] == rerun and refused.json()["url"] == f"/console/runs/{rerun}"
    assert (
        f"rerun already, as run '{rerun}'" in refused.json()["detail"] and "again" in refused.json()["detail"]
    )
    assert browser.post(url + "?again=maybe", json={"seq": 2}).status_code == 422
    insisted = browser.post(url + "?again=true", json={"seq": 2})
    assert insisted.status_code == 201, insisted.text
    newer = insisted.json()["trace_id"]
    assert Run(newer).result(10) == 16 and Run(rerun).result(10) == 16

    parts = browser.get(f"/console/api/runs/{done.trace_id}/tree").json()
    assert parts["reruns"] == [rerun, newer] and parts["rerun_of"] is None
    assert "Rerun as" in parts["head"] and f'href="/console/runs/{newer}"' in parts["head"]
    assert parts["head"].index(newer) < parts["head"].index(rerun), "the newest first"
    of = browser.get(f"/console/api/runs/{newer}/tree").json()
    assert of["rerun_of"] == {"trace_id": done.trace_id, "seq": 2} and of["reruns"] == []


def test_a_reruns_page_marks_the_steps_it_replayed_in_its_tree_and_timeline(browser: httpx.Client) -> None:
    done = twice.call(8)
    assert done.result(10) == 18
    r = browser.post(f"/console/api/runs/{done.trace_id}/rerun", json={"seq": 2})
    assert r.status_code == 201, r.text
    again = Run(r.json()["trace_id"])
    assert again.result(10) == 18
    parts = browser.get(f"/console/api/runs/{again.trace_id}/tree").json()
    steps = dict(re.findall(r'data-seq="(\d+)" data-index="\d+">(.*?)</button>', parts["tree"]))
    assert set(steps) == {"0", "1", "2"}, parts["tree"]
    marked = {seq for seq, label in steps.items() if 'class="badge replayed"' in label}
    assert marked == {"0", "1"}, parts["tree"]  # the entry and inc: before the rerun point, as inspect says
    assert 'title="replayed: this rerun took the original run' in steps["1"]
    bars = {
        seq: classes
        for classes, seq in re.findall(
            r'<g class="bar ([^"]*)" data-run="[^"]*" data-seq="(\d+)"', parts["timeline"]
        )
    }
    assert "replayed" in bars["1"] and "replayed" not in bars["2"], parts["timeline"]
    assert parts["timeline"].count(">replayed</text>") == sum("replayed" in c for c in bars.values())
    original = browser.get(f"/console/api/runs/{done.trace_id}/tree").json()
    assert "replayed" not in original["tree"] and "replayed" not in original["timeline"]


# -- the live stream ------------------------------------------------------------------------------------


GATE = threading.Event()  # the step of ``gated`` runs until a test opens it


def _held(x: int) -> int:
    GATE.wait(20)
    return x + 1


gated = (
    DFlow.from_call("con-gated")
    .map(_held)
    .id("held")
    .in_thread()
    .map(lambda x: x * 2)
    .id("after")
    .init("con-gated")
)


def test_the_stream_sends_the_page_each_time_the_run_moves_then_ends(url: str, browser: httpx.Client) -> None:
    GATE.clear()
    run = gated.call(1)
    wait_for(run, "running")

    def open_later() -> None:
        time.sleep(0.4)
        GATE.set()

    t = threading.Thread(target=open_later)
    t.start()
    t0 = time.monotonic()
    events = stream_events(browser, f"/console/api/runs/{run.trace_id}/stream")
    t.join()
    assert time.monotonic() - t0 >= 0.35  # it stayed open while the step ran
    states = [data for event, data in events if event == "state"]
    assert states[0]["status"] == "running" and "running the next step" in states[0]["tree"]
    assert states[-1]["status"] == "done" and "after" in states[-1]["tree"] and run.result(5) == 4
    assert events[-1] == ("end", {"trace_id": run.trace_id, "status": "done"})
    # a finished run's stream: its state, then the end
    again = stream_events(browser, f"/console/api/runs/{run.trace_id}/stream")
    assert [e for e, _ in again] == ["state", "end"]
    with httpx.Client(base_url=url) as anon:
        assert anon.get(f"/console/api/runs/{run.trace_id}/stream").status_code == 401
    assert browser.get("/console/api/runs/no-such-run/stream").status_code == 404


def test_the_stream_of_a_run_that_waits_lets_go_and_the_page_reads_its_tree(browser: httpx.Client) -> None:
    """A browser keeps six connections to a host: a page per waiting run must not hold one."""
    run = waiting_ask("idle?")
    t0 = time.monotonic()
    events = stream_events(browser, f"/console/api/runs/{run.trace_id}/stream")
    assert time.monotonic() - t0 < 2, "the stream of a waiting run ends at once"
    assert [e for e, _ in events] == ["state", "idle"]
    assert events[0][1]["status"] == "waiting" and "con-answer" in events[0][1]["waits"]
    assert events[1][1] == {"trace_id": run.trace_id, "status": "waiting"}
    tree = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()  # what the page reads then
    assert tree["status"] == "waiting" and tree["tree"] == events[0][1]["tree"]
    dflow.DFlow.call("con-answer", "now", run.trace_id)
    assert run.result(5) == {"answered": "now"}
    assert [e for e, _ in stream_events(browser, f"/console/api/runs/{run.trace_id}/stream")] == [
        "state",
        "end",
    ]


def test_streams_are_capped_per_login(url: str, browser: httpx.Client) -> None:
    GATE.clear()
    run = gated.call(1)
    wait_for(run, "running")
    path = f"/console/api/runs/{run.trace_id}/stream"
    try:
        with httpx.Client(base_url=url, cookies=browser.cookies, timeout=30) as c:
            opened = [c.stream("GET", path) for _ in range(8)]
            responses = [s.__enter__() for s in opened]
            try:
                assert all(r.status_code == 200 for r in responses)
                r = c.get(path)
                assert r.status_code == 429 and "too many" in r.json()["detail"]
            finally:
                for s in opened:
                    s.__exit__(None, None, None)
            deadline = time.monotonic() + 10
            while _open_after_close(c, path) == 429:  # the server counts a stream closed once it notices
                assert time.monotonic() < deadline, "closed streams are still counted as open"
                time.sleep(0.05)
    finally:
        GATE.set()
    assert run.result(10) == 4


def _open_after_close(c: httpx.Client, path: str) -> int:
    with c.stream("GET", path) as r:
        return r.status_code


# -- static files, bad paths, the open console -----------------------------------------------------------


def test_static_files_come_from_an_allow_list_only(url: str) -> None:
    with httpx.Client(base_url=url) as c:
        css, js = c.get("/console/static/console.css"), c.get("/console/static/console.js")
        assert (
            css.status_code == 200
            and css.headers["content-type"].startswith("text/css")
            and ".node" in css.text
        )
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert js.headers["x-content-type-options"] == "nosniff"
    for path in (
        "/console/static/../app.py",
        "/console/static/%2e%2e/app.py",
        "/console/static/..%2fapp.py",
        "/console/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "/console/static//etc/passwd",
        "/console/static/%2fetc%2fpasswd",
        "/console/static/console.js%00.css",
        "/console/static/__init__.py",
        "/console/static/console_static/console.js",
        "/console/static/C:%5cwindows%5cwin.ini",
        "/console/static/....//....//app.py",
    ):
        status, body = raw_request(url, f"GET {path} HTTP/1.1")
        assert status == 404, (path, status, body[:200])
        assert "import" not in body and "root:" not in body and "[project]" not in body


def test_the_packaged_static_files_are_listed_as_package_data() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["dflow.server.console"]
    static = ROOT / "dflow" / "server" / "console" / "static"
    files = {p.name for p in static.iterdir() if p.is_file()}
    covered = {p.name for g in globs for p in (ROOT / "dflow" / "server" / "console").glob(g)}
    assert files and files == covered, f"static files not shipped in the wheel: {sorted(files - covered)}"


def test_a_server_without_an_admin_token_has_an_open_console_that_still_guards_writes(
    runtime: dflow.Runtime,
) -> None:
    with ServerThread(create_app()) as base, httpx.Client(base_url=base, timeout=30) as c:
        run = waiting_ask("open?")
        page = c.get(f"/console/runs/{run.trace_id}")
        assert page.status_code == 200 and "Log out" not in page.text
        assert c.get("/console/login").status_code == 303
        path = f"/console/api/runs/{run.trace_id}/cancel"
        assert c.post(path, json={}).status_code == 403  # no page token
        csrf = csrf_of(c)
        assert (
            c.post(path, json={}, headers={"X-DFlow-CSRF": csrf, "Origin": "http://evil.example"}).status_code
            == 403
        )
        assert c.get("/console/", headers={"Host": "evil.example"}).status_code == 421  # DNS rebinding
        assert run.status().value == "waiting"
        r = c.post(path, json={}, headers={"X-DFlow-CSRF": csrf})
        assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_the_console_can_be_left_out(runtime: dflow.Runtime) -> None:
    with ServerThread(create_app(admin_token=ADMIN, console=False)) as base, httpx.Client(base_url=base) as c:
        assert c.get("/console/").status_code == 404 and c.get("/health").status_code == 200


# Input the console must refuse cleanly, and stored text of any size (an error message, an agent's
# message) shown cut in every page and every live update.
LONG_NAME = "rv-" + "p" * 1200  # a pipeline's name is any str (by default its head key, which may be long)

named_long = DFlow.from_call("rv-long").map(lambda x: x + 1).id("inc").init(LONG_NAME)
steps = DFlow.from_call("rv-steps").map(lambda x: x * 2).id("dbl").init("rv-steps")


def _shout(value: Any) -> Any:
    raise ValueError("z" * 300_000)


loud = DFlow.from_call("rv-loud").map(_shout).id("shout").init("rv-loud")
chatty = (
    DFlow.from_call("rv-chatty").map(lambda ctx, x: ctx.put("rv-chatty/said", x)).id("say").init("rv-chatty")
)


class _ChattyView:
    """A console view whose runs hold one very long message."""

    def console_conversation(self, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if "rv-chatty/said" not in data:
            return None
        return [{"role": "user", "content": "hello"}, {"role": "tool", "content": "y" * 2_000_000}]


chatty_view = dflow.shared(_ChattyView(), "rv-chatty-view")


def test_digits_that_int_does_not_read_are_refused_not_a_500(browser: httpx.Client) -> None:
    run = steps.call(4)
    assert run.result(10) == 8
    for path in (
        "/console/api/runs?limit=%C2%B2",
        "/console/?limit=%C2%B2",
        "/console/api/runs?limit=%D9%A3",
        f"/console/api/runs/{run.trace_id}/steps/%C2%B2",
        f"/console/api/runs/{run.trace_id}/steps/%D9%A1",
    ):
        r = browser.get(path)
        assert r.status_code in (404, 422), (path, r.status_code, r.text[:200])
        assert "number" in r.text, r.text[:200]
    assert browser.get(f"/console/api/runs/{run.trace_id}/steps/1").json()["output"] == "8"


def test_every_pipeline_the_runs_list_offers_can_be_filtered_by(browser: httpx.Client) -> None:
    run = named_long.call(1)
    assert run.result(10) == 2
    page = browser.get("/console/")
    assert page.status_code == 200 and f'<option value="{LONG_NAME}">' in page.text  # offered...
    listed = browser.get("/console/api/runs", params={"pipeline": LONG_NAME})  # ...and it filters
    assert listed.status_code == 200, listed.text[:300]
    assert [r["trace_id"] for r in listed.json()["runs"]] == [run.trace_id]
    assert listed.json()["counts"]["done"] == 1
    html = browser.get("/console/", params={"pipeline": LONG_NAME})
    assert html.status_code == 200 and run.trace_id in html.text
    huge = browser.get("/console/api/runs", params={"pipeline": "q" * 16_385})
    assert huge.status_code == 422 and "over the limit" in huge.text  # still bounded


def test_a_huge_error_message_is_shown_cut_not_whole(browser: httpx.Client) -> None:
    run = loud.call(1)
    with pytest.raises(dflow.RunFailedError):
        run.result(10)
    page = browser.get(f"/console/runs/{run.trace_id}")
    assert page.status_code == 200 and "ValueError" in page.text and "z" * 1000 in page.text
    assert len(page.text) < 100_000, len(page.text)
    assert "more characters" in page.text
    parts = browser.get(f"/console/api/runs/{run.trace_id}/tree").text
    assert len(parts) < 100_000, len(parts)
    step = browser.get(f"/console/api/runs/{run.trace_id}/steps/1").json()
    assert step["error"]["type"] == "ValueError" and step["error"]["message"].startswith("z" * 1000)
    assert len(step["error"]["message"]) < 30_000, len(step["error"]["message"])


def test_a_huge_conversation_message_is_shown_cut_not_whole(browser: httpx.Client) -> None:
    run = chatty.call("hi")
    run.result(10)
    conv = browser.get(f"/console/api/runs/{run.trace_id}/tree").json()["conversation"]
    assert "hello" in conv and "y" * 1000 in conv and "more characters" in conv
    assert len(conv) < 100_000, len(conv)
