"""A hostile review of issue 9's agent parts, in local mode over real sockets.

* pulled jobs (``dflow_agents.pulling`` and its routes): another session never receives, sees
  or answers a job; long-poll parameters out of range; odd job ids; malformed, oversized,
  concurrent and late reports; a long poll abandoned by its client; a job's wait answered
  around the board;
* the planning tool and PlanningFlow: bad and boolean step indexes, huge plans, Unicode,
  plan ids across runs, a planner that names its own plan id; plan templates with
  format-string look-alikes and odd names, and ``from_plan`` with overlapping values;
* the deep crawler and its fetcher, over a site the tests serve: ids the model invents, raw
  URLs, links that are not http(s), other host names for the same server, spellings of one
  URL, robots.txt behind spellings and redirects, off-site redirects, link floods, a gzip
  bomb, unknown charsets, and the byte budget.

Tests marked ``xfail(strict=True)`` show a defect that is still there (the reason names it).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import tracemalloc
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

import dflow
from dflow.server import ServerThread, Tokens, create_app
from dflow_agents import AgentStatus, ChatMessage, ChatResponse, ToolCall, ToolCallAgent, ToolSpec
from dflow_agents.crawler import DeepCrawlerAgent
from dflow_agents.fetch import Fetcher
from dflow_agents.plan_tool import planning_tool
from dflow_agents.planning import PlanningFlow
from dflow_agents.plans import PlanBook, PlanDraft, PlanStepStatus
from dflow_agents.pulling import InMemoryJobBoard, PullingJobTool, agent_routes, job_routes
from dflow_agents.templates import InMemoryPlanTemplates, PlanTemplate
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply
from tests.support.http_api import SessionClient
from tests.support.pulled import ask_user, fetch_or_ask, fetch_page

ADMIN = "admin-token-of-the-review-agents-tests-0123456789"
SECRET = "server-secret-of-the-review-agents-tests-0123456789"
MAX_REPORT = 4096
ASK_TIMEOUT = 1.0

board = InMemoryJobBoard()


fetch_job = PullingJobTool(fetch_page, board, timeout=20, name="rv_fetch")
ask_job = PullingJobTool(ask_user, board, timeout=ASK_TIMEOUT, name="rv_ask")
pull_agent = ToolCallAgent("rv-review-pull", FunctionModel(fetch_or_ask("rv_fetch", "rv_ask")),
                           [fetch_job, ask_job])


@pytest.fixture(scope="module")
def url(runtime: dflow.Runtime) -> Iterator[str]:
    app = create_app(tokens=Tokens(SECRET, ttl=600), admin_token=ADMIN,
                     routes=[job_routes(board, max_report_bytes=MAX_REPORT), agent_routes(pull_agent)])
    with ServerThread(app) as base:
        yield base


class Client(SessionClient):
    """One session's client (the browser plug-in)."""

    admin = ADMIN
    agent = "rv-review-pull"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# -- pulled jobs ---------------------------------------------------------------------------------


def test_another_session_never_receives_sees_or_answers_a_job(api: httpx.Client) -> None:
    owner, stranger = Client(api), Client(api)
    trace = owner.chat("fetch http://owner.example/")
    assert stranger.pull(wait=0.5) == []  # pending for the owner, never handed to another session
    (job,) = owner.pull()
    assert set(job) == {"id", "tool", "arguments", "run", "created", "deadline", "state"}  # no session, no wait
    for method, body in (("GET", None), ("POST", {"result": "hijacked"}), ("POST", {"error": "hijacked"})):
        r = api.request(method, f"/jobs/{job['id']}", headers=stranger.h, json=body)
        assert r.status_code == 403, (method, body, r.text)
        assert "hijacked" not in r.text and owner.session not in r.text
    assert owner.job(job["id"])["state"] == "pending"
    assert owner.status(trace)["waiting_for"] is not None
    assert owner.report(job["id"], result="real").status_code == 200
    assert owner.result(trace)["answer"] == "observed: real"
    assert stranger.pull(wait=0.2) == []


