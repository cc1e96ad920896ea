"""What a crawler gave for a URL, as a :class:`~dflow_agents.fetch.Page`.

The built-in fetcher's step returns its page as data; a crawler tool returns a
:class:`~dflow_agents.tools.ToolResult` whose output is a page dict (``markdown`` or
``content``, ``links``, ``title``, ``final_url``, ``redirect``, ``note``) or markdown text,
whose link targets are normalised here.
"""

from __future__ import annotations

import re
from typing import Any

from .fetch import Page, normalize_url
from .tools import ToolResult

__all__ = ["page_of"]


_MD_LINK = re.compile(r"\[([^\[\]\n]*)\]\(([^()\s]+)\)")


def page_of(url: str, raw: Any) -> Page:
    """What a crawler gave for ``url`` (a page's data, a ``ToolResult``, a page dict, markdown
    text), as a :class:`Page`."""
    if isinstance(raw, ToolResult):
        if not raw.ok:
            return Page(url=url, note=raw.observation[:1000])
        return page_of(url, raw.output if raw.output is not None else raw.observation)
    if isinstance(raw, dict) and "ok" in raw and "url" in raw:  # a page's data (the built-in fetcher's)
        try:
            return Page.model_validate(raw)
        except ValueError as exc:
            return Page(url=url, note=f"the crawler's page could not be read: {str(exc)[:300]}")
    if isinstance(raw, dict):
        return _page_of_dict(url, raw)
    if isinstance(raw, str):
        return _markdown_page(url, raw)
    return Page(url=url, note=f"the crawler returned {type(raw).__name__}, not a page")


def _page_of_dict(url: str, raw: dict[str, Any]) -> Page:
    """A crawler's page dict (``markdown`` or ``content``, ``links``, ``title``,
    ``final_url``, ``redirect``, ``note``) as a :class:`Page`."""
    text = raw.get("markdown") or raw.get("content") or raw.get("text") or ""
    final = normalize_url(str(raw["final_url"])) if raw.get("final_url") else None
    redirect = normalize_url(str(raw["redirect"]), url) if raw.get("redirect") else None
    links = raw.get("links") if isinstance(raw.get("links"), (list, tuple)) else None
    return _markdown_page(
        url,
        str(text),
        title=str(raw.get("title") or "")[:300],
        links=links,
        final=final if final != url else None,
        redirect=redirect,
        note=str(raw.get("note") or "")[:1000],
    )


def _markdown_page(
    url: str,
    text: str,
    *,
    title: str = "",
    links: Any = None,
    final: str | None = None,
    redirect: str | None = None,
    note: str = "",
) -> Page:
    """A page from a crawler's markdown: its link targets normalised, its links listed."""
    base = final or url
    found: list[str] = []

    def normalised(m: re.Match[str]) -> str:
        target = normalize_url(m.group(2), base)
        if target is None:
            return m.group(1)
        found.append(target)
        return f"[{m.group(1)}]({target})"

    markdown = _MD_LINK.sub(normalised, text.replace("\x00", ""))
    listed = [u for u in (normalize_url(str(x), base) for x in links or () if isinstance(x, str)) if u]
    all_links = list(dict.fromkeys([*found, *listed]))
    if redirect:
        return Page(url=url, status=302, redirect=redirect, note=note or f"redirects to {redirect}")
    return Page(
        url=url,
        ok=bool(markdown.strip()),
        final_url=final,
        title=title,
        markdown=markdown,
        links=all_links,
        bytes=len(text.encode("utf-8", "replace")),
        note=note or ("" if markdown.strip() else "an empty page"),
    )
