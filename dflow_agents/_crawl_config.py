"""The settings of :class:`~dflow_agents.crawler.DeepCrawlerAgent`, in three keyword groups:
:class:`CrawlFunctions` (who decides, and how often a failing model is asked again),
:class:`CrawlBudget` (how far, how much, how many at once, how much of each page is read)
and :class:`CrawlScope` (what may be requested). Each is a frozen dataclass whose defaults
are those of the agent; a bad value is refused when the group is made, with its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["CrawlBudget", "CrawlFunction", "CrawlFunctions", "CrawlScope"]

#: research, validation, summary: an ``AIFunction`` or any ``(inputs) -> result`` callable, sync or async
CrawlFunction = Callable[[Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class CrawlFunctions:
    """The crawl's three functions, and how a model that fails is asked again.

    Args:
        research, validation, summary: an ``AIFunction`` or any callable taking the inputs
            dict (see :mod:`dflow_agents.crawler`); ``None``: the default one on the
            agent's model (:func:`~dflow_agents.crawler.research_function` and its siblings).
        attempts: calls of a function that fails with a retryable model error (rate limit,
            timeout, server error), waiting ``retry_backoff`` seconds, doubling, on store
            timers; then the run stops with ERROR.
        retry_backoff: the first wait, in seconds.
    """

    research: CrawlFunction | None = None
    validation: CrawlFunction | None = None
    summary: CrawlFunction | None = None
    attempts: int = 4
    retry_backoff: float = 1.0

    def __post_init__(self) -> None:
        for what in ("research", "validation", "summary"):
            fn = getattr(self, what)
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"CrawlFunctions.{what} must be an AIFunction or a callable taking the inputs dict, "
                    f"got {fn!r:.200}"
                )
        _at_least("CrawlFunctions.attempts", self.attempts, 1)
        backoff = self.retry_backoff
        if not isinstance(backoff, (int, float)) or isinstance(backoff, bool) or backoff < 0:
            raise ValueError(
                f"CrawlFunctions.retry_backoff must be a number of seconds >= 0, got {backoff!r}"
            )
        object.__setattr__(self, "retry_backoff", float(backoff))

    def missing(self) -> list[str]:
        """The functions not given (the agent makes them on its model)."""
        return [what for what in ("research", "validation", "summary") if getattr(self, what) is None]


@dataclasses.dataclass(frozen=True)
class CrawlBudget:
    """How far a crawl goes, how much it reads, and how much of each page research sees.

    Args:
        max_depth: links followed from the start page (0: the start page only).
        max_pages: URLs requested in all.
        max_bytes: body bytes read in all; with the built-in fetcher the pages of a wave
            share the bytes left, so the crawl never reads more (a crawler tool's pages are
            counted once read).
        concurrency: pages fetched at once (a wave).
        page_chars: characters of each page's text shown to the functions.
        link_chars: characters of links listed apart for research, shared by the pages of a
            wave: a page's links further down than its text shown, not yet in the crawl, as
            ``[text](L12)``. The way on from a long index page, whose links lie beyond
            ``page_chars`` (and which is often alone in its wave: the start page).
    """

    max_depth: int = 3
    max_pages: int = 50
    max_bytes: int = 20_000_000
    concurrency: int = 16
    page_chars: int = 6_000
    link_chars: int = 16_000

    def __post_init__(self) -> None:
        _at_least("CrawlBudget.max_depth", self.max_depth, 0)
        _at_least("CrawlBudget.link_chars", self.link_chars, 0)
        for what in ("max_pages", "max_bytes", "concurrency", "page_chars"):
            _at_least(f"CrawlBudget.{what}", getattr(self, what), 1)


@dataclasses.dataclass(frozen=True)
class CrawlScope:
    """What a crawl may request.

    Args:
        respect_robots: read each site's robots.txt (once per crawl, with the ``Fetcher``,
            or a default one when the crawler is a tool) and never request what it
            disallows; a site whose robots.txt cannot be read (a server error, no answer) is
            unreachable, and nothing of it is requested (RFC 9309).
        same_site: follow only links to the start URL's site: its scheme, host (``www.``
            aside) and port (a start page that redirects moves the site).
    """

    respect_robots: bool = True
    same_site: bool = True

    def __post_init__(self) -> None:
        for what in ("respect_robots", "same_site"):
            if not isinstance(getattr(self, what), bool):
                raise TypeError(f"CrawlScope.{what} must be a bool, got {getattr(self, what)!r}")


def _at_least(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
