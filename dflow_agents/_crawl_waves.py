"""How :class:`~dflow_agents.crawler.DeepCrawlerAgent` fetches and reads a wave of pages.

A wave is a ``zip`` of one step per URL: the built-in :class:`Fetcher`'s ``fetch``, or a call
of the crawler tool (``crawl``, a flow too), whose result is kept as a page within the
fetcher's limits. The step after the wave reads the results into the pages the crawl
functions see (links shortened to ids, redirects queued at the same depth, budgets counted)
and queues the links research chose, breadth first.

What a crawl knows lives in the run's data under the agent's namespace: the URL map in
chunks written once each (read once per process, :class:`Chunks`), and the robots.txt rules
of each site (fetched once per crawl, parsed once per process).

Every value stays well within the store's limit on one value, whatever the site sends: the
pages of a wave come back as one value, so each fetch step keeps its share of half that
limit (links in half of it, at most 2 MB of them, markdown in the rest: a link dropped
becomes its text); a wave adds at most 2 MB of URLs to the map (a quarter of the limit at
most), shared between its pages (a link beyond keeps its text but gets no id), and the map
holds at most 16 MB of URLs in all.

:class:`CrawlWaves` holds these steps as methods of the agent, so a flow that captures them
carries the agent's shared name, as the agent's other steps do.
"""

from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

import dflow
from dflow import ContextStack, DFlow

from ._crawl_config import CrawlBudget, CrawlScope
from ._crawl_pages import page_of
from ._markdown import origin_of, trim_open_link
from ._urlmap import UrlMap, parse_id, shorten_links
from .fetch import Fetcher, Page, Robots
from .tools import Tool, ToolResult

__all__ = ["Chunks", "CrawlWaves", "encoded_size", "shares", "site_of", "value_limit"]

_MAX_REDIRECTS = 5  # redirect hops followed from one link
_WAVE_MAP_BYTES = 2_000_000  # URL characters a wave adds to the URL map at most (and a page keeps)
_MAP_BYTES = 16_000_000  # URL characters the map holds at most
_PAGE_KEEP = 4_000_000  # bytes a fetch step keeps at most (a wave's pages share half the store's limit)
_CACHE_BYTES = 64_000_000  # URL characters Chunks keeps at most
_DEFAULT_PORT = {"http": 80, "https": 443}
_ID_LINK = re.compile(r"\[((?:\\.|[^\[\]\\]|\[[^\[\]]*\])*)\]\((L\d+)\)")  # [text](L12)


class Chunks:
    """The run's URL-map chunks, read once per process (each is written once, under a key
    that names the invocation)."""

    def __init__(self, size: int = 4096, max_bytes: int = _CACHE_BYTES) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()

    def read(self, ctx: ContextStack, key: str) -> dict[str, Any]:
        hit = self._entries.get(key)
        if hit is None:
            chunk = ctx.get(key)
            if chunk is None:
                raise LookupError(f"the crawl's data {key!r} is missing from run {ctx.trace_id!r}")
            hit = self._entries[key] = (chunk, sum(map(len, chunk["urls"])))
            self._bytes += hit[1]
            while len(self._entries) > 1 and (
                len(self._entries) > self._size or self._bytes > self._max_bytes
            ):
                self._bytes -= self._entries.popitem(last=False)[1][1]
        return hit[0]


