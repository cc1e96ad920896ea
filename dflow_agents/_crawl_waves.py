"""How :class:`~dflow_agents.crawler.DeepCrawlerAgent` fetches and reads a wave of pages.

A wave is a ``zip`` of one step per URL: the built-in :class:`Fetcher`'s ``fetch``, or a call
of the crawler tool (``crawl``, a flow too), whose result is kept as a page within the
fetcher's limits. The step after the wave reads the results into the pages the crawl
functions see (links shortened to ids, redirects queued at the same depth, budgets counted)
and queues the links research chose, breadth first.

What a crawl knows lives in the run's data under the agent's namespace: the URL map in
chunks written once each (read once per process, :class:`Chunks`), and the robots.txt rules
of each site (fetched once per crawl, parsed once per process).

:class:`CrawlWaves` holds these steps as methods of the agent, so a flow that captures them
carries the agent's shared name, as the agent's other steps do.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from dflow import ContextStack, DFlow

from ._crawl_pages import page_of
from ._urlmap import UrlMap, parse_id, shorten_links
from .fetch import Fetcher, Page, Robots, origin_of
from .tools import Tool, ToolResult

__all__ = ["Chunks", "CrawlWaves", "site_of"]

_MAX_REDIRECTS = 5  # redirect hops followed from one link


class Chunks:
    """The run's URL-map chunks, read once per process (each is written once, under a key
    that names the invocation)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def read(self, ctx: ContextStack, key: str) -> dict[str, Any]:
        hit = self._entries.get(key)
        if hit is None:
            hit = ctx.get(key)
            if hit is None:
                raise LookupError(f"the crawl's data {key!r} is missing from run {ctx.trace_id!r}")
            self._entries[key] = hit
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return hit


