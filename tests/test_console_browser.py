"""The web console in a real browser: the system's headless chromium driven by Playwright
(never a downloaded browser; the tests skip without chromium, and fail under ``CI``).

A test logs in through the form and finds its run in the runs list, turns the list oldest first
and back (its filters kept); the workers page shows the step this runtime runs, refreshed
without a reload, linking to its run; a run page draws the
step tree and follows the run live while it advances; answering a ``from_call`` from the
page resumes the run (invalid JSON is refused before anything is sent); cancelling from the
page cancels it (dismissing the confirmation does not); an action without the login or the
page's token is refused; a step's panel shows its values and re-runs a finished run from it;
hostile stored text shows as text and runs no script; a streamed model reply grows in the
conversation, then the committed one takes its place. Screenshots go to each test's
``tmp_path``."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dflow
from dflow import DFlow, Run
from dflow.server import ServerThread, create_app
from tests.support.console import chromium

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # the dev extra is missing: the ``chrome`` fixture skips (or fails under CI)
    pass

ADMIN = "admin-token-of-the-console-browser-tests-0123"
HOSTILE = "<img src=x onerror=alert('xss')>"


def _second(first: Any) -> DFlow[Any]:
    return DFlow.from_call("cb-second").map(lambda b: {"first": first, "second": b}).id("both")


two_calls = (
    DFlow.from_call("cb-two")
    .map(lambda q: f"asked {q}")
    .id("question")
    .flat_map(lambda q: DFlow.from_call("cb-first"))
    .id("first")
    .flat_map(_second)
    .id("second")
    .init("cb-two")
)
counted = (
    DFlow.from_call("cb-count")
    .map(lambda x: x + 1)
    .id("inc")
    .map(lambda x: x * 3)
    .id("triple")
    .init("cb-count")
)
_release = threading.Event()  # (a module's: a step's function may not capture a lock)


def held(x: int) -> int:
    _release.wait(20)
    return x


holding = DFlow.from_call("cb-hold").map(held).id("held").in_thread().init("cb-hold")
ordered = DFlow.from_call("cb-order").map(lambda x: x * 10).id("tens").init("cb-order")
shouting = (
    DFlow.from_call("cb-shout")
    .map(lambda x: HOSTILE)
    .id("shout")
    .name("<script>alert('name')</script>")
    .init("cb-shout")
)


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    with ServerThread(create_app(admin_token=ADMIN)) as base:
        yield base


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    executable = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True)
        yield browser
        browser.close()


class Dialogs:
    """The page's dialogs: those a test expects are answered as it says; any other (an
    injected script's alert) is dismissed and fails the test."""

    def __init__(self) -> None:
        self.expected: list[tuple[str, bool]] = []  # (words the message holds, accept)
        self.unexpected: list[str] = []

    def handle(self, dialog: Any) -> None:
        if not self.expected:
            self.unexpected.append(f"{dialog.type}: {dialog.message}")
            dialog.dismiss()
            return
        words, accept = self.expected.pop(0)
        if dialog.type != "confirm" or words not in dialog.message:
            self.unexpected.append(f"{dialog.type}: {dialog.message} (expected a confirmation of {words!r})")
            dialog.dismiss()
        elif accept:
            dialog.accept()
        else:
            dialog.dismiss()

    def accept(self, words: str) -> None:
        """Accept the next confirmation, which must mention ``words``."""
        self.expected.append((words, True))

    def dismiss(self, words: str) -> None:
        """Dismiss the next confirmation, which must mention ``words``."""
        self.expected.append((words, False))


@pytest.fixture
def dialogs() -> Dialogs:
    return Dialogs()


@pytest.fixture(scope="module")
def session(chrome: Any, url: str) -> Iterator[Any]:
    """A browser context (its own cookies) logged in through the console's form."""
    context = chrome.new_context(base_url=url, viewport={"width": 1300, "height": 900})
    p = context.new_page()
    p.goto("/console/")
    expect(p).to_have_url(f"{url}/console/login?next=%2Fconsole%2F")
    p.fill("input[name=token]", ADMIN)
    p.click("button[type=submit]")
    expect(p.locator("h1")).to_have_text("Runs")
    p.close()
    yield context
    context.close()


