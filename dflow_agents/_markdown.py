"""HTML as compact markdown with its links, and URLs in one canonical form.

:func:`html_to_markdown` turns HTML into compact markdown with html-to-markdown (a converter
written in Rust whose parser repairs broken HTML as browsers do): scripts, styles,
navigation, footers, asides and forms dropped, images too, whitespace collapsed. Only as
much of a long page is converted as gives the characters kept: the first part of the HTML,
larger each time until its markdown passes ``max_chars`` (or the page ends). Its links are
made absolute and normalised by :func:`normalize_url` (w3lib's ``canonicalize_url``;
fragment, default port, user name and password dropped). No I/O: :mod:`dflow_agents.fetch`
fetches, and its public names are imported from there.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

from html_to_markdown import (
    ConversionError,
    ConversionOptions,
    InvalidInputError,
    PreprocessingOptions,
    convert,
)
from w3lib.encoding import html_body_declared_encoding, read_bom, to_unicode
from w3lib.url import canonicalize_url

__all__ = ["MAX_URL", "html_to_markdown", "normalize_url", "origin_of", "trim_open_link"]

MAX_URL = 2048  #: longer URLs are not fetched nor listed
_DEFAULT_PORT = {"http": 80, "https": 443}

#: What a page holds that is not its text: dropped with everything inside.
_NOISE = [
    "script",
    "style",
    "noscript",
    "template",
    "nav",
    "footer",
    "aside",
    "form",
    "iframe",
    "svg",
    "canvas",
    "button",
    "select",
    "textarea",
    "input",
    '[role="navigation"]',
    '[role="banner"]',
    '[role="search"]',
]
_OPTIONS = ConversionOptions(
    heading_style="atx",
    bullets="*",
    autolinks=False,
    skip_images=True,
    extract_metadata=False,  # the title and <base> are read by _Head: no front matter in the text
    compact_tables=True,  # no padding: a table's text does not depend on rows beyond a cut
    preprocessing=PreprocessingOptions(
        enabled=False
    ),  # its heuristics drop lists of links (tables of contents)
    exclude_selectors=_NOISE,
)
_FIRST_PART = 64 * 1024  # characters of HTML converted first (at least; 8 per character kept)
#: Closes what a page or a part of it cut short (at a byte budget, or here) may leave open,
#: whose text would otherwise read as the page's; after a whole page, nothing.
_CLOSE = "</script></style></textarea></noscript></template></title></xmp>"
_HEAD_CHARS = 64 * 1024  # characters of HTML searched for the title and <base href>

_BODY = re.compile(r"<body[\s>/]", re.IGNORECASE)
_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_TRAILING = re.compile(r"[ \t]+\n")
_SPACES = re.compile(r"[ \t\u00a0]{2,}")
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")
_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]+")  # no text; the converter refuses many

# A link as the converter writes it, ``[text](target "title")``: the text may hold escapes
# and brackets nested three deep, the target is ``<...>`` or has balanced parentheses. Code
# spans come first, so that ``[x](y)`` written inside one stays text.
_CHAR = r"(?:\\.|[^\[\]\\])"
_NEST1 = rf"(?:{_CHAR}|\[{_CHAR}*\])"
_NEST2 = rf"(?:{_CHAR}|\[{_NEST1}*\])"
_NEST3 = rf"(?:{_CHAR}|\[{_NEST2}*\])"
_LINK_OR_CODE = re.compile(
    r"``(?:[^`\n]|`(?!`))*``|`[^`\n]*`"
    rf"|\[(?P<text>{_NEST3}*)\]"
    r"\((?P<target><(?:\\.|[^<>\\\n])*>|(?:\\.|[^\s()\\]|\((?:\\.|[^\s()\\])*\))*)"
    r'(?:[ \t]+"(?:\\.|[^"\\])*")?\)'
)


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


def html_to_markdown(
    html: str | bytes,
    url: str,
    *,
    encoding: str | None = None,
    max_chars: int = 40_000,
    max_links: int = 1_000,
) -> tuple[str, str, list[str], bool]:
    """HTML as ``(title, markdown, links, truncated)``.

    Scripts, styles, navigation, footers, asides and forms are dropped, images too; links
    become absolute, normalised URLs (relative to ``<base href>`` or ``url``); a link that is
    not http(s) keeps its text only. ``links`` are those of the markdown, once each in page
    order, at most ``max_links`` (a link beyond keeps its text only). Blank lines and runs of
    spaces are collapsed; the markdown is cut at ``max_chars`` (``truncated`` then), and of a
    long page only the part that gives them is converted.
    """
    text = _decoded(html, encoding)
    head = _Head(url)
    head.read(text)
    size = max(_FIRST_PART, 8 * max_chars)
    while True:
        whole = size >= len(text)
        converted = _converted((text if whole else text[:size]) + _CLOSE)
        links = _Links(head.base, max_links)
        markdown = links.rewrite(_tidy(converted), max_chars)
        if whole or len(markdown) > max_chars:
            break
        size *= 4  # the part gave less than is kept: convert a larger one
    if len(markdown) <= max_chars:
        return head.title, markdown, links.found, False
    kept = trim_open_link(markdown[:max_chars]).rstrip()
    return head.title, kept + "\n\n[... cut]", links.within(kept), True


def trim_open_link(markdown: str) -> str:
    """``markdown`` cut short, without its last link when the cut fell in its target (the
    start of a URL is no link, and not what a model should read)."""
    opened = markdown.rfind("](")
    if opened != -1 and ")" not in markdown[opened:]:
        bracket = markdown.rfind("[", 0, opened)
        markdown = markdown[: bracket if bracket != -1 else opened]
    return markdown


class _Head(HTMLParser):
    """The title and ``<base href>`` of a page: the first of each before ``<body>``, in its
    first 64 KiB (the standard library's tolerant parser)."""

    def __init__(self, url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.url = url
        self.base = url
        self.title = ""
        self._title: list[str] | None = None
        self._done = False

    def read(self, text: str) -> None:
        body = _BODY.search(text, 0, _HEAD_CHARS)  # what comes after is not searched
        end = body.start() if body else min(len(text), _HEAD_CHARS)
        for start in range(0, end, 8192):
            if self._done:
                break
            self.feed(text[start : min(start + 8192, end)])

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title" and not self.title:
            self._title = []
        elif tag == "base" and self.base == self.url:
            href = dict(attrs).get("href")
            self.base = (normalize_url(href, self.url) if href else None) or self.url
        elif tag == "body":
            self._done = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._title is not None:
            self.title = _SPACES.sub(" ", " ".join("".join(self._title).split()))[:300]
            self._title = None

    def handle_data(self, data: str) -> None:
        if self._title is not None:
            self._title.append(data)


class _Links:
    """Rewrites the links of converted markdown: targets absolute and normalised (each
    target resolved once), those that are not http(s), or beyond ``max_links``, as text."""

    def __init__(self, base: str, max_links: int) -> None:
        self.base = base
        self.max_links = max_links
        self.found: list[str] = []
        self._known: set[str] = set()
        self._resolved: dict[str, str | None] = {}

    def rewrite(self, markdown: str, enough: int) -> str:
        """``markdown`` with its links rewritten, up to a little past ``enough`` characters
        (the rest is cut anyway)."""
        out: list[str] = []
        size = at = 0
        for found in _LINK_OR_CODE.finditer(markdown):
            if found.group("target") is None:  # a code span
                continue
            out.append(markdown[at : found.start()])
            out.append(self._link(found.group("text"), found.group("target")))
            size += len(out[-2]) + len(out[-1])
            at = found.end()
            if size > enough:
                return "".join(out)
        out.append(markdown[at:])
        return "".join(out)

    def within(self, markdown: str) -> list[str]:
        """The links found that ``markdown`` (a part of what was rewritten) holds."""
        return [u for u in self.found if f"]({u})" in markdown]

    def _link(self, text: str, target: str) -> str:
        if target.startswith("<"):
            target = target[1:-1]
        key = target.split("#", 1)[0]
        if key not in self._resolved:
            self._resolved[key] = normalize_url(_ESCAPED.sub(r"\1", target), self.base)
        url = self._resolved[key]
        if url is None or (url not in self._known and len(self.found) >= self.max_links):
            return text  # not a link the reader can follow: its text stays
        if url not in self._known:
            self._known.add(url)
            self.found.append(url)
        return f"[{text}]({url})"


def _converted(html: str) -> str:
    """``html`` as markdown; control characters dropped when there are enough of them for
    the converter to take the page for binary data. ``ValueError`` when it cannot be read."""
    try:
        try:
            return convert(html, _OPTIONS).content or ""
        except InvalidInputError:
            return convert(_CONTROLS.sub("", html), _OPTIONS).content or ""
    except ConversionError as exc:
        raise ValueError(f"the HTML could not be converted to markdown: {str(exc)[:300]}") from exc


def _tidy(markdown: str) -> str:
    markdown = _SPACES.sub(" ", _TRAILING.sub("\n", markdown.replace("\x00", "")))
    return _BLANKS.sub("\n\n", markdown).strip()


def _decoded(html: str | bytes, encoding: str | None) -> str:
    """``html`` as text: decoded as ``encoding`` says when Python can, else as UTF-8 when it
    is, else as its byte order mark or ``<meta charset>`` says (w3lib), else as windows-1252."""
    if isinstance(html, str):
        return html
    if encoding:
        try:
            return html.decode(encoding, errors="replace")
        except (LookupError, UnicodeError):  # an encoding Python does not know, or not a text one
            pass
    try:
        return html.decode("utf-8")
    except UnicodeDecodeError:
        pass
    found, bom = read_bom(html)  # (w3lib's own guess, html_to_unicode's, changes between releases)
    if found is not None and bom is not None:
        return to_unicode(html[len(bom) :], found)
    try:
        return to_unicode(html, html_body_declared_encoding(html) or "cp1252")
    except (LookupError, UnicodeError):  # a declared encoding Python does not know, or not a text one
        return to_unicode(html, "cp1252")
