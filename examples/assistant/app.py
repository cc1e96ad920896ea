"""The outfit assistant of the article: what ``dflow worker`` and ``dflow serve`` import.

* ``assistant``: a :class:`PlanningFlow` (pipeline ``planning.assistant``) that plans the
  request and gives each step to ``shopper``;
* ``shopper``: a :class:`ToolCallAgent` with the tools ``search`` (the shop's catalogue),
  ``dapei`` (propose outfits), ``chuan`` (try one on), ``ask_user`` (a pulled tool: the
  user picks one of at most three choices in the plug-in) and ``browser``;
* ``browser``: a :class:`DeepCrawlerAgent` as a tool (``agent_tool``), whose crawler is the
  pulled tool ``fetch_page``: the browser plug-in fetches each page in the user's browser
  and reports it, so the server never needs to reach the shop;
* ``DFLOW_ROUTES``: the job routes (``GET /jobs``, ``POST /jobs/{id}``) for ``dflow serve``.

The model: the scripted one (:func:`examples.assistant.scripted.brain`), offline, unless
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` are set; then that model plans,
shops, crawls and summarises, and nothing else changes.

Pulled jobs wait beside the runtime's store: in memory in local mode, in the store's Redis
(under its prefix) on workers and ``dflow serve``, so both sides meet without more settings.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Annotated, Any, Literal

from pydantic import Field

import dflow
from dflow_agents import (
    AgentLimits,
    ChatModel,
    CrawlBudget,
    CrawlScope,
    DeepCrawlerAgent,
    InMemoryJobBoard,
    Job,
    JobBoard,
    PlanningFlow,
    PullingJobTool,
    RedisJobBoard,
    ToolCallAgent,
    agent_tool,
    job_routes,
    tool,
)
from dflow_agents.testing import FunctionModel

from . import catalogue
from .scripted import brain

__all__ = [
    "DFLOW_ROUTES",
    "MODEL",
    "PIPELINE",
    "SHOPPER_PROMPT",
    "StoreJobBoard",
    "ask",
    "assistant",
    "board",
    "browser",
    "chuan",
    "crawler",
    "dapei",
    "fetch",
    "search",
    "shopper",
]

#: the pipeline a client starts (``POST /runs {"pipeline": PIPELINE, "param": "the request"}``)
PIPELINE = "planning.assistant"

SHOPPER_PROMPT = (
    "You are an outfit assistant in the user's browser: you help the user decide what to wear and put "
    "outfits together from the shop's catalogue. search finds items in the catalogue; browser reads the "
    "shop's pages in the user's own browser (give it the question and the URL to start from); dapei proposes "
    "outfits from item ids; ask_user lets the user choose between at most three options when you cannot "
    "decide; chuan tries an outfit on. Do only the step you are given. When it is done, call terminate with "
    "status success and what you did, or with status failure when it cannot be done."
)


def _model() -> ChatModel:
    """A real model when the environment names one; the scripted one otherwise."""
    if os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_MODEL"):
        from dflow_agents import OpenAIChatModel

        model: ChatModel = dflow.shared(OpenAIChatModel(), "examples.assistant:model")
        return model
    return FunctionModel(brain, name="scripted-assistant")


MODEL = _model()


# -- where pulled jobs wait ------------------------------------------------------------------------


class StoreJobBoard(JobBoard):
    """The job board beside the runtime's store: an :class:`InMemoryJobBoard` in local mode,
    a :class:`RedisJobBoard` in the store's Redis (keys under ``<store prefix>:<name>``)
    otherwise. Chosen at first use in each process (workers post, the server pulls)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._chosen: tuple[weakref.ref[dflow.Store], JobBoard] | None = None

    def __repr__(self) -> str:
        return f"StoreJobBoard({self.name!r})"

    def board(self) -> JobBoard:
        """The board of the runtime configured now."""
        store = dflow.current_runtime().store
        with self._lock:
            if self._chosen is None or self._chosen[0]() is not store:
                self._chosen = (weakref.ref(store), self._beside(store))
            return self._chosen[1]

    def _beside(self, store: dflow.Store) -> JobBoard:
        if isinstance(store, dflow.MemoryStore):
            return InMemoryJobBoard()
        url = getattr(store, "url", None)
        if isinstance(url, str) and url.startswith(("redis://", "rediss://", "unix://")):
            return RedisJobBoard(url, prefix=f"{getattr(store, 'prefix', 'dflow')}:{self.name}")
        raise dflow.ConfigurationError(
            f"the assistant keeps pulled jobs beside the store, in memory (local mode) or in Redis; the store "
            f"{type(store).__name__} is neither: run the workers and dflow serve with --store redis://..."
        )

    async def post(self, job: Job) -> bool:
        return await self.board().post(job)

    async def pull(self, session: str, *, wait: float, limit: int) -> list[Job]:
        return await self.board().pull(session, wait=wait, limit=limit)

    async def get(self, job_id: str) -> Job | None:
        return await self.board().get(job_id)

    async def settle(self, job_id: str, state: Literal["answered", "expired"]) -> bool:
        return await self.board().settle(job_id, state)


