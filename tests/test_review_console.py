"""Review findings on the web console, each a defect that was there before its fix: digits
that ``str.isdigit`` takes and ``int`` does not (a 500), a served pipeline that the runs
list offers but refuses to filter by, and stored text of any size rendered whole (an error
message, an agent's message) in every page and every live update."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest

import dflow
from dflow import DFlow
from dflow.server import ServerThread, create_app
from tests.support.console import csrf_of, login

ADMIN = "admin-token-of-the-console-review-0123456789"
LONG_NAME = "rv-" + "p" * 1200  # a pipeline's name is any str (by default its head key, which may be long)

named_long = DFlow.from_call("rv-long").map(lambda x: x + 1).id("inc").init(LONG_NAME)
steps = DFlow.from_call("rv-steps").map(lambda x: x * 2).id("dbl").init("rv-steps")


def _shout(value: Any) -> Any:
    raise ValueError("z" * 300_000)


loud = DFlow.from_call("rv-loud").map(_shout).id("shout").init("rv-loud")
chatty = DFlow.from_call("rv-chatty").map(lambda ctx, x: ctx.put("rv-chatty/said", x)).id("say").init("rv-chatty")


class _ChattyView:
    """A console view whose runs hold one very long message."""

    def console_conversation(self, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if "rv-chatty/said" not in data:
            return None
        return [{"role": "user", "content": "hello"}, {"role": "tool", "content": "y" * 2_000_000}]


chatty_view = dflow.shared(_ChattyView(), "rv-chatty-view")


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    with ServerThread(create_app(admin_token=ADMIN)) as base:
        yield base


@pytest.fixture
def browser(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        login(c, ADMIN)
        c.headers["X-DFlow-CSRF"] = csrf_of(c)
        yield c


def test_digits_that_int_does_not_read_are_refused_not_a_500(browser: httpx.Client) -> None:
    run = steps.call(4)
    assert run.result(10) == 8
    for path in ("/console/api/runs?limit=%C2%B2", "/console/?limit=%C2%B2", "/console/api/runs?limit=%D9%A3",
                 f"/console/api/runs/{run.trace_id}/steps/%C2%B2", f"/console/api/runs/{run.trace_id}/steps/%D9%A1"):
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
