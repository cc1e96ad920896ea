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

A page there is ``{"id": "L3", "title", "depth", "content", "links", "note"}``: ``content`` is
its markdown with links as ``[text](L7)``, ``links`` the ids of its links; a page that could
not be read has no content and a ``note`` saying why. ``notes`` are what research said of
earlier levels, ``rejected`` the answers validation refused, ``refused`` the links not
fetched (robots.txt).
"""

from __future__ import annotations

import inspect
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from dflow import ContextStack, DFlow, Run

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
from ._crawl_waves import Chunks, CrawlWaves, encoded_size, site_of, value_limit
from ._urlmap import UrlMap, parse_id
from .agent import RUNNING, Agent, AgentResult, AgentStatus, check_session, stop
from .errors import ModelRetryableError
from .fetch import Fetcher, Robots, normalize_url
from .function import AIFunction, ModelConfig
from .memory import ChatMemory
from .messages import ChatMessage
from .model import ChatModel, CompletionModel
from .tools import Tool

__all__ = [
    "DeepCrawlerAgent",
    "Research",
    "UrlMap",
    "Validation",
    "research_function",
    "summary_function",
    "validation_function",
]

#: research, validation, summary: an ``AIFunction`` or any ``(inputs) -> result`` callable, sync or async
CrawlFunction = Callable[[Mapping[str, Any]], Any]

_URL_IN_TEXT = re.compile(r"https?://[^\s<>\"'`)\]]+")


def research_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[Research]:
    """The default research function on ``model``: the pages in a prompt, a JSON reply."""
    return AIFunction(model=ModelConfig(model, options), formatter=research_messages, parser=research_parser)


def validation_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[Validation]:
    """The default validation function on ``model``."""
    return AIFunction(model=ModelConfig(model, options), formatter=validation_messages, parser=validation_parser)


def summary_function(model: ChatModel | CompletionModel, **options: Any) -> AIFunction[str]:
    """The default summary function on ``model``."""
    return AIFunction(model=ModelConfig(model, options), formatter=summary_messages, parser=summary_parser)


class DeepCrawlerAgent(CrawlWaves, Agent):
    """Crawls from a start URL until it finds the answer to a task. See the module's docstring.

    Args:
        name: names its pipeline (``agent.<name>``), its shared object and its keys in a run's
            data; unique per process.
        model: the model of the default research, validation and summary functions.
        research, validation, summary: replace them (an ``AIFunction`` or any callable taking
            the inputs dict, described in the module's docstring).
        crawler: the built-in :class:`Fetcher` (default: ``Fetcher()``, which keeps to
            public addresses: pass ``Fetcher(allow_private=True)`` to crawl a site on this
            machine or its network) or any tool with a ``url`` argument, a flow tool too.
        respect_robots: read each site's robots.txt (once per crawl, with the ``Fetcher``,
            or a default one when the crawler is a tool) and never request what it disallows.
        same_site: follow only links to the start URL's site: its scheme, host (``www.``
            aside) and port (a start page that redirects moves the site).
        max_depth: links followed from the start page (0: the start page only).
        max_pages: URLs requested in all; ``max_bytes``: body bytes read in all.
        concurrency: pages fetched at once (a wave).
        page_chars: characters of each page shown to the functions.
        model_attempts, model_retry_backoff: calls of a function that fails with a retryable
            model error (on store timers); then the run stops with ERROR.

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
        research: CrawlFunction | None = None,
        validation: CrawlFunction | None = None,
        summary: CrawlFunction | None = None,
        crawler: Fetcher | Tool | None = None,
        respect_robots: bool = True,
        same_site: bool = True,
        max_depth: int = 3,
        max_pages: int = 50,
        max_bytes: int = 20_000_000,
        concurrency: int = 16,
        page_chars: int = 6_000,
        memory: ChatMemory | None = None,
        model_attempts: int = 4,
        model_retry_backoff: float = 1.0,
    ) -> None:
        if model is not None and not isinstance(model, (ChatModel, CompletionModel)):
            raise TypeError(f"model must be a ChatModel or a CompletionModel, got {model!r}")
        functions = {"research": research, "validation": validation, "summary": summary}
        for what, fn in functions.items():
            if fn is not None and not callable(fn):
                raise TypeError(f"{what} must be an AIFunction or a callable taking the inputs dict, got {fn!r}")
        missing = [what for what, fn in functions.items() if fn is None]
        if missing and model is None:
            raise TypeError(f"give a model, or the {', '.join(missing)} function(s) it would make")
        if crawler is not None and not isinstance(crawler, (Fetcher, Tool)):
            raise TypeError(f"crawler must be a Fetcher or a Tool taking a url, got {crawler!r}")
        if isinstance(crawler, Tool) and "url" not in (crawler.parameters.get("properties") or {}):
            raise ValueError(f"the crawler tool {crawler.name!r} must take a 'url' argument")
        _at_least("max_depth", max_depth, 0)
        for what, value in (("max_pages", max_pages), ("max_bytes", max_bytes), ("concurrency", concurrency),
                            ("page_chars", page_chars), ("model_attempts", model_attempts)):
            _at_least(what, value, 1)
        self.research: CrawlFunction = research if research is not None else research_function(_given(model))
        self.validation: CrawlFunction = (
            validation if validation is not None else validation_function(_given(model))
        )
        self.summary: CrawlFunction = summary if summary is not None else summary_function(_given(model))
        self.fetcher = crawler if isinstance(crawler, Fetcher) else Fetcher()
        self.tool = crawler if isinstance(crawler, Tool) else None
        self.respect_robots = bool(respect_robots)
        self.same_site = bool(same_site)
        self.max_depth = max_depth
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self.concurrency = concurrency
        self.page_chars = page_chars
        self.model_attempts = model_attempts
        self.model_retry_backoff = float(model_retry_backoff)
        self._chunks = Chunks()
        self._robots: OrderedDict[str, Robots] = OrderedDict()
        super().__init__(name, memory=memory)

    # -- running -----------------------------------------------------------------------

    def run(self, query: str, *, url: str | None = None, session: str | None = None,
            trace_id: str | None = None) -> Run:
        """Start a crawl for the task ``query`` from ``url`` (default: the first URL in
        ``query``); ``run.result()`` is the :class:`AgentResult`."""
        return self.pipeline.call(self._crawl_request(query, session, url), trace_id=trace_id)

    async def arun(self, query: str, *, url: str | None = None, session: str | None = None,
                   trace_id: str | None = None) -> Run:
        """``run`` for async code."""
        return await self.pipeline.acall(self._crawl_request(query, session, url), trace_id=trace_id)

    def flow(self, query: str, *, url: str | None = None, session: str | None = None) -> DFlow[AgentResult]:
        """The crawl as a flow to embed in another (in a ``flat_map``)."""
        return self._retrying(
            DFlow.just(self._crawl_request(query, session, url))
            .map(self._start).id(f"{self.name}.start")
            .flat_map(self._loop).id(f"{self.name}.loop")
        )

    def _request(self, query: str, session: str | None) -> dict[str, Any]:
        return self._crawl_request(query, session, None)

    def _crawl_request(self, query: str, session: str | None, url: str | None) -> dict[str, Any]:
        if not isinstance(query, str):
            raise TypeError(f"a crawl's task is a str, got {type(query).__qualname__}")
        return {"query": query, "session": check_session(session), "url": _start_url(query, url)}

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
        start = _start_url(request["query"], request.get("url"))
        state = await super()._start(ctx, request)
        ns = state["ns"]
        host = site_of(start)
        state.update(start=start, sites=[host], queue=[[0, 0, []]], wave=[], pages=0, bytes=0, chunks=1,
                     beyond=0, disallowed=0, refused=[], unread=[], rejected=[], candidate=None, evidence=[],
                     validated=False, model_failed=False)
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
        wave_depth = state["wave"][0][1] if state["wave"] else 0
        state["wave"] = []
        note = ""
        if not any("content" in v for v in views):  # nothing to read: what happened is told with the next pages
            state["unread"] = [*state["unread"], *views][-50:]
        elif state["status"] == RUNNING:
            views, state["unread"] = [*state["unread"], *views], []
            inputs = {"job": state["query"], "depth": wave_depth, "max_depth": self.max_depth, "pages": views,
                      "notes": notes, "rejected": state["rejected"], "refused": state["refused"],
                      "pages_left": max(0, self.max_pages - state["pages"])}
            state["refused"] = []
            research = await self._ask(ctx, state, "research", self.research, inputs, as_research)
            if isinstance(research, Research):
                note = f"(depth {wave_depth}) {research.notes}" if research.notes.strip() else ""
                self._follow(state, urls, seen, queued, research.follow, wave_depth + 1)
                del state["queue"][max(0, self.max_pages - state["pages"]) + 64:]  # more could never be fetched
                if research.found and research.answer.strip():
                    state["candidate"] = _candidate(research, views, self.page_chars)
        chunk = {"urls": urls.since(known), "queued": queued, "notes": note}
        problem = _too_large("the URLs this level adds to the crawl's map", chunk) or (
            _too_large("the candidate answer and its pages", state) if state["candidate"] is not None else None)
        if problem is not None:
            chunk = {"urls": [], "queued": [], "notes": note}
            _give_up(state, problem)
        ctx.put(f"{ns}/map/{state['chunks']}", chunk)
        state["chunks"] += 1
        if state["candidate"] is not None and state["status"] == RUNNING:
            return self._retrying(DFlow.just(state).flat_map(self._validate).id("validate"))
        return await self._launch(ctx, state, urls)

    async def _validate(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[Any]:
        """Check the candidate answer against its pages: the end, or the crawl goes on."""
        state = dict(state)
        candidate, state["candidate"] = state["candidate"], None
        inputs = {"job": state["query"], "answer": candidate["answer"], "sources": candidate["sources"],
                  "pages": candidate["pages"]}
        verdict = await self._ask(ctx, state, "validation", self.validation, inputs, as_validation)
        if isinstance(verdict, Validation):
            if verdict.valid:
                state["validated"] = True
                state["evidence"] = candidate["pages"]
                where = ", ".join(candidate["sources"]) or "the pages of the last level"
                reason = f"the answer was found on {where} and validated"
                return self._done(stop(state, AgentStatus.FINISHED, reason, answer=candidate["answer"]))
            reason = verdict.reason or "no reason given"
            state["rejected"] = [*state["rejected"], f"{candidate['answer'][:300]} (rejected: {reason[:300]})"][-5:]
        urls, _, _ = self._load(ctx, state)
        return await self._launch(ctx, state, urls)

    async def _launch(self, ctx: ContextStack, state: dict[str, Any], urls: UrlMap) -> DFlow[Any]:
        """The next wave: the queue's first URLs of one depth that robots.txt allows, all at
        once (a ``zip`` of one step each); or the end, when nothing is left or a budget is spent."""
        state = dict(state)
        if state["status"] != RUNNING:
            return self._done(state)
        if state["pages"] >= self.max_pages:
            return self._done(stop(state, AgentStatus.ERROR, f"the page budget of {self.max_pages} pages is spent "
                                   "without a validated answer"))
        if state["bytes"] >= self.max_bytes:
            return self._done(stop(state, AgentStatus.ERROR, f"the byte budget of {self.max_bytes} bytes is spent "
                                   "without a validated answer"))
        queue = [list(e) for e in state["queue"]]
        room = min(self.concurrency, self.max_pages - state["pages"])
        wave: list[list[Any]] = []
        refused = list(state["refused"])
        while queue and len(wave) < room and (not wave or queue[0][1] == wave[0][1]):
            entry = queue.pop(0)
            url = urls.at(entry[0])
            rules = await self._rules(ctx, state["ns"], url) if self.respect_robots else None
            if rules is not None and not rules.allows(url, self.fetcher.user_agent):
                refused.append(f"L{entry[0]} (robots.txt disallows it)")
                state["disallowed"] += 1
                continue
            wave.append(entry)
        state["queue"], state["refused"] = queue, refused[-20:]
        problem = _too_large("the crawl's state", state)
        if problem is not None:
            return self._done(_give_up(state, problem))
        if not wave:
            if state["beyond"]:
                return self._done(stop(state, AgentStatus.ERROR, f"the depth budget of {self.max_depth} is reached "
                                       f"without a validated answer ({state['beyond']} deeper links not followed)"))
            told = f" ({state['disallowed']} URLs disallowed by robots.txt)" if state["disallowed"] else ""
            if state["pages"] and len(state["unread"]) == state["pages"]:  # research never had a page to read
                told += "; no page could be read: " + "; ".join(
                    f"{v['id']}: {str(v.get('note', ''))[:300]}" for v in state["unread"][:3])
            return self._done(stop(state, AgentStatus.TERMINATED, "no validated answer: nothing is left to follow "
                                   f"after {state['pages']} pages{told}"))
        state["wave"] = wave
        state["step"] += 1
        ctx.put(f"{state['ns']}/state", state)
        share = -(-(self.max_bytes - state["bytes"]) // len(wave))  # the wave's pages share the bytes left
        keep = value_limit() // 2 // len(wave)  # and half of what the run stores in one value (the zip's)
        branches = [self._branch(urls.at(entry[0]), share, keep) for entry in wave]
        return self._retrying(DFlow.zip(branches, merge=False).flat_map(self._loop).id("loop"))

    def _done(self, state: dict[str, Any]) -> DFlow[AgentResult]:
        return (DFlow.just(state).map(self._summarize).id("summary")
                .retry(self.model_attempts, backoff=self.model_retry_backoff, on=ModelRetryableError)
                .map(self._finish).id("finish"))

    async def _summarize(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """The final answer, written by the summary function from what the crawl found."""
        state = dict(state)
        if state["model_failed"]:
            return state
        _, _, notes = self._load(ctx, state)
        inputs = {"job": state["query"], "answer": state["answer"] if state["validated"] else "",
                  "validated": state["validated"], "notes": notes, "pages": state["evidence"],
                  "reason": state["reason"], "pages_fetched": state["pages"]}
        text = await self._ask(ctx, state, "summary", self.summary, inputs, as_summary, fatal=False)
        if isinstance(text, str):
            state["answer"] = text
        return state

    # -- helpers -----------------------------------------------------------------------

    async def _ask(self, ctx: ContextStack, state: dict[str, Any], what: str, fn: CrawlFunction,
                   inputs: dict[str, Any], coerce: Callable[[Any], Any], *, fatal: bool = True) -> Any:
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
        except Exception as exc:  # noqa: BLE001 - a failing function ends the run with the reason
            problem = f"the {what} function failed: {type(exc).__name__}: {str(exc)[:500]}"
        if fatal:
            state["model_failed"] = True
            stop(state, AgentStatus.ERROR, problem)
        else:
            state["reason"] = f"{state['reason']}; {problem}" if state["reason"] else problem
        return None

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        return [ChatMessage.user(state["query"]), ChatMessage.assistant(state.get("answer", ""))]


def _start_url(query: str, url: str | None) -> str:
    """The crawl's start: ``url``, or the first http(s) URL written in the task."""
    if url is None:
        found = _URL_IN_TEXT.search(query)
        if found is None:
            raise ValueError("a crawl needs a start URL: pass url='https://...' or write it in the task")
        url = found.group(0).rstrip(".,;:!?")
    if not isinstance(url, str):
        raise TypeError(f"the start URL is a str, got {type(url).__qualname__}")
    start = normalize_url(url)
    if start is None:
        raise ValueError(f"the start URL {url[:200]!r} is not an http(s) URL of at most 2048 characters")
    return start


def _too_large(what: str, value: Any) -> str | None:
    """Why ``value`` cannot be stored in one value of the run (it is over the store's limit),
    or ``None``."""
    size, limit = encoded_size(value), value_limit()
    if size <= limit - min(65_536, limit // 8):  # a margin for what the estimate leaves out
        return None
    return (f"{what} would take about {size} bytes, over the store's limit of {limit} bytes on one value: "
            "the crawl stops here")


def _give_up(state: dict[str, Any], problem: str) -> dict[str, Any]:
    """``state`` ended with ERROR for ``problem``, without what made it large."""
    state.update(queue=[], wave=[], unread=[], refused=[], candidate=None, evidence=[])
    return stop(state, AgentStatus.ERROR, problem)


def _candidate(research: Research, views: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    readable = [v for v in views if "content" in v]
    wanted = {f"L{n}" for n in (parse_id(s) for s in research.sources) if n is not None}
    sources = [v for v in readable if v["id"] in wanted] or readable
    return {"answer": research.answer.strip(), "sources": [v["id"] for v in sources], "pages": sources}


def _given(model: ChatModel | CompletionModel | None) -> ChatModel | CompletionModel:
    if model is None:  # pragma: no cover - checked in __init__ first
        raise TypeError("a default crawl function needs a model")
    return model


def _at_least(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