@pytest.fixture
def page(session: Any, dialogs: Dialogs) -> Iterator[Any]:
    """A page of the logged-in browser, on the runs list."""
    p = session.new_page()
    p.set_default_timeout(8000)
    p.on("dialog", dialogs.handle)
    p.goto("/console/")
    yield p
    p.close()
    assert not dialogs.unexpected, f"the page opened dialogs nobody asked for: {dialogs.unexpected}"


def wait_status(run: Run[Any], status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while run.status().value != status:
        assert time.monotonic() < deadline, f"{run} is {run.status().value}, not {status}"
        time.sleep(0.02)


def test_the_runs_list_shows_a_run_started_by_the_test(page: Any, tmp_path: Path) -> None:
    run = two_calls.call("listed")
    wait_status(run, "waiting")
    page.reload()
    row = page.locator(f'tr[data-trace="{run.trace_id}"]')
    expect(row).to_contain_text("waiting")
    expect(row).to_contain_text("cb-first")
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    page.select_option("select[name=status]", "waiting")
    page.click(".filters button[type=submit]")
    expect(page).to_have_url(f"{page.url.split('?')[0]}?key=&pipeline=&status=waiting&after=&before=")
    expect(row).to_be_visible()
    row.locator("a").click()
    expect(page.locator("#head h1")).to_have_text(run.trace_id)
    run.cancel()


def test_the_runs_list_shows_new_runs_without_a_reload_and_goes_to_a_run_by_its_id(page: Any) -> None:
    expect(page.locator("h1")).to_contain_text("Runs")
    run = two_calls.call("arrives later")
    wait_status(run, "waiting")
    row = page.locator(f'tr[data-trace="{run.trace_id}"]')
    expect(row).to_contain_text("waiting for cb-first", timeout=12_000)  # the list refreshes itself
    expect(page.locator("#live")).to_contain_text("refreshed")
    page.fill("input[name=run]", run.trace_id)
    page.click("form.goto button")
    expect(page.locator("#head h1")).to_have_text(run.trace_id)
    run.cancel()


def utc(t: float) -> str:
    """Time ``t`` as a ``datetime-local`` field takes it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def test_the_runs_list_keeps_the_runs_started_in_the_window_of_time_given_in_its_form(page: Any) -> None:
    run = counted.call(1)
    assert run.result(10) == 6
    started = run.info().created
    row = page.locator(f'tr[data-trace="{run.trace_id}"]')
    page.fill("input[name=pipeline]", "cb-count")
    page.fill("input[name=after]", utc(started - 60))
    page.click(".filters button[type=submit]")
    expect(row).to_contain_text("done")
    expect(page.locator("input[name=after]")).to_have_value(utc(started - 60))  # the form keeps it
    page.fill("input[name=after]", "")
    page.fill("input[name=before]", utc(started - 3600))
    page.click(".filters button[type=submit]")
    expect(page.locator("table.runs")).to_contain_text("No runs match.")
    expect(row).to_have_count(0)
    page.click("a.reset")
    expect(row).to_be_visible()


def test_the_runs_list_turns_to_oldest_first_and_back_keeping_its_filters(page: Any) -> None:
    made = []
    for i in range(2):
        if made:  # each run in a millisecond of its own
            last = made[-1].info().created
            while time.time() < last + 0.005:
                time.sleep(0.001)
        made.append(ordered.call(i))
    assert [r.result(10) for r in made] == [0, 10]
    page.fill("input[name=pipeline]", "cb-order")
    page.click(".filters button[type=submit]")
    rows = page.locator("tr.run-row")
    expect(rows.first).to_have_attribute("data-trace", made[1].trace_id)
    page.click("a[data-sort=oldest]")
    expect(page.locator("a[data-sort=oldest]")).to_have_attribute("aria-current", "true")
    expect(rows.first).to_have_attribute("data-trace", made[0].trace_id)
    expect(page.locator("input[name=pipeline]")).to_have_value("cb-order")  # the filters stay
    page.select_option("select[name=status]", "done")
    page.click(".filters button[type=submit]")  # filtering again keeps the order
    expect(page).to_have_url(re.compile(r"[?&]sort=oldest(&|$)"))
    expect(rows.first).to_have_attribute("data-trace", made[0].trace_id)
    page.click("a[data-sort=newest]")
    expect(rows.first).to_have_attribute("data-trace", made[1].trace_id)
    expect(page.locator("select[name=status]")).to_have_value("done")


def test_the_workers_page_shows_the_step_this_runtime_runs_without_a_reload_and_links_to_its_run(
    page: Any, runtime: dflow.Runtime, tmp_path: Path
) -> None:
    page.click("header nav a:text('Workers')")
    expect(page.locator("h1")).to_contain_text("Workers")
    row = page.locator(f'tr.worker-row[data-worker="{runtime.worker_id}"]')
    expect(row).to_be_visible(timeout=15_000)
    _release.clear()
    try:
        run = holding.call(4)
        expect(row.locator(f'a[href="/console/runs/{run.trace_id}"]')).to_be_visible(timeout=20_000)
        expect(page.locator("#live")).to_contain_text("refreshed")  # (the script refreshed the table)
        page.screenshot(path=str(tmp_path / "workers.png"), full_page=True)
        row.locator("a").first.click()
        expect(page.locator("#head h1")).to_have_text(run.trace_id)
    finally:
        _release.set()
    assert run.result(10) == 4


def test_a_run_page_follows_the_run_live_and_answers_its_call(
    page: Any, dialogs: Dialogs, tmp_path: Path
) -> None:
    run = two_calls.call("live?")
    wait_status(run, "waiting")
    page.goto(f"/console/runs/{run.trace_id}")
    tree = page.locator("#tree")
    expect(tree.locator(".node .nm", has_text=re.compile(r"^question$"))).to_be_visible()
    expect(page.locator("#live")).to_have_text("waiting · checked every 3 s")  # (its stream let go)
    expect(page.locator("form.answer h2")).to_contain_text("cb-first")
    page.screenshot(path=str(tmp_path / "waiting.png"), full_page=True)
    # the run advances elsewhere: the page shows it without a reload
    DFlow.call("cb-first", "one", run.trace_id)
    expect(page.locator("form.answer h2")).to_contain_text("cb-second")
    expect(tree.locator(".node .nm", has_text=re.compile(r"^cb-second$"))).to_be_visible()
    page.screenshot(path=str(tmp_path / "advanced.png"), full_page=True)
    # invalid JSON is refused in the page: nothing is sent
    form = page.locator("form.answer")
    form.locator("textarea").fill("{not json")
    form.locator("button").click()
    expect(form.locator(".error")).to_contain_text("Not valid JSON, nothing was sent")
    time.sleep(0.2)
    assert run.status().value == "waiting"
    # a valid answer, confirmed, resumes the run
    form.locator("textarea").fill('{"two": [2, "<b>2</b>"]}')
    dialogs.accept("cb-second")
    form.locator("button").click()
    assert run.result(10) == {"first": "one", "second": {"two": [2, "<b>2</b>"]}}
    expect(page.locator("#head .badge")).to_have_text("done")
    expect(page.locator("#live")).to_have_text("ended")
    expect(page.locator("form.answer")).to_have_count(0)  # nothing waits any more
    expect(page.locator("#head .outcome")).to_contain_text('"<b>2</b>"')  # shown as text
    page.screenshot(path=str(tmp_path / "done.png"), full_page=True)


def test_pages_of_many_waiting_runs_leave_the_browser_room_for_more(session: Any, tmp_path: Path) -> None:
    """A browser opens six connections to a host: the pages of waiting runs must not keep them
    (ten live run pages open at once, and the runs list beside them)."""
    runs = [two_calls.call(f"tab {i}") for i in range(10)]
    for run in runs:
        wait_status(run, "waiting")
    pages = []
    try:
        for run in runs:
            p = session.new_page()
            p.set_default_timeout(8000)
            p.goto(f"/console/runs/{run.trace_id}")
            expect(p.locator("#head h1")).to_have_text(run.trace_id)
            pages.append(p)
        for p in pages:
            expect(p.locator("#live")).to_contain_text("checked every")
        listing = session.new_page()
        listing.set_default_timeout(8000)
        listing.goto("/console/")
        expect(listing.locator(f'tr[data-trace="{runs[-1].trace_id}"]')).to_contain_text("waiting")
        listing.screenshot(path=str(tmp_path / "runs-beside-10-pages.png"), full_page=True)
        pages.append(listing)
        DFlow.call("cb-first", "moved", runs[0].trace_id)  # a page looking every 3 s sees it
        expect(pages[0].locator("form.answer h2")).to_contain_text("cb-second")
    finally:
        for p in pages:
            p.close()
        for run in runs:
            run.cancel()


def test_cancelling_from_the_page_cancels_the_run(page: Any, dialogs: Dialogs, tmp_path: Path) -> None:
    run = two_calls.call("cancel me")
    wait_status(run, "waiting")
    page.goto(f"/console/runs/{run.trace_id}")
    dialogs.dismiss(run.trace_id)  # changed their mind
    page.click("#cancel")
    time.sleep(0.3)
    assert run.status().value == "waiting"
    dialogs.accept(run.trace_id)
    page.click("#cancel")
    expect(page.locator("#flash")).to_have_text("Run cancelled.")
    expect(page.locator("#head .badge")).to_have_text("cancelled")
    expect(page.locator("#cancel")).to_be_hidden()
    assert run.status().value == "cancelled"
    page.screenshot(path=str(tmp_path / "cancelled.png"), full_page=True)


def test_an_action_without_the_login_or_the_page_token_is_refused(page: Any, chrome: Any, url: str) -> None:
    run = two_calls.call("guarded")
    wait_status(run, "waiting")
    page.goto(f"/console/runs/{run.trace_id}")
    # from the console's own page, a request without its token
    status = page.evaluate(
        """async (path) => (await fetch(path, {method: "POST", headers: {"Content-Type": "application/json"},
                                              body: "{}"})).status""",
        f"/console/api/runs/{run.trace_id}/cancel",
    )
    assert status == 403
    # a browser that never logged in
    stranger = chrome.new_context(base_url=url)
    try:
        r = stranger.request.post(f"/console/api/runs/{run.trace_id}/cancel", data={})
        assert r.status == 401
        other = stranger.new_page()
        other.goto(f"/console/runs/{run.trace_id}")
        expect(other.locator("h1")).to_have_text("Log in")
    finally:
        stranger.close()
    assert run.status().value == "waiting"
    run.cancel()


def test_a_step_panel_shows_values_and_reruns_a_finished_run(
    page: Any, dialogs: Dialogs, tmp_path: Path
) -> None:
    run = counted.call(4)
    assert run.result(10) == 15
    page.goto(f"/console/runs/{run.trace_id}")
    bars = page.locator("#timeline svg g.bar")
    expect(bars).to_have_count(2)  # inc and triple, drawn (the page's CSP allows no inline style)
    assert bars.nth(1).bounding_box()["width"] > 100, "the timeline spans the card"
    bars.nth(0).locator("text").click()  # a bar (its label or its rect) opens its step too
    expect(page.locator("#detail h2")).to_have_text("inc")
    page.click('#tree .node[data-seq="2"]')
    panel = page.locator("#detail")
    expect(panel.locator("h2")).to_have_text("triple")
    expect(panel.locator("pre").nth(0)).to_have_text("5")
    expect(panel.locator("pre").nth(1)).to_have_text("15")
    expect(page.locator('#tree .node[data-seq="2"]')).to_have_class("node selected")
    page.screenshot(path=str(tmp_path / "step.png"), full_page=True)
    dialogs.accept("from step #2")
    panel.locator("button.rerun").click()
    expect(page.locator("#head")).to_contain_text("Rerun of")
    new_id = page.locator("#head h1").inner_text()
    assert new_id != run.trace_id and Run(new_id).result(10) == 15


def test_a_second_rerun_from_the_console_asks_first_naming_the_rerun_the_run_has(
    page: Any, dialogs: Dialogs
) -> None:
    run = counted.call(6)
    assert run.result(10) == 21
    first = run.rerun_from(2)
    assert first.result(10) == 21
    page.goto(f"/console/runs/{run.trace_id}")
    expect(page.locator("#head")).to_contain_text("Rerun as")
    expect(page.locator("#head")).to_contain_text(first.trace_id)
    page.click('#tree .node[data-seq="2"]')
    button = page.locator("#detail button.rerun")
    dialogs.accept("from step #2")
    dialogs.dismiss(f"was rerun already, as run {first.trace_id}")
    button.click()
    expect(page.locator("#flash")).to_contain_text("rerun already")
    assert run.info().reruns == (first.trace_id,), "dismissed: nothing was started"
    dialogs.accept("from step #2")
    dialogs.accept(f"was rerun already, as run {first.trace_id}")
    button.click()
    expect(page.locator("#head")).to_contain_text("Rerun of")
    second = page.locator("#head h1").inner_text()
    assert second not in (run.trace_id, first.trace_id) and Run(second).result(10) == 21
    assert run.info().reruns == (first.trace_id, second)


def test_hostile_stored_text_runs_no_script(page: Any, dialogs: Dialogs, tmp_path: Path) -> None:
    run = shouting.call(1)
    assert run.result(10) == HOSTILE
    page.goto(f"/console/runs/{run.trace_id}")
    expect(page.locator("#tree .node .nm").nth(1)).to_have_text("<script>alert('name')</script>")
    expect(page.locator("#head .outcome pre")).to_have_text(HOSTILE)
    assert page.locator("#tree img, #head img").count() == 0
    page.click('#tree .node[data-seq="1"]')
    expect(page.locator("#detail pre").nth(1)).to_have_text(HOSTILE)
    page.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
    assert dialogs.unexpected == []  # no alert fired


def test_a_run_page_shows_a_streamed_reply_growing_then_the_committed_one(page: Any, tmp_path: Path) -> None:
    from dflow_agents import OpenAIChatModel, ToolCallAgent
    from tests.agents.test_toolcall_agent import close_on_runtime
    from tests.support.fake_llm import serving

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    with serving() as llm:
        pieces = ["Once", " upon", " a time", ", a console."]
        llm.stream(
            [chunk({"role": "assistant"}), *(chunk({"content": p}) for p in pieces), chunk({}, "stop")],
            hold_after=3,
        )
        model = OpenAIChatModel("qwen-plus", base_url=llm.base_url, api_key="EMPTY", stream=True)
        try:
            run = ToolCallAgent(f"cb-streaming-{time.monotonic_ns()}", model, []).run("tell a story")
            page.goto(f"/console/runs/{run.trace_id}")
            growing = page.locator("#conversation .msg.streaming")
            expect(growing.locator(".text")).to_have_text("Once upon", timeout=15_000)
            expect(growing.locator(".who")).to_contain_text("streaming")
            page.screenshot(path=str(tmp_path / "streaming.png"), full_page=True)
            assert run.status().value == "running", "the page showed the reply while the step streamed"
            llm.go.set()
            assert run.result(15).answer == "Once upon a time, a console."
            expect(growing).to_have_count(0, timeout=15_000)  # the committed reply took its place
            expect(page.locator("#conversation .msg.assistant .text").last).to_have_text(
                "Once upon a time, a console."
            )
            page.screenshot(path=str(tmp_path / "committed.png"), full_page=True)
        finally:
            close_on_runtime(model)
