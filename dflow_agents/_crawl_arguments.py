"""What :class:`~dflow_agents.crawler.DeepCrawlerAgent` is given, checked: each keyword
group of its settings (or its defaults), its crawler (the built-in ``Fetcher`` or a tool
taking a ``url``), the default crawl functions made on its model, and a crawl's start URL
(given, or the first one written in the task). A bad argument is refused with what to pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from ._crawl_config import CrawlFunction
from .fetch import Fetcher, normalize_url
from .model import ChatModel, CompletionModel
from .tools import Tool

__all__ = ["crawler_of", "keyword_group", "or_default", "start_url"]

_URL_IN_TEXT = re.compile(r"https?://[^\s<>\"'`)\]]+")


def start_url(query: str, url: str | None) -> str:
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


def or_default(
    fn: CrawlFunction | None,
    default: Callable[[ChatModel | CompletionModel], CrawlFunction],
    model: ChatModel | CompletionModel | None,
) -> CrawlFunction:
    """``fn``, or the default function made on ``model`` (checked in ``__init__`` first)."""
    if fn is not None:
        return fn
    if model is None:  # pragma: no cover - checked in __init__ first
        raise TypeError("a default crawl function needs a model")
    return default(model)


_Group = TypeVar("_Group")


def keyword_group(what: str, value: _Group | None, kind: type[_Group]) -> _Group:
    """``value``, a keyword group of the agent's settings, or its defaults when ``None``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{what} must be a {kind.__name__}, got {value!r:.200}")
    return value


def crawler_of(crawler: object) -> tuple[Fetcher, Tool | None]:
    """The fetcher (robots.txt, limits) and the crawler tool, if any, of ``crawler``."""
    if crawler is None or isinstance(crawler, Fetcher):
        return crawler or Fetcher(), None
    if not isinstance(crawler, Tool):
        raise TypeError(f"crawler must be a Fetcher or a Tool taking a url, got {crawler!r}")
    if "url" not in (crawler.parameters.get("properties") or {}):
        raise ValueError(f"the crawler tool {crawler.name!r} must take a 'url' argument")
    return Fetcher(), crawler