class CrawlWaves:
    """The wave steps of :class:`~dflow_agents.crawler.DeepCrawlerAgent`: fetching a wave's
    URLs, reading the results, queueing links, and the crawl's data in the run."""

    fetcher: Fetcher
    tool: Tool | None
    same_site: bool
    max_depth: int
    page_chars: int
    _chunks: Chunks
    _robots: OrderedDict[str, Robots]

    # -- reading a wave ----------------------------------------------------------------

    def _absorb(self, state: dict[str, Any], urls: UrlMap, seen: set[int], queued: list[int],
                results: list[Any]) -> list[dict[str, Any]]:
        """The wave's results as the pages the functions read; redirects queued, budgets counted."""
        views = []
        for (n, depth, chain), raw in zip(state["wave"], results):
            page = page_of(urls.at(n), raw)
            state["pages"] += 1
            state["bytes"] += page.bytes
            view: dict[str, Any] = {"id": f"L{n}", "title": page.title, "depth": depth}
            if page.final_url:  # a crawler tool that followed redirects: their target was fetched too
                target = urls.add(page.final_url)
                if target not in seen:
                    seen.add(target)
                    queued.append(target)
            if page.redirect:
                view["note"] = self._redirect(state, urls, seen, queued, n, depth, chain, page)
            elif page.ok:
                short: dict[str, str] = {}
                for link in page.links:
                    if self._on_site(state, link):
                        short[link] = f"L{urls.add(link)}"
                view["content"] = _clip(shorten_links(page.markdown, page.links, short), self.page_chars)
                view["links"] = list(dict.fromkeys(short.values()))
                if page.note:
                    view["note"] = page.note
            else:
                view["note"] = page.note or "nothing could be read"
            views.append(view)
        return views

    def _redirect(self, state: dict[str, Any], urls: UrlMap, seen: set[int], queued: list[int], n: int,
                  depth: int, chain: list[int], page: Page) -> str:
        """Queue a redirect's target (at the same depth) unless it is a loop, off the site or
        known; say what happened."""
        assert page.redirect is not None
        if depth == 0 and site_of(page.redirect) not in state["sites"]:
            state["sites"] = [*state["sites"], site_of(page.redirect)]  # the start page moved: so did the site
        if not self._on_site(state, page.redirect):
            return f"HTTP {page.status}: redirects to another site ({origin_of(page.redirect)}), not followed"
        target = urls.add(page.redirect)
        hops = " -> ".join(f"L{h}" for h in [*chain, n, target])
        if target in chain or target == n:
            return f"HTTP {page.status}: a redirect loop ({hops}), not followed"
        if len(chain) + 1 > _MAX_REDIRECTS:
            return f"HTTP {page.status}: more than {_MAX_REDIRECTS} redirects ({hops}), not followed"
        if target in seen:
            return f"HTTP {page.status}: redirects to L{target}, which the crawl has already"
        seen.add(target)
        queued.append(target)
        _enqueue(state["queue"], [target, depth, [*chain, n]])
        return f"HTTP {page.status}: redirects to L{target}, fetched next"

    def _follow(self, state: dict[str, Any], urls: UrlMap, seen: set[int], queued: list[int],
                ids: list[str], depth: int) -> None:
        for short in ids:
            n = parse_id(short)
            if n is None or n >= len(urls) or n in seen or not self._on_site(state, urls.at(n)):
                continue  # not an id, unknown, already queued or fetched, or off the site
            if depth > self.max_depth:
                state["beyond"] += 1
                continue
            seen.add(n)
            queued.append(n)
            _enqueue(state["queue"], [n, depth, []])

    # -- fetching ----------------------------------------------------------------------

    def _branch(self, url: str) -> DFlow[Any]:
        if self.tool is None:
            return DFlow.just(url).map(self._fetch).id("fetch")
        if self.tool.is_flow:
            return DFlow.just(url).flat_map(self._crawl_flow).id("crawl")
        return DFlow.just(url).map(self._crawl_call).id("crawl")

    async def _fetch(self, url: str) -> dict[str, Any]:
        page = await self.fetcher.fetch(url, follow_redirects=False)
        return page.model_dump(mode="json", exclude_defaults=True)

    async def _crawl_call(self, url: str) -> dict[str, Any]:
        assert self.tool is not None
        result = await self.tool.run({"url": url})
        return self._page(url, result)

    def _crawl_flow(self, url: str) -> DFlow[Any]:
        assert self.tool is not None
        built = self.tool.flow({"url": url})
        if isinstance(built, ToolResult):
            return DFlow.just(self._page(url, built))
        return (built.map(functools.partial(self._page, url)).id("crawl-page")
                .on_error_return(functools.partial(self._crawl_failed, url)))

    def _crawl_failed(self, url: str, error: BaseException) -> dict[str, Any]:
        return self._page(url, ToolResult.failure(self.tool.name if self.tool else "crawler",
                                                  f"the crawler failed: {type(error).__name__}: {str(error)[:500]}",
                                                  error=type(error).__name__))

    def _page(self, url: str, result: Any) -> dict[str, Any]:
        """What the crawler tool gave, as a page within the fetcher's limits (the step's value)."""
        page = page_of(url, result)
        if len(page.markdown) > self.fetcher.max_chars or len(page.links) > self.fetcher.max_links:
            page = page.model_copy(update={"markdown": page.markdown[: self.fetcher.max_chars],
                                           "links": page.links[: self.fetcher.max_links], "truncated": True})
        return page.model_dump(mode="json", exclude_defaults=True)

    async def _rules(self, ctx: ContextStack, ns: str, url: str) -> Robots:
        """The robots.txt rules of ``url``'s site: from the run's data, or fetched once and kept there."""
        key = f"{ns}/robots/{origin_of(url)}"
        data = ctx.get(key)
        if data is None:
            fetched = await self.fetcher.robots(origin_of(url))
            ctx.put(key, fetched.to_data())
            return fetched
        rules = self._robots.get(key)  # parsed once per process
        if rules is None:
            rules = self._robots[key] = Robots.from_data(data)
            if len(self._robots) > 1024:
                self._robots.popitem(last=False)
        return rules

    # -- the crawl's data --------------------------------------------------------------

    def _load(self, ctx: ContextStack, state: dict[str, Any]) -> tuple[UrlMap, set[int], list[str]]:
        """The crawl's URL map, the ids ever queued, and research's notes, from the run's data."""
        urls, seen, notes = UrlMap(), set(), []
        for i in range(state["chunks"]):
            chunk = self._chunks.read(ctx, f"{state['ns']}/map/{i}")
            urls.extend(chunk["urls"])
            seen.update(chunk["queued"])
            if chunk["notes"]:
                notes.append(chunk["notes"])
        return urls, seen, notes

    def _on_site(self, state: dict[str, Any], url: str) -> bool:
        return not self.same_site or site_of(url) in state["sites"]


def site_of(url: str) -> str:
    """The host of ``url`` in lower case, ``www.`` aside: what ``same_site`` compares."""
    host = (urlsplit(url).hostname or "").lower()
    return host.removeprefix("www.")


def _enqueue(queue: list[list[Any]], entry: list[Any]) -> None:
    """Insert ``entry`` after every entry of its depth or less (the queue stays breadth-first)."""
    at = len(queue)
    while at > 0 and queue[at - 1][1] > entry[1]:
        at -= 1
    queue.insert(at, entry)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rstrip() + f"\n[... {len(text) - limit} more characters]"
