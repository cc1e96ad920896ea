"""HTML as compact markdown with its links, and URLs in one canonical form.

:func:`html_to_markdown` turns HTML into compact markdown (beautifulsoup4 and markdownify:
scripts, styles, navigation and forms dropped, whitespace collapsed) and lists its links,
absolute and normalised by :func:`normalize_url` (w3lib's ``canonicalize_url``; fragment,
default port, user name and password dropped). No I/O: :mod:`dflow_agents.fetch` fetches,
and its public names are imported from there.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from bs4 import BeautifulSoup
from markdownify import MarkdownConverter
from w3lib.url import canonicalize_url

__all__ = ["MAX_URL", "html_to_markdown", "normalize_url", "origin_of", "trim_open_link"]

MAX_URL = 2048  #: longer URLs are not fetched nor listed
_DEFAULT_PORT = {"http": 80, "https": 443}
_NOISE = frozenset(("script", "style", "noscript", "template", "nav", "footer", "aside", "form", "iframe", "svg",
                    "canvas", "button", "select", "textarea", "input", "head"))
_NOISE_ROLES = frozenset(("navigation", "banner", "search"))


def normalize_url(url: str, base: str | None = None) -> str | None:
    """``url`` (resolved against ``base``) in one canonical form, or ``None`` when it is not an
    http(s) URL with a host, or is longer than 2048 characters.

    Canonical: scheme and host in lower case, the default port, the fragment and any user
    name and password (``user:pw@``) dropped, the path resolved (``a/../b``), percent-encoding
    made uniform and query arguments sorted (w3lib's ``canonicalize_url``), so two spellings
    of one page compare equal (and a page never makes the fetcher send credentials it chose).
    """
    if not isinstance(url, str):
        return None
    url = url.strip()
    if not url or len(url) > MAX_URL:
        return None
    try:
        absolute = urljoin(base, url) if base else url
        parts = urlsplit(absolute)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORT or not parts.hostname:
            return None
        canon = canonicalize_url(absolute, keep_fragments=False)
        parts = urlsplit(canon)
        port = parts.port
    except ValueError:  # a bad port, an unclosed IPv6 bracket...
        return None
    if port == _DEFAULT_PORT[scheme] or "@" in parts.netloc:
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if port is not None and port != _DEFAULT_PORT[scheme]:
            netloc = f"{netloc}:{port}"
        canon = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    return canon if len(canon) <= MAX_URL else None


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of an URL (as :func:`normalize_url` writes it)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


class _Converter(MarkdownConverter):
    """markdownify with compact settings: ATX headings, no images, links as written."""

    def __init__(self) -> None:
        super().__init__(heading_style="ATX", bullets="*", autolinks=False, strip=["img"],
                         escape_underscores=False, escape_asterisks=False, escape_misc=False)


_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_TRAILING = re.compile(r"[ \t]+\n")
_SPACES = re.compile(r"[ \t\u00a0]{2,}")


def html_to_markdown(
    html: str | bytes,
    url: str,
    *,
    encoding: str | None = None,
    max_chars: int = 40_000,
    max_links: int = 1_000,
) -> tuple[str, str, list[str], bool]:
    """HTML as ``(title, markdown, links, truncated)``.

    Scripts, styles, navigation, footers, asides and forms are dropped, images too (their
    text is empty); links become absolute, normalised URLs (relative to ``<base href>`` or
    ``url``), listed once each in page order (at most ``max_links``); blank lines and runs of
    spaces are collapsed; the markdown is cut at ``max_chars`` (``truncated`` then).
    """
    soup = BeautifulSoup(_decoded(html, encoding), "html.parser")
    tags = soup.find_all(True)  # one walk (bs4's filtered searches cost more than the walk itself)
    title, base = "", url
    for tag in tags:
        if tag.name == "title" and not title:
            title = _SPACES.sub(" ", tag.get_text(" ", strip=True))[:300]
        elif tag.name == "base" and tag.get("href") is not None and base == url:
            base = normalize_url(str(tag.get("href")), url) or url
        elif tag.name == "body":
            break
    links: list[str] = []
    seen: set[str] = set()
    noise: list[Any] = []
    inside: set[int] = set()  # the tags within noise (their links are not the page's)
    for tag in tags:
        if id(tag) in inside:
            continue
        if tag.name in _NOISE or tag.get("role") in _NOISE_ROLES:
            noise.append(tag)
            inside.update(map(id, tag.find_all(True)))
        elif tag.name == "a":
            href = tag.get("href")
            target = normalize_url(str(href), base) if href is not None else None
            if target is None or (target not in seen and len(links) >= max_links):
                tag.unwrap()  # not a link the reader can follow: its text stays
                continue
            tag.attrs = {"href": target}
            if target not in seen:
                seen.add(target)
                links.append(target)
    for tag in noise:
        tag.decompose()
    markdown = _Converter().convert_soup(soup).replace("\x00", "")
    markdown = _SPACES.sub(" ", _TRAILING.sub("\n", markdown))
    markdown = _BLANKS.sub("\n\n", markdown).strip()
    truncated = len(markdown) > max_chars
    if truncated:
        markdown = trim_open_link(markdown[:max_chars]).rstrip() + "\n\n[... cut]"
    return title, markdown, links, truncated


def trim_open_link(markdown: str) -> str:
    """``markdown`` cut short, without its last link when the cut fell in its target (the
    start of a URL is no link, and not what a model should read)."""
    opened = markdown.rfind("](")
    if opened != -1 and ")" not in markdown[opened:]:
        bracket = markdown.rfind("[", 0, opened)
        markdown = markdown[: bracket if bracket != -1 else opened]
    return markdown


def _decoded(html: str | bytes, encoding: str | None) -> str | bytes:
    """``html`` as text when its encoding is known (or it is UTF-8); bytes for bs4 to detect."""
    if isinstance(html, str):
        return html
    if encoding:
        try:
            return html.decode(encoding, errors="replace")
        except (LookupError, UnicodeError):  # an encoding Python does not know, or not a text one
            return html
    try:
        return html.decode("utf-8")
    except UnicodeDecodeError:
        return html
