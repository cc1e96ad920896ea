"""The deep crawler: an agent that reads a site level by level until it finds an answer.

A crawl starts at a URL and goes in waves: every page of a wave is fetched at once, each
its own step in a ``zip`` (any worker runs it); then one step reads the wave's pages and
asks the **research** function whether they answer the task and which links to open next.
A candidate answer goes to the **validation** function (its own step), which checks it
against the pages it came from; a rejected one is shown to research from then on. When
the crawl ends, the **summary** function writes the final answer, returned once.

The model never sees a URL: links read ``[text](L12)``, and the agent maps the ids it
chooses back to URLs (the map lives in the run's data, so any worker continues the crawl).
URLs are normalised and fetched once per crawl; robots.txt is read once per site and a
URL it disallows is never requested; a wave takes the pages of one depth, at most
``concurrency`` of them; budgets bound the depth, the pages and the bytes read (with the
built-in fetcher, the pages of a wave share the bytes left: each is read up to its share; a
crawler tool's pages are counted once read). What the crawl keeps in the
run is bounded too (see ``_crawl_waves``); a value that would still be over the store's
limit ends the crawl with ERROR and says so.

The crawler is the built-in :class:`Fetcher` or any tool taking a ``url`` (a flow tool
too, such as a job a browser plug-in pulls): its result may be a page dict
(``markdown``/``content``, ``links``...) or markdown text.

The three functions are ``AIFunction``s (:func:`research_function` and its siblings make
the defaults on a model) or any callables, sync or async, taking one dict:

* research ``{job, depth, max_depth, pages, notes, rejected, refused, pages_left}``, returns
  :class:`Research` (or a dict, or a model reply holding its JSON);
* validation ``{job, answer, sources, pages}``, returns :class:`Validation` (or a bool...);
* summary ``{job, answer, validated, notes, pages, reason, pages_fetched}``, returns text.

A page there is ``{"id": "L3", "title", "depth", "content", "links", "more_links", "note"}``:
``content`` is its markdown with links as ``[text](L7)``, cut at the budget's
``page_chars``; ``links`` the ids of its links; ``more_links`` the ``[id, text]`` of the links
further down than ``content`` shows that the crawl has not queued, within ``link_chars`` (a
long index page's way on); a page that could not be read has no content and a ``note``
saying why. ``notes`` are what research said of
earlier levels, ``rejected`` the answers validation refused, ``refused`` the links not
fetched (robots.txt disallows them, or their site is unreachable).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from dflow import ContextStack, DFlow, Run

from ._crawl_arguments import crawler_of, keyword_group, or_default, start_url
from ._crawl_config import CrawlBudget, CrawlFunction, CrawlFunctions, CrawlScope
from ._crawl_prompts import (
    Research,
    Validation,
    as_research,
    as_summary,
    as_validation,
    research_messages,
    research_parser,
    summary_messages,
    summary_parser,
    validation_messages,
    validation_parser,
)
from ._crawl_waves import Chunks, CrawlWaves, encoded_size, shares, site_of, value_limit
from ._urlmap import UrlMap, parse_id
from .agent import RUNNING, Agent, AgentResult, AgentStatus, check_session, stop
from .errors import ModelRetryableError
from .fetch import Fetcher, Robots
from .function import AIFunction, ModelConfig
from .memory import ChatMemory
from .messages import ChatMessage
from .model import ChatModel, CompletionModel
from .tools import Tool

__all__ = [
    "CrawlBudget",
    "CrawlFunctions",
    "CrawlScope",
    "DeepCrawlerAgent",
    "Research",
    "UrlMap",
    "Validation",
    "research_function",
    "summary_function",
    "validation_function",
]


def research_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[Research]:
    """The default research function on ``model``: the pages in a prompt, a JSON reply."""
    return AIFunction(model=ModelConfig(model, options), formatter=research_messages, parser=research_parser)


def validation_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[Validation]:
    """The default validation function on ``model``."""
    return AIFunction(
        model=ModelConfig(model, options), formatter=validation_messages, parser=validation_parser
    )


def summary_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[str]:
    """The default summary function on ``model``."""
    return AIFunction(model=ModelConfig(model, options), formatter=summary_messages, parser=summary_parser)


class DeepCrawlerAgent(CrawlWaves, Agent):
    """Crawls from a start URL until it finds the answer to a task. See the module's docstring.

    Args:
        name: names its pipeline (``agent.<name>``), its shared object and its keys in a run's
            data; unique per process.
        model: the model of the default research, validation and summary functions.
        crawler: the built-in :class:`Fetcher` (default: ``Fetcher()``, which keeps to
            public addresses: pass ``Fetcher(allow_private=True)`` to crawl a site on this
            machine or its network) or any tool with a ``url`` argument, a flow tool too.
        functions: :class:`CrawlFunctions`: replace research, validation or summary (an
            ``AIFunction`` or any callable taking the inputs dict, described in the module's
            docstring), and how often a function failing with a retryable model error is
            called again (on store timers) before the run stops with ERROR.
        budget: :class:`CrawlBudget`: depth, pages, bytes, pages at once, and the characters
            of each page (its text, and its links further down) research reads.
        scope: :class:`CrawlScope`: robots.txt honoured, links followed on the start's site only.
        memory: the session memory (the task and the answer of each crawl).

    ``run(task, url=...)`` starts a crawl (without ``url``, the first URL in the task is the
    start). It ends FINISHED with a validated answer; TERMINATED when nothing is left to
    follow; ERROR when a budget is spent or a function keeps failing. The summary is the
    answer in every case (unless the functions failed).
    """

    def __init__(
        self,
        name: str,
        model: ChatModel | CompletionModel | None = None,
        *,
        crawler: Fetcher | Tool | None = None,
        functions: CrawlFunctions | None = None,
        budget: CrawlBudget | None = None,
        scope: CrawlScope | None = None,
        memory: ChatMemory | None = None,
    ) -> None:
        functions = keyword_group("functions", functions, CrawlFunctions)
        self.budget = keyword_group("budget", budget, CrawlBudget)
        self.scope = keyword_group("scope", scope, CrawlScope)
        if model is not None and not isinstance(model, (ChatModel, CompletionModel)):
            raise TypeError(f"model must be a ChatModel or a CompletionModel, got {model!r}")
        if functions.missing() and model is None:
            raise TypeError(
                f"give a model, or the {', '.join(functions.missing())} function(s) it would make"
            )
        self.fetcher, self.tool = crawler_of(crawler)
        self.research: CrawlFunction = or_default(functions.research, research_function, model)
        self.validation: CrawlFunction = or_default(functions.validation, validation_function, model)
        self.summary: CrawlFunction = or_default(functions.summary, summary_function, model)
        self.model_attempts = functions.attempts
        self.model_retry_backoff = functions.retry_backoff
        self._chunks = Chunks()
        self._robots: OrderedDict[str, Robots] = OrderedDict()
        super().__init__(name, memory=memory)

    # -- running -----------------------------------------------------------------------

    def run(
        self, query: str, *, url: str | None = None, session: str | None = None, trace_id: str | None = None
    ) -> Run:
        """Start a crawl for the task ``query`` from ``url`` (default: the first URL in
        ``query``); ``run.result()`` is the :class:`AgentResult`."""
        return self.pipeline.call(self._crawl_request(query, session, url), trace_id=trace_id)

    async def arun(
        self, query: str, *, url: str | None = None, session: str | None = None, trace_id: str | None = None
    ) -> Run:
        """``run`` for async code."""
        return await self.pipeline.acall(self._crawl_request(query, session, url), trace_id=trace_id)

    def flow(
        self,
        query: str,
        *,
        url: str | None = None,
        session: str | None = None,
        tools: Sequence[str] | None = None,
    ) -> DFlow[AgentResult]:
        """The crawl as a flow to embed in another (in a ``flat_map``). A crawler calls no
        tools: ``tools`` naming any is refused, as for any agent without them."""
        return self._retrying(
            DFlow.just(self._with_tools(self._crawl_request(query, session, url), tools))
            .map(self._start)
            .id(f"{self.name}.start")
            .flat_map(self._loop)
            .id(f"{self.name}.loop")
        )

    def _request(self, query: str, session: str | None) -> dict[str, Any]:
        return self._crawl_request(query, session, None)

    def _crawl_request(self, query: str, session: str | None, url: str | None) -> dict[str, Any]:
        if not isinstance(query, str):
            raise TypeError(f"a crawl's task is a str, got {type(query).__qualname__}")
        return {"query": query, "session": check_session(session), "url": start_url(query, url)}

    def _retrying(self, flow: DFlow[Any]) -> DFlow[Any]:
        return flow.retry(self.model_attempts, backoff=self.model_retry_backoff, on=ModelRetryableError)

    # -- steps -------------------------------------------------------------------------

    async def _start(self, ctx: ContextStack, request: Any) -> dict[str, Any]:
        if isinstance(request, str):  # pipeline.call("task with a URL")
            request = {"query": request, "session": None}
        if not isinstance(request, dict) or not isinstance(request.get("query"), str):
            raise TypeError(
                f"{self!r} starts from a task (str) or {{'query': str, 'url': str}}, got {request!r:.300}"
            )
        start = start_url(request["query"], request.get("url"))
        state = await super()._start(ctx, request)
        ns = state["ns"]
        host = site_of(start)
        state.update(
            start=start,
            sites=[host],
            queue=[[0, 0, []]],
            wave=[],
            pages=0,
            bytes=0,
            chunks=1,
            beyond=0,
            disallowed=0,
            refused=[],
            unread=[],
            rejected=[],
            candidate=None,
            evidence=[],
            validated=False,
            model_failed=False,
        )
        ctx.put(f"{ns}/map/0", {"urls": [start], "queued": [0], "notes": ""})
        return state

    async def _loop(self, ctx: ContextStack, value: Any) -> DFlow[Any]:
        """A wave's pages read (when ``value`` holds them) and research asked; then the next
        wave, the validation of a candidate answer, or the end."""
        if isinstance(value, dict) and "ns" in value:  # the crawl's first state
            return await self._launch(ctx, value, UrlMap([value["start"]]))
        ns = ctx.get(self._pointer)
        state = dict(ctx.get(f"{ns}/state"))
        urls, seen, notes = self._load(ctx, state)
        known = len(urls)
        queued: list[int] = []
        views = self._absorb(state, urls, seen, queued, value if isinstance(value, list) else [value])
        depth = state["wave"][0][1] if state["wave"] else 0
        state["wave"] = []
        note = await self._research(ctx, state, views, notes, depth, (urls, seen, queued))
        self._record(ctx, state, {"urls": urls.since(known), "queued": queued, "notes": note})
        if state["candidate"] is not None and state["status"] == RUNNING:
            return self._retrying(DFlow.just(state).flat_map(self._validate).id("validate"))
        return await self._launch(ctx, state, urls)

    async def _research(
        self,
        ctx: ContextStack,
        state: dict[str, Any],
        views: list[dict[str, Any]],
        notes: list[str],
        depth: int,
        crawl: tuple[UrlMap, set[int], list[int]],
    ) -> str:
        """Research asked about a wave's pages (with those of earlier waves that could not be
        read): the links it chose queued, a candidate answer kept; what it noted."""
        if not any(
            "content" in v for v in views
        ):  # nothing to read: what happened is told with the next pages
            state["unread"] = [*state["unread"], *views][-50:]
            return ""
        if state["status"] != RUNNING:
            return ""
        views, state["unread"] = [*state["unread"], *views], []
        budget = self.budget
        inputs = {
            "job": state["query"],
            "depth": depth,
            "max_depth": budget.max_depth,
            "pages": views,
            "notes": notes,
            "rejected": state["rejected"],
            "refused": state["refused"],
            "pages_left": max(0, budget.max_pages - state["pages"]),
        }
        state["refused"] = []
        research = await self._ask(ctx, state, "research", self.research, inputs, as_research)
        if not isinstance(research, Research):
            return ""
        self._follow(state, *crawl, research.follow, depth + 1)
        del state["queue"][max(0, budget.max_pages - state["pages"]) + 64 :]  # more could never be fetched
        if research.found and research.answer.strip():
            state["candidate"] = _candidate(research, views)
        return f"(depth {depth}) {research.notes}" if research.notes.strip() else ""

    def _record(self, ctx: ContextStack, state: dict[str, Any], chunk: dict[str, Any]) -> None:
        """What a level adds to the crawl's map, written once; the crawl ends with ERROR when
        it, or the candidate answer, would be over the store's limit on one value."""
        problem = _too_large("the URLs this level adds to the crawl's map", chunk) or (
            _too_large("the candidate answer and its pages", state)
            if state["candidate"] is not None
            else None
        )
        if problem is not None:
            chunk = {"urls": [], "queued": [], "notes": chunk["notes"]}
            _give_up(state, problem)
        ctx.put(f"{state['ns']}/map/{state['chunks']}", chunk)
        state["chunks"] += 1

    async def _validate(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[Any]:
        """Check the candidate answer against its pages: the end, or the crawl goes on."""
        state = dict(state)
        candidate, state["candidate"] = state["candidate"], None
        inputs = {
            "job": state["query"],
            "answer": candidate["answer"],
            "sources": candidate["sources"],
            "pages": candidate["pages"],
        }
        verdict = await self._ask(ctx, state, "validation", self.validation, inputs, as_validation)
        if isinstance(verdict, Validation):
            if verdict.valid:
                state["validated"] = True
                state["evidence"] = candidate["pages"]
                where = ", ".join(candidate["sources"]) or "the pages of the last level"
                reason = f"the answer was found on {where} and validated"
                return self._done(stop(state, AgentStatus.FINISHED, reason, answer=candidate["answer"]))
            reason = verdict.reason or "no reason given"
            state["rejected"] = [
                *state["rejected"],
                f"{candidate['answer'][:300]} (rejected: {reason[:300]})",
            ][-5:]
        urls, _, _ = self._load(ctx, state)
        return await self._launch(ctx, state, urls)

    async def _launch(self, ctx: ContextStack, state: dict[str, Any], urls: UrlMap) -> DFlow[Any]:
        """The next wave, all at once (a ``zip`` of one step each); or the end, when nothing is
        left or a budget is spent."""
        state = dict(state)
        if state["status"] != RUNNING:
            return self._done(state)
        spent = self._spent(state)
        if spent is not None:
            return self._done(stop(state, AgentStatus.ERROR, spent))
        wave = await self._next_wave(ctx, state, urls)
        problem = _too_large("the crawl's state", state)
        if problem is not None:
            return self._done(_give_up(state, problem))
        if not wave:
            return self._done(self._nothing_left(state))
        state["wave"] = wave
        state["step"] += 1
        ctx.put(f"{state['ns']}/state", state)
        left = self.budget.max_bytes - state["bytes"]  # the wave's pages share the bytes left
        keep = value_limit() // 2 // len(wave)  # and half of what the run stores in one value (the zip's)
        branches = [
            self._branch(urls.at(entry[0]), share, keep)
            for entry, share in zip(wave, shares(left, len(wave)))
        ]
        return self._retrying(DFlow.zip(branches, merge=False).flat_map(self._loop).id("loop"))

    def _spent(self, state: dict[str, Any]) -> str | None:
        """Which budget is spent, or ``None``."""
        if state["pages"] >= self.budget.max_pages:
            return f"the page budget of {self.budget.max_pages} pages is spent without a validated answer"
        if state["bytes"] >= self.budget.max_bytes:
            return f"the byte budget of {self.budget.max_bytes} bytes is spent without a validated answer"
        return None

    def _nothing_left(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` ended because no URL is left to fetch, saying why."""
        if state["beyond"]:
            return stop(
                state,
                AgentStatus.ERROR,
                f"the depth budget of {self.budget.max_depth} is reached "
                f"without a validated answer ({state['beyond']} deeper links not followed)",
            )
        told = []
        if state["disallowed"]:
            told.append(f"{state['disallowed']} URLs disallowed by robots.txt")
        if state.get("unreachable"):
            told.append(
                f"{state['unreachable']} URLs not fetched because their site could not be reached: "
                f"{state['unreachable_why']} (nothing is fetched from a site whose robots.txt cannot be read)"
            )
        shown = f" ({'; '.join(told)})" if told else ""
        if state["pages"] and len(state["unread"]) == state["pages"]:  # research never had a page to read
            shown += "; no page could be read: " + "; ".join(
                f"{v['id']}: {str(v.get('note', ''))[:300]}" for v in state["unread"][:3]
            )
        reason = f"no validated answer: nothing is left to follow after {state['pages']} pages{shown}"
        return stop(state, AgentStatus.TERMINATED, reason)

    def _done(self, state: dict[str, Any]) -> DFlow[AgentResult]:
        return (
            DFlow.just(state)
            .map(self._summarize)
            .id("summary")
            .retry(self.model_attempts, backoff=self.model_retry_backoff, on=ModelRetryableError)
            .map(self._finish)
            .id("finish")
        )

    async def _summarize(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """The final answer, written by the summary function from what the crawl found."""
        state = dict(state)
        if state["model_failed"]:
            return state
        _, _, notes = self._load(ctx, state)
        inputs = {
            "job": state["query"],
            "answer": state["answer"] if state["validated"] else "",
            "validated": state["validated"],
            "notes": notes,
            "pages": state["evidence"],
            "reason": state["reason"],
            "pages_fetched": state["pages"],
        }
        text = await self._ask(ctx, state, "summary", self.summary, inputs, as_summary, fatal=False)
        if isinstance(text, str):
            state["answer"] = text
        return state

    # -- helpers -----------------------------------------------------------------------

    async def _ask(
        self,
        ctx: ContextStack,
        state: dict[str, Any],
        what: str,
        fn: CrawlFunction,
        inputs: dict[str, Any],
        coerce: Callable[[Any], Any],
        *,
        fatal: bool = True,
    ) -> Any:
        """``fn(inputs)`` as ``coerce`` reads it; ``None`` when it failed, and the run then
        stops with ERROR (``fatal``) or notes the failure in its reason. A retryable model
        error is raised while attempts remain (the step's retry policy calls again)."""
        try:
            result = fn(inputs)
            if inspect.isawaitable(result):
                result = await result
            return coerce(result)
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_attempts:
                raise
            problem = f"the {what} function failed {self.model_attempts} times; last: {exc}"
        except Exception as exc:
            problem = f"the {what} function failed: {type(exc).__name__}: {str(exc)[:500]}"
        if fatal:
            state["model_failed"] = True
            stop(state, AgentStatus.ERROR, problem)
        else:
            state["reason"] = f"{state['reason']}; {problem}" if state["reason"] else problem
        return None

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        return [ChatMessage.user(state["query"]), ChatMessage.assistant(state.get("answer", ""))]


def _too_large(what: str, value: Any) -> str | None:
    """Why ``value`` cannot be stored in one value of the run (it is over the store's limit),
    or ``None``."""
    size, limit = encoded_size(value), value_limit()
    if size <= limit - min(65_536, limit // 8):  # a margin for what the estimate leaves out
        return None
    return (
        f"{what} would take about {size} bytes, over the store's limit of {limit} bytes on one value: "
        "the crawl stops here"
    )


def _give_up(state: dict[str, Any], problem: str) -> dict[str, Any]:
    """``state`` ended with ERROR for ``problem``, without what made it large."""
    state.update(queue=[], wave=[], unread=[], refused=[], candidate=None, evidence=[])
    return stop(state, AgentStatus.ERROR, problem)


def _candidate(research: Research, views: list[dict[str, Any]]) -> dict[str, Any]:
    readable = [v for v in views if "content" in v]
    wanted = {f"L{n}" for n in (parse_id(s) for s in research.sources) if n is not None}
    sources = [v for v in readable if v["id"] in wanted] or readable
    return {"answer": research.answer.strip(), "sources": [v["id"] for v in sources], "pages": sources}