class CrawlWaves:
    """The wave steps of :class:`~dflow_agents.crawler.DeepCrawlerAgent`: fetching a wave's
    URLs, reading the results, queueing links, and the crawl's data in the run."""

    fetcher: Fetcher
    tool: Tool | None
    budget: CrawlBudget
    scope: CrawlScope
    _chunks: Chunks
    _robots: OrderedDict[str, Robots]

    # -- reading a wave ----------------------------------------------------------------

    def _absorb(
        self, state: dict[str, Any], urls: UrlMap, seen: set[int], queued: list[int], results: list[Any]
    ) -> list[dict[str, Any]]:
        """The wave's results as the pages the functions read; redirects queued, budgets counted.
        Each page adds at most its share of what the wave may add to the URL map."""
        views = []
        room = min(_WAVE_MAP_BYTES, value_limit() // 4, _MAP_BYTES - urls.bytes)  # the map chunk stays small
        share = max(0, room) // max(1, len(state["wave"]))
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
                view.update(self._readable(state, urls, seen, page, share))
            else:
                view["note"] = page.note or "nothing could be read"
            views.append(view)
        return views

    def _readable(
        self, state: dict[str, Any], urls: UrlMap, seen: set[int], page: Page, share: int
    ) -> dict[str, Any]:
        """What the functions read of a page: its text with links as ids (new URLs added to
        the map within ``share`` characters), the ids of its links, the links further down
        than the text shown, and notes."""
        short: dict[str, str] = {}
        added, unlisted = 0, 0
        for link in page.links:
            if not self._on_site(state, link):
                continue
            known = urls.number(link)
            if known is None:
                if added + len(link) > share:
                    unlisted += 1  # the map is full for this wave: the link keeps its text
                    continue
                added += len(link)
                known = urls.add(link)
            short[link] = f"L{known}"
        text = shorten_links(page.markdown, page.links, short)
        view: dict[str, Any] = {"content": _clip(text, self.budget.page_chars)}
        view["links"] = list(dict.fromkeys(short.values()))
        more = _more_links(text, view["content"], seen, self.budget.link_chars // max(1, len(state["wave"])))
        if more:
            view["more_links"] = more
        notes = [page.note] if page.note else []
        if unlisted:
            notes.append(
                f"{unlisted} links not listed (their text stays): the crawl's URL map takes at "
                f"most {share} characters of new URLs from a page of this level"
            )
        if notes:
            view["note"] = "; ".join(notes)
        return view

    def _redirect(
        self,
        state: dict[str, Any],
        urls: UrlMap,
        seen: set[int],
        queued: list[int],
        n: int,
        depth: int,
        chain: list[int],
        page: Page,
    ) -> str:
        """Queue a redirect's target (at the same depth) unless it is a loop, off the site or
        known; say what happened."""
        assert page.redirect is not None
        if depth == 0 and site_of(page.redirect) not in state["sites"]:
            state["sites"] = [
                *state["sites"],
                site_of(page.redirect),
            ]  # the start page moved: so did the site
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

    def _follow(
        self,
        state: dict[str, Any],
        urls: UrlMap,
        seen: set[int],
        queued: list[int],
        ids: list[str],
        depth: int,
    ) -> None:
        for short in ids:
            n = parse_id(short)
            if n is None or n >= len(urls) or n in seen or not self._on_site(state, urls.at(n)):
                continue  # not an id, unknown, already queued or fetched, or off the site
            if depth > self.budget.max_depth:
                state["beyond"] += 1
                continue
            seen.add(n)
            queued.append(n)
            _enqueue(state["queue"], [n, depth, []])

    # -- choosing a wave ----------------------------------------------------------

    async def _next_wave(self, ctx: ContextStack, state: dict[str, Any], urls: UrlMap) -> list[list[Any]]:
        """The queue's first URLs of one depth that robots.txt allows, at most as many as the
        budgets leave room for (pages at once, pages, bytes: a page reads a byte at least);
        those refused are noted for research."""
        budget = self.budget
        queue = [list(e) for e in state["queue"]]
        room = min(budget.concurrency, budget.max_pages - state["pages"], budget.max_bytes - state["bytes"])
        wave: list[list[Any]] = []
        refused = list(state["refused"])
        while queue and len(wave) < room and (not wave or queue[0][1] == wave[0][1]):
            entry = queue.pop(0)
            why = await self._refusal(ctx, state, urls.at(entry[0]))
            if why is None:
                wave.append(entry)
            else:
                refused.append(f"L{entry[0]} ({why})")
        state["queue"], state["refused"] = queue, refused[-20:]
        return wave

    async def _refusal(self, ctx: ContextStack, state: dict[str, Any], url: str) -> str | None:
        """Why the robots.txt of ``url``'s site keeps it from being fetched (counted in
        ``state``), or ``None``."""
        if not self.scope.respect_robots:
            return None
        rules = await self._rules(ctx, state["ns"], url)
        if rules.allows(url, self.fetcher.user_agent):
            return None
        if rules.unreachable:  # RFC 9309: nothing is fetched; the reason is the site, not its rules
            state["unreachable"] = state.get("unreachable", 0) + 1
            state["unreachable_why"] = rules.note or f"its robots.txt answered HTTP {rules.status}"
            return f"not fetched: the site is unreachable: {state['unreachable_why']}"
        state["disallowed"] += 1
        return "robots.txt disallows it"

    # -- fetching ----------------------------------------------------------------------

    def _branch(self, url: str, max_bytes: int, keep: int) -> DFlow[Any]:
        """The step that fetches ``url``: the built-in fetcher reads at most ``max_bytes`` of
        its body; the page the step keeps takes at most about ``keep`` bytes (a wave's
        pages come back as one value of the run)."""
        target = [url, max_bytes, keep]
        if self.tool is None:
            return DFlow.just(target).map(self._fetch).id("fetch")
        if self.tool.is_flow:
            return DFlow.just(target).flat_map(self._crawl_flow).id("crawl")
        return DFlow.just(target).map(self._crawl_call).id("crawl")

    async def _fetch(self, target: Any) -> dict[str, Any]:
        url, max_bytes, keep = _target(target)
        page = await self.fetcher.fetch(url, follow_redirects=False, max_bytes=max_bytes)
        return _bounded(page, keep).model_dump(mode="json", exclude_defaults=True)

    async def _crawl_call(self, target: Any) -> dict[str, Any]:
        assert self.tool is not None
        url, _, keep = _target(target)
        result = await self.tool.run({"url": url})
        return self._page(url, keep, result)

    def _crawl_flow(self, target: Any) -> DFlow[Any]:
        assert self.tool is not None
        url, _, keep = _target(target)
        built = self.tool.flow({"url": url})
        if isinstance(built, ToolResult):
            return DFlow.just(self._page(url, keep, built))
        return (
            built.map(functools.partial(self._page, url, keep))
            .id("crawl-page")
            .on_error_return(functools.partial(self._crawl_failed, url))
        )

    def _crawl_failed(self, url: str, error: BaseException) -> dict[str, Any]:
        return self._page(
            url,
            _PAGE_KEEP,
            ToolResult.failure(
                self.tool.name if self.tool else "crawler",
                f"the crawler failed: {type(error).__name__}: {str(error)[:500]}",
                error=type(error).__name__,
            ),
        )

    def _page(self, url: str, keep: int, result: Any) -> dict[str, Any]:
        """What the crawler tool gave, as a page within the fetcher's limits and ``keep``
        bytes (the step's value)."""
        page = page_of(url, result)
        if len(page.markdown) > self.fetcher.max_chars or len(page.links) > self.fetcher.max_links:
            page = page.model_copy(
                update={
                    "markdown": page.markdown[: self.fetcher.max_chars],
                    "links": page.links[: self.fetcher.max_links],
                    "truncated": True,
                }
            )
        return _bounded(page, keep).model_dump(mode="json", exclude_defaults=True)

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
        return not self.scope.same_site or site_of(url) in state["sites"]


def site_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (host in lower case, ``www.`` aside, the port given
    or the scheme's default): what ``same_site`` compares."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().removeprefix("www.")
    try:
        port = parts.port or _DEFAULT_PORT.get(scheme, 0)
    except ValueError:  # not a port: no site
        port = 0
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def value_limit() -> int:
    """The most bytes the configured runtime stores in one value (8 MiB when none is configured)."""
    try:
        return int(dflow.current_runtime().max_value_bytes)
    except dflow.ConfigurationError:
        return 8 * 1024 * 1024


def encoded_size(value: Any) -> int:
    """About the bytes ``value`` (JSON data) takes stored: its compact JSON, which is no
    smaller than its msgpack encoding."""
    return len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8", "replace")
    )


def _target(value: Any) -> tuple[str, int | None, int]:
    """``(url, max_bytes, keep)`` of a fetch step's input (a URL alone: a step of dflow-agents 0.2)."""
    if isinstance(value, str):
        return value, None, _PAGE_KEEP
    url, max_bytes, keep = value
    return str(url), max_bytes, keep


def _bounded(page: Page, keep: int) -> Page:
    """``page`` within about ``keep`` bytes: its links up to half of them (and no more than a
    wave may add to the URL map; those beyond become their text), its markdown in the rest;
    its note says what was left out."""
    links, total, most = len(page.links), 0, min(keep // 2, _WAVE_MAP_BYTES)
    for i, link in enumerate(page.links):
        total += len(link) + 3
        if total > most:
            links = i
            break
    room = max(
        0,
        keep - sum(len(u) + 3 for u in page.links[:links]) - len(page.title) * 4 - len(page.note) * 4 - 4096,
    )
    if links == len(page.links) and len(page.markdown) * 4 <= room:
        return page  # what a page nearly always is: nothing to measure
    notes = [page.note] if page.note else []
    markdown = page.markdown
    if links < len(page.links):
        markdown = shorten_links(markdown, page.links[links:], {})
        notes.append(
            f"{len(page.links) - links} links left out (their text stays): a page of this level "
            f"keeps at most {most} bytes of links"
        )
    data = markdown.encode("utf-8")
    if len(data) > room:
        markdown = trim_open_link(data[:room].decode("utf-8", "ignore")).rstrip() + "\n[... cut]"
        notes.append(f"the text was cut at about {room} bytes (what a page of this level keeps)")
    return page.model_copy(
        update={
            "links": page.links[:links],
            "markdown": markdown,
            "note": "; ".join(notes),
            "truncated": True,
        }
    )


def shares(left: int, pages: int) -> list[int]:
    """``left`` bytes shared between ``pages`` (at most ``left``) pages: as evenly as whole
    bytes allow, and never more in all."""
    each, extra = divmod(left, pages)
    return [each + (i < extra) for i in range(pages)]


def _enqueue(queue: list[list[Any]], entry: list[Any]) -> None:
    """Insert ``entry`` after every entry of its depth or less (the queue stays breadth-first)."""
    at = len(queue)
    while at > 0 and queue[at - 1][1] > entry[1]:
        at -= 1
    queue.insert(at, entry)


def _more_links(text: str, content: str, seen: set[int], limit: int) -> list[list[str]]:
    """``[id, text]`` of the links of ``text`` (a page's markdown with links as ids) that
    ``content`` (the part of it shown) does not show and the crawl has not queued, once each
    in page order, within ``limit`` characters (each text at most 100)."""
    shown = {found.group(2) for found in _ID_LINK.finditer(content)}
    more: list[list[str]] = []
    size = 0
    for found in _ID_LINK.finditer(text):
        short = found.group(2)
        if short in shown or int(short[1:]) in seen:
            continue
        shown.add(short)
        label = " ".join(found.group(1).split())[:100]
        size += len(label) + len(short) + 6  # as the prompt shows it: "- [text](L12)"
        if size > limit:
            break
        more.append([short, label])
    return more


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return trim_open_link(text[:limit]).rstrip() + f"\n[... {len(text) - limit} more characters]"