def test_many_sessions_at_once_each_get_only_their_own_jobs(api: httpx.Client, url: str) -> None:
    clients = [Client(api) for _ in range(5)]
    traces = {c.session: c.chat(f"fetch http://{c.session.lower()}.example/") for c in clients}
    got: dict[str, list[dict[str, Any]]] = {}

    def pull(c: Client) -> None:
        with httpx.Client(base_url=url, timeout=30) as own:
            r = own.get("/jobs", headers=c.h, params={"wait": 5})
            got[c.session] = r.json()["jobs"]

    threads = [threading.Thread(target=pull, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        (job,) = got[c.session]
        assert job["arguments"] == {"url": f"http://{c.session.lower()}.example/"} and job["run"] == traces[c.session]
        assert c.report(job["id"], result=c.session).status_code == 200
        assert c.result(traces[c.session])["answer"] == f"observed: {c.session}"


def test_long_poll_parameters_out_of_range_are_422_at_once(api: httpx.Client) -> None:
    me = Client(api)
    for query in ("wait=nan", "wait=inf", "wait=-inf", "wait=-1", "wait=60.001", "wait=1e9", "wait=abc", "wait=",
                  "wait=0x10", "wait=%00", "limit=0", "limit=101", "limit=1.5", "limit=true",
                  "limit=-1", "limit=99999999999999999999"):
        t0 = time.monotonic()
        r = api.get(f"/jobs?{query}", headers=me.h)
        assert r.status_code == 422, (query, r.status_code, r.text[:200])
        assert time.monotonic() - t0 < 1.0, query
    t0 = time.monotonic()
    assert me.pull(wait=0) == [] and time.monotonic() - t0 < 1.0
    assert api.get("/jobs?wait=0.2").status_code == 401  # no token, no poll


def test_odd_job_ids_are_404_never_500(api: httpx.Client) -> None:
    me = Client(api)
    for job_id in ("x" * 65, "a b", "\u00e9", "%2e%2e", "a" * 64, "0", "job:1", "*", "%00", "..%2f..%2fjobs"):
        for method in ("GET", "POST"):
            r = api.request(method, f"/jobs/{job_id}", headers=me.h, json={"result": 1} if method == "POST" else None)
            assert r.status_code == 404, (job_id, method, r.status_code, r.text[:200])


def test_malformed_and_oversized_reports_change_nothing(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://malformed.example/")
    (job,) = me.pull()
    h = {**me.h, "Content-Type": "application/json"}
    bad: list[tuple[bytes, int]] = [
        (b'{"result": 1, "error": "both"}', 422), (b"{}", 422), (b'{"error": null}', 422), (b'{"error": 5}', 422),
        (b"[]", 422), (b'"result"', 422), (b"null", 422), (b'{"result": 1, "extra": 2}', 422),
        (b'{"error": "' + b"e" * 4001 + b'"}', 422), (b'{"error": "' + b"e" * 5000 + b'"}', 413),
        (b'{"result": "' + b"r" * 5000 + b'"}', 413), (b"{", 400), (b"", 400), (b"\xff\xfe\xfd", 400),
        (b'{"result": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400), (b"{'result': 1}", 400),
    ]
    for body, code in bad:
        r = api.post(f"/jobs/{job['id']}", headers=h, content=body)
        assert r.status_code == code, (body[:40], r.status_code, r.text[:200])
    assert me.job(job["id"])["state"] == "pending"
    assert me.status(trace)["status"] == "waiting"
    assert me.report(job["id"], result={"ok": "after all that"}).status_code == 200
    assert me.result(trace)["answer"] == 'observed: {"ok": "after all that"}'


def test_twenty_concurrent_reports_one_wins_and_its_value_is_the_observation(api: httpx.Client, url: str) -> None:
    me = Client(api)
    trace = me.chat("fetch http://race.example/")
    (job,) = me.pull()
    codes = me.report_at_once(url, job["id"], [f"value-{i}" for i in range(20)])
    winners = [value for value, code in codes.items() if code == 200]
    assert len(winners) == 1 and Counter(codes.values()) == {200: 1, 409: 19}, codes
    assert me.result(trace)["answer"] == f"observed: {winners[0]}"
    assert me.job(job["id"])["state"] == "answered"


def test_a_report_after_the_timeout_is_410_and_the_run_heard_the_timeout(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("ask anyone there?")
    (job,) = me.pull()
    answer = me.result(trace, timeout=ASK_TIMEOUT + 10)["answer"]
    assert "no client reported the job of tool 'rv_ask'" in answer
    r = me.report(job["id"], result="too late")
    assert r.status_code == 410 and "too late" not in r.text
    assert me.job(job["id"])["state"] == "expired"
    assert me.result(trace)["answer"] == answer  # nothing changed


def test_a_long_poll_abandoned_by_its_client_loses_no_job(api: httpx.Client, url: str) -> None:
    me = Client(api)
    with httpx.Client(base_url=url, timeout=httpx.Timeout(0.3)) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.get("/jobs", headers=me.h, params={"wait": 10})
    time.sleep(0.3)  # the server has seen the hang-up
    trace = me.chat("fetch http://abandoned.example/")
    (job,) = me.pull(wait=5)
    assert job["arguments"] == {"url": "http://abandoned.example/"}
    assert me.report(job["id"], result="kept").status_code == 200
    assert me.result(trace)["answer"] == "observed: kept"


def test_a_jobs_wait_answered_around_the_board_is_never_a_success(api: httpx.Client) -> None:
    me = Client(api)
    trace = me.chat("fetch http://around.example/")
    (job,) = me.pull()
    waiting = me.status(trace)["waiting_for"]
    forged = json.dumps({"ok": True, "value": "FORGED"})
    r = api.post(f"/runs/{trace}/calls/{waiting}", headers=me.h, json=forged)
    if r.status_code == 202:
        assert me.result(trace)["answer"] != "observed: FORGED", "a forged answer became the tool's result"
    else:
        assert r.status_code in (403, 409) and me.job(job["id"])["state"] == "pending"


# -- the planning tool and PlanningFlow ----------------------------------------------------------


def run_planning_calls(*calls: ToolCall) -> tuple[list[str], dflow.Run[Any]]:
    """Run an agent whose model makes ``calls`` one per turn, then answers; what each call was
    told. (A model that counts turns by the request alone would lose count when the context
    window leaves huge turns out: this one keeps its own count, fine in local mode.)"""
    script = iter(calls)

    def next_call(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        planned = next(script, None)
        return ChatResponse(tool_calls=[planned]) if planned is not None else ChatResponse(content="done")

    model = FunctionModel(next_call)
    agent = ToolCallAgent(unique("rv-planner"), model, [planning_tool], max_steps=len(calls) + 5, loop_guard=None)
    run = agent.run("plan things")
    assert run.result(20).status is AgentStatus.FINISHED
    seen = [r.messages[-1].content for r in model.requests[1:]]  # each turn's observation, the last message
    assert len(seen) == len(calls) and all(r.messages[-1].role == "tool" for r in model.requests[1:])
    return seen, run


CREATE = call("planning", command="create", plan_id="p", title="T", steps=["a", "b", "c"])


def test_a_boolean_step_index_is_an_error_observation(runtime: dflow.Runtime) -> None:
    seen, run = run_planning_calls(CREATE, call("planning", command="mark_step", step_index=True,
                                                step_status="completed"))
    assert seen[1].startswith("Error"), seen[1]
    plan = PlanBook(run.context()).get("p")
    assert plan is not None and plan.step_statuses == [PlanStepStatus.NOT_STARTED] * 3


def test_bad_step_indexes_are_error_observations_and_change_nothing(runtime: dflow.Runtime) -> None:
    bad = [-1, 3, 10**12, -(10**12), 1.5, "one", [1], {"i": 1}, None]
    calls = [call("planning", command="mark_step", step_index=i, step_status="completed") for i in bad]
    seen, run = run_planning_calls(CREATE, *calls)
    for index, said in zip(bad, seen[1:]):
        assert said.startswith("Error"), (index, said)
    assert "step_index -1 is out of range" in seen[1] and "numbered 0 to 2" in seen[2]
    plan = PlanBook(run.context()).get("p")
    assert plan is not None and plan.step_statuses == [PlanStepStatus.NOT_STARTED] * 3


def test_huge_plans_are_refused_with_the_limit_and_store_nothing(runtime: dflow.Runtime) -> None:
    seen, run = run_planning_calls(
        call("planning", command="create", plan_id="big", title="T", steps=["s"] * 10_000),
        call("planning", command="create", plan_id="big", title="T" * 100_000, steps=["s"]),
        call("planning", command="create", plan_id="big", title="T", steps=["s" * 3000]),
        call("planning", command="create", plan_id="big", title="T", steps=["s", "   "]),
        call("planning", command="create", plan_id="big", title="T", steps="one, two"),
        call("planning", command="create", plan_id="x" * 65, title="T", steps=["s"]),
    )
    assert "at most 100" in seen[0] and "10000 steps" in seen[0]
    assert "at most 500" in seen[1]
    assert "at most 2000" in seen[2]
    assert "every step is a non-empty text" in seen[3]
    assert all(s.startswith("Error") for s in seen), seen
    assert PlanBook(run.context()).ids() == []


def test_unicode_plans_round_trip_and_odd_plan_ids_are_refused(runtime: dflow.Runtime) -> None:
    title = "Viagem a S\u00e3o Paulo \U0001f680 \u05e9\u05dc\u05d5\u05dd"
    steps = ["\u6771\u4eac\u3078\u884c\u304f", "e\u0301te\u0301", "\u202eevil\u202c text", "tab\tand \\n"]
    seen, run = run_planning_calls(
        call("planning", command="create", plan_id="uni", title=title, steps=steps),
        call("planning", command="create", plan_id="pl\u00e4n", title="T", steps=["s"]),
        call("planning", command="create", plan_id="a/b", title="T", steps=["s"]),
        call("planning", command="create", plan_id="../plan-active", title="T", steps=["s"]),
        call("planning", command="get", plan_id="uni\u0000"),
    )
    plan = PlanBook(run.context()).get("uni")
    assert plan is not None and plan.title == title and plan.steps == steps
    for i, step in enumerate(steps):
        assert f"{i}. [ ] {step}" in seen[0]
    assert all(s.startswith("Error") and "plan_id" in s for s in seen[1:]), seen[1:]
    assert PlanBook(run.context()).ids() == ["uni"]


def test_a_run_never_reaches_the_plans_of_another_run(runtime: dflow.Runtime) -> None:
    _, first = run_planning_calls(call("planning", command="create", plan_id="shared", title="Mine", steps=["a"]))
    seen, second = run_planning_calls(
        call("planning", command="get", plan_id="shared"),
        call("planning", command="mark_step", plan_id="shared", step_index=0, step_status="blocked"),
        call("planning", command="set_active", plan_id="shared"),
        call("planning", command="delete", plan_id="shared"),
        call("planning", command="list"),
    )
    assert all("there is no plan with ID 'shared'" in s for s in seen[:4]), seen
    assert seen[4].startswith("There are no plans yet")
    mine = PlanBook(first.context()).get("shared")
    assert mine is not None and mine.title == "Mine" and mine.step_statuses == [PlanStepStatus.NOT_STARTED]
    assert PlanBook(second.context()).ids() == []


def test_a_planner_cannot_choose_its_plan_id(runtime: dflow.Runtime) -> None:
    planner = ScriptedModel([reply(calls=[call("planning", command="create", plan_id="victim", title="Mine",
                                               steps=["do it"])])])
    doer = ToolCallAgent(unique("rv-doer"), FunctionModel(lambda m, t: "done it"))
    flow = PlanningFlow(unique("rv-plan-id"), doer, planner=planner)
    run = flow.run("a task")
    result = run.result(20)
    assert result.status is AgentStatus.FINISHED and result.source == "model"
    assert result.plan is not None and result.plan.plan_id.startswith("plan_") and result.plan.title == "Mine"
    assert PlanBook(run.context()).ids() == [result.plan.plan_id]


# -- plan templates ------------------------------------------------------------------------------


def test_format_string_look_alikes_are_plain_text_or_plain_parameters() -> None:
    template = PlanTemplate(
        name="rv-fmt", title="Trip to {city}",
        steps=["{__class__} and {__init__}", "{0.__init__} {a!r} {city:>10} {} { city } {city.upper}",
               "{{city}} {{{city}}} }} {{ {", "{city}{city}"],
    )
    assert template.parameters == ["__class__", "__init__", "city"]
    draft = template.fill({"city": "{__class__.__mro__}", "__class__": "K", "__init__": "{0}"})
    assert draft.title == "Trip to {__class__.__mro__}"  # a value is inserted as it is, never read again
    assert draft.steps == [
        "K and {0}",
        "{0.__init__} {a!r} {city:>10} {} { city } {city.upper}",
        "{city} {{__class__.__mro__}} } { {",
        "{__class__.__mro__}{__class__.__mro__}",
    ]
    with pytest.raises(ValueError, match="missing __init__"):
        template.fill({"city": "x", "__class__": "y"})
    with pytest.raises(ValueError, match="unknown 0"):
        template.fill({"city": "x", "__class__": "y", "__init__": "z", "0": "w"})
    with pytest.raises(TypeError, match="parameters are text"):
        template.fill({"city": object(), "__class__": "y", "__init__": "z"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="at most 4000"):
        template.fill({"city": "x" * 4001, "__class__": "y", "__init__": "z"})


def test_template_names_with_special_characters_are_refused() -> None:
    store = InMemoryPlanTemplates()
    for name in ("a b", "a/b", "a*", "{a}", "a\nb", "\u00e9", "", "x" * 65, "a\x00", "a;DEL *"):
        with pytest.raises(ValueError, match="template name"):
            PlanTemplate(name=name, title="T", steps=["s"])
        for op in (store.get(name), store.versions(name), store.delete(name)):
            with pytest.raises(ValueError, match="template name"):
                asyncio.run(op)
    saved = asyncio.run(store.save(PlanTemplate(name="a:b@c.d-e_f", title="T", steps=["s"])))
    assert saved.version == 1 and asyncio.run(store.names()) == ["a:b@c.d-e_f"]


def test_a_template_made_from_a_plan_fills_back_to_that_plan() -> None:
    plan = PlanDraft(title="Lisbon trip", steps=["Fly to Lisbon", "Eat tarts"])
    values = {"city": "Lisbon", "x": "t"}
    template = PlanTemplate.from_plan("rv-roundtrip", plan, values)
    again = template.fill(values)
    assert (again.title, again.steps) == (plan.title, plan.steps)


# -- the crawler and its fetcher -----------------------------------------------------------------


Route = Callable[[], "tuple[int, dict[str, str], bytes]"]


@dataclass
class Site:
    """A site on 127.0.0.1 (also reachable as 'localhost': another host name, another site)."""

    routes: dict[str, Route]
    hits: list[tuple[str, str, int]] = field(default_factory=list)  # (Host header, path, body bytes sent)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, host: str | None = None) -> list[str]:
        with self.lock:
            return [p for h, p, _ in self.hits if host is None or h.startswith(host)]


def html(text: str, status: int = 200) -> Route:
    return lambda: (status, {"Content-Type": "text/html; charset=utf-8"}, text.encode())


def raw_html(body: bytes) -> Route:
    return lambda: (200, {"Content-Type": "text/html"}, body)


def redirect(to: str) -> Route:
    return lambda: (302, {"Location": to}, b"")


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site(routes={})

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            route = s.routes.get(self.path)
            status, headers, body = route() if route else (404, {"Content-Type": "text/plain"}, b"not here")
            with s.lock:
                s.hits.append((self.headers.get("Host", ""), self.path, len(body)))
            self.close_connection = True  # no connection outlives its request (none is left to the pools)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the fetcher stopped reading (a byte budget)
                pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass

    server = Server(("127.0.0.1", 0), Handler)
    s.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield s
    finally:
        server.shutdown()
        server.server_close()


def fetch_once(fetcher: Fetcher, url: str) -> Any:
    """``fetcher.fetch(url)`` on a loop of its own, whose HTTP clients are closed after."""

    async def go() -> Any:
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()

    return asyncio.run(go())


def crawl(site: Site, research: Callable[[Mapping[str, Any]], Any], **options: Any) -> Any:
    options.setdefault("crawler", Fetcher(trust_env=False, allow_private=True))
    agent = DeepCrawlerAgent(unique("rv-crawler"), research=research, validation=lambda inputs: False,
                             summary=lambda inputs: "the summary", **options)
    return agent.run("find it", url=site.base + "/").result(60)


def follow_everything(seen: list[Mapping[str, Any]] | None = None, extra: Sequence[str] = ()) -> Callable[..., Any]:
    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if seen is not None:
            seen.append(inputs)
        ids = [i for page in inputs["pages"] for i in page.get("links", [])]
        return {"found": False, "follow": [*ids, *extra]}

    return research


def test_ids_the_model_invents_and_raw_urls_are_never_fetched(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/"] = html("<title>home</title><a href='/known'>known</a>")
    site.routes["/known"] = html("<p>known</p>")
    site.routes["/secret"] = html("<p>secret</p>")
    invented = ["L999999", "L2", "L-1", "L1.5", "L1e3", "l 1", "L0", "[L0]", f"{site.base}/secret", "/secret",
                "secret", "http://localhost/secret", "javascript:alert(1)", "L" + "9" * 50]
    result = crawl(site, follow_everything(extra=invented))
    assert result.status is AgentStatus.TERMINATED
    assert sorted(site.paths()) == ["/", "/known", "/robots.txt"], site.paths()
    assert result.answer == "the summary"


def test_links_that_are_not_http_or_lead_to_another_host_are_neither_listed_nor_fetched(
    runtime: dflow.Runtime, site: Site
) -> None:
    port = site.port
    hrefs = ["file:///etc/passwd", "ftp://127.0.0.1/x", "javascript:fetch('/evil')", "data:text/html,<b>x</b>",
             "mailto:a@b.example", "gopher://127.0.0.1:6379/_INFO", "ws://127.0.0.1/x", f"http://localhost:{port}/",
             f"http://localhost:{port}/offsite", f"http://[::1]:{port}/v6", "//localhost/x", "/ok"]
    site.routes["/"] = html("".join(f"<a href=\"{h}\">link {i}</a> " for i, h in enumerate(hrefs)))
    site.routes["/ok"] = html("<p>ok</p>")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    home = seen[0]["pages"][0]
    assert home["links"] == ["L1"], home  # only /ok
    for i in range(len(hrefs) - 1):
        assert f"link {i}" in home["content"], i  # the text of a link not followed stays
    assert "[link 11](L1)" in home["content"]
    assert sorted(site.paths()) == ["/", "/ok", "/robots.txt"]
    assert site.paths("localhost") == [] and site.paths("[::1]") == []


def test_spellings_of_one_url_are_one_id_and_one_fetch(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    spellings = ["/page", "/page#top", "/./page", "/x/../page", "/x/./../page", f"HTTP://127.0.0.1:{port}/page",
                 "/%70age", f"http://127.0.0.1:{port}/page?", "page", "/page#", f"//127.0.0.1:{port}/page"]
    site.routes["/"] = html("".join(f"<a href='{h}'>s{i}</a> " for i, h in enumerate(spellings)))
    site.routes["/page"] = html("<p>the page</p>")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    assert seen[0]["pages"][0]["links"] == ["L1"]
    assert Counter(site.paths())["/page"] == 1


def test_userinfo_does_not_make_a_second_fetch_of_a_page(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    site.routes["/"] = html(f"<a href='/page'>a</a> <a href='http://user:pw@127.0.0.1:{port}/page'>b</a>")
    site.routes["/page"] = html("<p>the page</p>")
    crawl(site, follow_everything())
    assert Counter(site.paths())["/page"] == 1


def test_robots_txt_holds_against_spellings_and_redirects(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/robots.txt"] = lambda: (200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow: /private\n")
    hrefs = ["/private", "/%70rivate", "/./private/x", "/public/../private/y", "/private#x", "/hop", "/hop2"]
    site.routes["/"] = html("".join(f"<a href='{h}'>h{i}</a> " for i, h in enumerate(hrefs)))
    site.routes["/hop"] = redirect("/private/secret")
    site.routes["/hop2"] = redirect(f"http://127.0.0.1:{site.port}/%70rivate/other")
    site.routes["/private/secret"] = html("<p>secret</p>")
    seen: list[Mapping[str, Any]] = []
    result = crawl(site, follow_everything(seen))
    assert not [p for p in site.paths() if p.startswith(("/private", "/%70rivate"))], site.paths()
    assert Counter(site.paths())["/robots.txt"] == 1
    assert "robots.txt" in result.reason


def test_off_site_redirects_below_the_start_are_not_followed(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    site.routes["/"] = html("<a href='/away'>away</a> <a href='/away2'>away2</a> <a href='/ok'>ok</a>")
    site.routes["/ok"] = html("<p>ok</p>")
    site.routes["/away"] = redirect(f"http://localhost:{port}/offsite")
    site.routes["/away2"] = redirect("file:///etc/passwd")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    assert site.paths("localhost") == []
    notes = " ".join(str(p.get("note")) for i in seen for p in i["pages"])
    assert "redirects to another site" in notes and "unusable location" in notes


def test_a_page_with_thousands_of_links_is_capped(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/"] = html("".join(f"<a href='/p{i}'>p{i}</a>" for i in range(5000)))
    seen: list[Mapping[str, Any]] = []

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(inputs)
        return {"found": False, "follow": []}

    t0 = time.monotonic()
    result = crawl(site, research, crawler=Fetcher(trust_env=False, allow_private=True, max_links=300))
    assert time.monotonic() - t0 < 20
    assert result.status is AgentStatus.TERMINATED
    assert len(seen[0]["pages"][0]["links"]) == 300
    assert site.paths() == ["/robots.txt", "/"]


def test_the_fetcher_refuses_what_is_not_an_http_url(site: Site) -> None:
    fetcher = Fetcher(trust_env=False, allow_private=True)
    for target in ("file:///etc/passwd", "ftp://127.0.0.1/", "javascript:alert(1)", "data:,x", "gopher://x/",
                   "/relative", "http://", "http://:80/", "x" * 3000, f"{site.base}/" + "a" * 2100):
        page = fetch_once(fetcher, target)
        assert not page.ok and page.note.startswith("not fetched"), (target[:30], page.note)
    assert site.paths() == []


def test_the_fetch_tool_checks_robots_txt_at_every_redirect(site: Site) -> None:
    site.routes["/robots.txt"] = lambda: (200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow: /private\n")
    site.routes["/open"] = redirect("/private/x")
    site.routes["/private/x"] = html("<p>secret</p>")
    fetcher = Fetcher(trust_env=False, allow_private=True)
    tool = fetcher.as_tool(unique("rv_fetch_page"))

    async def go() -> Any:
        try:
            return await tool.run({"url": site.base + "/open"})
        finally:
            await fetcher.aclose()

    result = asyncio.run(go())
    assert "robots.txt disallows" in result.observation and "secret" not in result.observation
    assert "/private/x" not in site.paths()


def _gzip_bomb(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()


def test_a_gzip_bomb_is_cut_at_the_byte_budget_without_inflating_it(site: Site) -> None:
    bomb = _gzip_bomb(128 << 20)
    site.routes["/bomb"] = lambda: (200, {"Content-Type": "text/html", "Content-Encoding": "gzip"}, bomb)
    fetcher = Fetcher(trust_env=False, allow_private=True, max_bytes=100_000)
    tracemalloc.start()
    try:
        page = fetch_once(fetcher, site.base + "/bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.ok and page.truncated and page.bytes == 100_000
    assert peak < 16 * 1024 * 1024, f"reading a 100 KB budget allocated {peak / 1e6:.0f} MB"


def test_an_unknown_charset_on_a_text_page_falls_back(site: Site) -> None:
    body = "h\u00e9llo w\u00f6rld".encode()
    site.routes["/t"] = lambda: (200, {"Content-Type": "text/plain; charset=bogus"}, body)
    site.routes["/h"] = lambda: (200, {"Content-Type": "text/html; charset=bogus"}, b"<p>" + body + b"</p>")
    fetcher = Fetcher(trust_env=False, allow_private=True)
    as_html = fetch_once(fetcher, site.base + "/h")
    assert as_html.ok and "h\u00e9llo" in as_html.markdown
    as_text = fetch_once(fetcher, site.base + "/t")
    assert as_text.ok, as_text.note


class CountingFetcher(Fetcher):
    """The built-in fetcher, counting the body bytes of each page it reads."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.read: list[int] = []

    async def fetch(self, url: str, **options: Any) -> Any:
        page = await super().fetch(url, **options)
        self.read.append(page.bytes)
        return page


def test_the_byte_budget_is_overshot_by_one_page_at_most(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/"] = html("<p>" + "x" * 500 + "</p>" + "".join(f"<a href='/p{i}'>p{i}</a>" for i in range(10)))
    for i in range(10):
        site.routes[f"/p{i}"] = html("<p>" + "y" * 600 + "</p>")
    fetcher = CountingFetcher(trust_env=False, allow_private=True, max_bytes=700)
    result = crawl(site, follow_everything(), crawler=fetcher, max_bytes=1000)
    assert result.status is AgentStatus.ERROR and "byte budget" in result.reason
    assert len(fetcher.read) >= 2 and sum(fetcher.read) <= 1000 + 700, (
        f"{sum(fetcher.read)} body bytes read in {len(fetcher.read)} pages for a budget of 1000")


def test_a_flood_of_long_links_ends_the_crawl_with_a_result(runtime: dflow.Runtime, site: Site) -> None:
    pad = "z" * 1800
    site.routes["/"] = html("".join(f"<a href='/p{i}'>p{i}</a>" for i in range(6)))
    for i in range(6):
        page = "".join(f"<a href='/q{i}-{j}-{pad}'>l</a>" for j in range(1000)).encode()
        site.routes[f"/p{i}"] = raw_html(page)

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if inputs["depth"] == 0:
            return {"follow": [i for p in inputs["pages"] for i in p.get("links", [])]}
        return {"follow": []}

    agent = DeepCrawlerAgent(unique("rv-flood"), research=research, validation=lambda inputs: False,
                             summary=lambda inputs: "the summary",
                             crawler=Fetcher(trust_env=False, allow_private=True))
    run = agent.run("find it", url=site.base + "/")
    try:
        result = run.result(60)
    except dflow.RunFailedError as exc:
        pytest.fail(f"the crawl's run failed instead of ending with a result: {str(exc)[:300]}")
    assert result.answer == "the summary"