board = StoreJobBoard("assistant-jobs")


# -- the tools -----------------------------------------------------------------------------------

Kind = Literal["top", "bottom", "shoes", "outerwear"]


@tool
def search(query: str, kind: Kind | None = None, limit: Annotated[int, Field(ge=1, le=10)] = 5) -> Any:
    """Search the shop's catalogue; the items that match, best first (material and sizes are on
    each item's page in the shop).

    Args:
        query: words such as a season, a style, a colour or a kind of clothes ("spring casual").
        kind: only items of this kind.
        limit: how many items at most.
    """
    found = catalogue.search_items(query, kind, limit)
    if not found:
        return (
            f"No item matches {query[:100]!r}; try a season (spring...), a style (casual, smart) or a colour."
        )
    return [item.summary() for item in found]


@tool
def dapei(
    items: Annotated[list[str], Field(min_length=2, max_length=12)], occasion: str = ""
) -> dict[str, Any]:
    """Propose outfits (搭配, dapei) from catalogue items: up to three, each a top and a bottom,
    with the first shoes and outerwear given.

    Args:
        items: the ids of the items to combine, as search gives them (tops, bottoms, shoes...).
        occasion: what the outfit is for, if the user said.
    """
    outfits = catalogue.propose_outfits(items)
    return {"occasion": occasion, "outfits": outfits}


@tool
def chuan(outfit: str) -> str:
    """Try an outfit on (穿, chuan): the user's avatar in the plug-in wears it.

    Args:
        outfit: the outfit's id, as dapei gives it (item ids joined by '+').
    """
    return catalogue.try_on(outfit)


Choice = Annotated[str, Field(min_length=1, max_length=200)]


def ask_user(
    question: Annotated[str, Field(max_length=500)],
    choices: Annotated[list[Choice], Field(min_length=2, max_length=3)],
) -> str:
    """Ask the user to choose, when you cannot decide yourself: the plug-in shows the question
    and the choices; the answer is the choice the user picked.

    Args:
        question: what to ask, in one sentence.
        choices: two or three options, each a short text.
    """
    raise NotImplementedError("never called: the plug-in does the job")


def fetch_page(url: str) -> str:
    """Open a page in the user's browser; its text as markdown, with its links.

    Args:
        url: the page's http(s) address.
    """
    raise NotImplementedError("never called: the plug-in does the job")


ask = PullingJobTool(ask_user, board, timeout=300)
fetch = PullingJobTool(fetch_page, board, timeout=60)

# -- the agents and the plan -----------------------------------------------------------------------

crawler = DeepCrawlerAgent(
    "assistant-crawler",
    MODEL,
    crawler=fetch,
    # the user's own browser opens the pages, for the user, as the user would
    scope=CrawlScope(respect_robots=False),
    budget=CrawlBudget(max_depth=3, max_pages=15, concurrency=8),
)
browser = agent_tool(
    crawler,
    name="browser",
    max_depth=1,
    description="Read the shop's website in the user's browser to answer a question about a product. Give the "
    "question and the URL to start from, e.g. 'What is the Linen shirt made of? Start at https://...'.",
)
shopper = ToolCallAgent(
    "assistant-shopper",
    MODEL,
    [search, dapei, chuan, ask, browser],
    system_prompt=SHOPPER_PROMPT,
    limits=AgentLimits(max_steps=8),
)
assistant = PlanningFlow("assistant", shopper, MODEL)

DFLOW_ROUTES = [job_routes(board)]
