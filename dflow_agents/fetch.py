"""The built-in fetcher: web pages as compact markdown, with their links, for agents.

:class:`Fetcher` gets a page over HTTP (httpx) within limits: timeouts, a deadline for the
whole fetch (robots.txt too), a byte budget per page (the body is streamed raw, gzip and
deflate inflated no further than the budget, and reading stops there), redirects followed
to a limit (a loop is reported, not followed) or
handed back to the caller, content that is not HTML or text skipped with a note, and (unless
``allow_private=True``) no private, loopback, link-local or reserved address requested.
Every failure is a :class:`Page` whose ``note`` says what happened, never an exception.

:func:`html_to_markdown` turns HTML into compact markdown (html-to-markdown, in Rust, which
repairs broken HTML as browsers do: scripts, styles, navigation and forms dropped,
whitespace collapsed; of a long page only the part that gives ``max_chars`` is converted)
and lists its links, absolute and normalised by :func:`normalize_url` (w3lib's ``canonicalize_url``; fragment,
default port, user name and password dropped); both are written in
``dflow_agents._markdown`` and imported from here, as :class:`Robots` (robots.txt rules,
read with the standard library's ``urllib.robotparser``) is from ``dflow_agents._robots``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from ._fetch_guard import ACCEPT_ENCODING, BodyError, read_body, refusal
from ._markdown import MAX_URL, html_to_markdown, normalize_url, origin_of
from ._robots import USER_AGENT, Robots
from .tools import Tool

__all__ = [  # noqa: RUF022 - plain sorted(), as tests/test_exports.py checks
    "Fetcher",
    "Page",
    "Robots",
    "USER_AGENT",
    "html_to_markdown",
    "normalize_url",
]


_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_HTML = ("text/html", "application/xhtml+xml")
_POOLS, _POOL = 8, 8  # HTTP clients per event loop, connections per client
_THREAD_ABOVE = 128 * 1024  # HTML bodies larger than this are converted off the event loop


class Page(BaseModel):
    """What fetching one URL gave: the page as markdown and its links, or why not.

    ``ok`` is True when the body was read (HTML or text). Otherwise ``note`` says what
    happened (an HTTP error, a redirect, content that is not HTML, a timeout...); for a
    redirect the fetcher did not follow, ``redirect`` is where it points.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str  #: the URL asked for (normalised)
    ok: bool = False
    status: int = 0  #: the HTTP status, 0 when there was no response
    final_url: str | None = None  #: where redirects led, when followed
    redirect: str | None = None  #: where a redirect not followed points (normalised)
    content_type: str = ""
    title: str = ""
    markdown: str = ""
    links: list[str] = Field(default_factory=list)  #: of the markdown kept: absolute, normalised, once each
    bytes: int = 0  #: body bytes read
    truncated: bool = False  #: the body was longer than the byte budget, or the text than ``max_chars``
    note: str = ""

    def observation(self) -> str:
        """The page as a model reads it: title, markdown, then its links (or the note)."""
        where = self.final_url or self.url
        if not self.ok:
            return f"{where}: {self.note or 'nothing could be read'}"
        lines = [f"# {self.title}"] if self.title else []
        lines += [f"({where})", "", self.markdown]
        if self.note:
            lines += ["", f"Note: {self.note}"]
        if self.links:
            lines += ["", "Links:", *(f"- {u}" for u in self.links)]
        return "\n".join(lines).strip()


class Fetcher:
    """Fetches pages over HTTP as :class:`Page` objects. See the module's docstring.

    Args:
        max_bytes: body bytes read per page; reading stops there (``truncated``).
        max_chars: characters of markdown kept per page.
        max_links: links listed per page.
        timeout: seconds for connecting, and between bytes received.
        deadline: seconds for a whole fetch, redirects included.
        max_redirects: redirects followed (when following) before giving up.
        user_agent: the ``User-Agent`` header, also the name robots.txt rules are read for.
        headers: more request headers.
        trust_env: use the proxy settings of the environment.
        allow_private: also fetch private, loopback, link-local and reserved addresses (a
            site on this machine or its network). By default they are refused, literal or
            resolved from a host name (resolved before each request: DNS rebinding gets
            past this check; see ``dflow_agents._fetch_guard``), with a note saying so.

    Bodies encoded with gzip or deflate are inflated no further than ``max_bytes``; other
    encodings (``br``, ``zstd``) are not asked for, and refused with a note when sent.
    One HTTP client per event loop; ``await fetcher.aclose()`` closes the running loop's.
    Declare a fetcher ``dflow.shared`` when a flow captures it.
    """

    def __init__(
        self,
        *,
        max_bytes: int = 2_000_000,
        max_chars: int = 40_000,
        max_links: int = 1_000,
        timeout: float = 10.0,
        deadline: float = 30.0,
        max_redirects: int = 5,
        user_agent: str = USER_AGENT,
        headers: dict[str, str] | None = None,
        trust_env: bool = True,
        allow_private: bool = False,
    ) -> None:
        for name, value in (("max_bytes", max_bytes), ("max_chars", max_chars), ("max_links", max_links)):
            _count(name, value, 1)
        _count("max_redirects", max_redirects, 0)
        _seconds("timeout", timeout)
        _seconds("deadline", deadline)
        if not isinstance(user_agent, str) or not user_agent.strip():
            raise ValueError(f"user_agent must be a non-empty str, got {user_agent!r}")
        if not isinstance(allow_private, bool):
            raise TypeError(f"allow_private must be a bool, got {allow_private!r}")
        self.max_bytes = max_bytes
        self.max_chars = max_chars
        self.max_links = max_links
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self.max_redirects = max_redirects
        self.user_agent = user_agent.strip()
        self.headers = {
            "user-agent": self.user_agent,
            "accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
            "accept-encoding": ACCEPT_ENCODING,
            **(headers or {}),
        }
        self.trust_env = trust_env
        self.allow_private = allow_private
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[httpx.AsyncClient]] = (
            weakref.WeakKeyDictionary()
        )
        self._turn = 0

    def __repr__(self) -> str:
        private = ", allow_private=True" if self.allow_private else ""
        return f"Fetcher(max_bytes={self.max_bytes}, timeout={self.timeout:g}{private})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_clients"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clients = weakref.WeakKeyDictionary()

    def _client(self) -> httpx.AsyncClient:
        """One of the running loop's clients, in turn. Several small pools rather than one
        large one: httpx's pool scans every connection for each request it schedules, so
        one pool serving many requests at once costs time that grows with their number."""
        loop = asyncio.get_running_loop()
        clients = self._clients.get(loop)
        if clients is None or clients[0].is_closed:
            limits = httpx.Limits(max_connections=_POOL, max_keepalive_connections=_POOL)
            clients = self._clients[loop] = [
                httpx.AsyncClient(
                    headers=self.headers,
                    timeout=httpx.Timeout(self.timeout),
                    follow_redirects=False,
                    limits=limits,
                    trust_env=self.trust_env,
                )
                for _ in range(_POOLS)
            ]
        self._turn = (self._turn + 1) % _POOLS
        return clients[self._turn]

    async def aclose(self) -> None:
        """Close the HTTP clients of the running event loop (new ones open on next use)."""
        for client in self._clients.pop(asyncio.get_running_loop(), None) or ():
            await client.aclose()

    # -- fetching ------------------------------------------------------------------------

    async def fetch(
        self,
        url: str,
        *,
        follow_redirects: bool = True,
        allowed: Callable[[str], bool | Awaitable[bool]] | None = None,
        max_bytes: int | None = None,
    ) -> Page:
        """The page at ``url``. With ``follow_redirects=False`` a redirect is returned as a
        page with ``redirect`` set; ``allowed(url)`` is asked before each request (robots.txt
        rules) and a refused URL is not requested; ``max_bytes`` lowers the fetcher's byte
        budget for this page (a crawl's budget running out). Never raises for what the web does."""
        start = normalize_url(url) if isinstance(url, str) else None
        if start is None:
            shown = repr(url)[:200]
            return Page(
                url=str(url)[:MAX_URL],
                note=f"not fetched: {shown} is not an http(s) URL of at most {MAX_URL} characters",
            )
        budget = self.max_bytes
        if max_bytes is not None:
            if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
                raise ValueError(f"max_bytes must be an int >= 1, got {max_bytes!r}")
            budget = min(budget, max_bytes)
        try:
            return await asyncio.wait_for(
                self._fetch(start, follow_redirects, allowed, budget), self.deadline
            )
        except asyncio.TimeoutError:
            return Page(url=start, note=f"gave up after {self.deadline:g} s (the deadline of a fetch)")
        except Exception as exc:
            return Page(url=start, note=f"the fetch failed: {type(exc).__name__}: {str(exc)[:300]}")

    async def _fetch(
        self, start: str, follow: bool, allowed: Callable[[str], bool | Awaitable[bool]] | None, budget: int
    ) -> Page:
        client = self._client()
        current = start
        chain = [start]
        for _ in range(self.max_redirects + 1):
            refused = None if self.allow_private else await refusal(current)
            if refused is not None:
                return Page(url=start, final_url=_other(current, start), note=refused)
            if allowed is not None:
                verdict = allowed(current)
                if not isinstance(verdict, bool):
                    verdict = await verdict
                if not verdict:
                    return Page(
                        url=start,
                        final_url=_other(current, start),
                        note=f"not fetched: robots.txt disallows {current}",
                    )
            try:
                async with client.stream("GET", current) as response:
                    location = response.headers.get("location")
                    if response.status_code in _REDIRECTS and location:
                        target = normalize_url(location, current)
                        if target is None:
                            return Page(
                                url=start,
                                status=response.status_code,
                                note=f"HTTP {response.status_code}: a redirect to an unusable location "
                                f"{location[:200]!r}",
                            )
                        if not follow:
                            return Page(
                                url=start,
                                status=response.status_code,
                                redirect=target,
                                note=f"HTTP {response.status_code}: redirects to {target}",
                            )
                        if target in chain:
                            return Page(
                                url=start,
                                status=response.status_code,
                                note="a redirect loop: " + " -> ".join([*chain, target]),
                            )
                        chain.append(target)
                        current = target
                        continue
                    return await self._read(start, current, response, budget)
            except httpx.TimeoutException as exc:
                return Page(
                    url=start,
                    final_url=_other(current, start),
                    note=f"timed out after {self.timeout:g} s ({type(exc).__name__})",
                )
            except httpx.HTTPError as exc:
                return Page(
                    url=start,
                    final_url=_other(current, start),
                    note=f"the request failed: {type(exc).__name__}: {str(exc)[:300]}",
                )
        return Page(url=start, note=f"more than {self.max_redirects} redirects: " + " -> ".join(chain))

    async def _read(self, start: str, current: str, response: httpx.Response, budget: int) -> Page:
        """The page ``response`` answers with: its body read within ``budget`` bytes and
        turned into markdown, or a note saying why not."""
        status = response.status_code
        ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
        page = Page(url=start, final_url=_other(current, start), status=status, content_type=ctype)
        if status >= 400 or status < 200:
            return _noted(page, f"HTTP {status} {response.reason_phrase}".strip())
        if ctype and not ctype.startswith(_HTML) and ctype != "text/plain":
            return _noted(page, f"skipped: {ctype} is not HTML or text")
        try:  # inflated (gzip, deflate) bytes count against the budget
            body, truncated = await read_body(response, budget)
        except BodyError as exc:
            return _noted(page, f"not read: {exc}")
        notes = [f"the body was cut at the byte budget of {budget} bytes"] if truncated else []
        page = page.model_copy(update={"ok": True, "bytes": len(body), "truncated": truncated})
        if ctype == "text/plain" or (not ctype and not _looks_like_html(body)):
            return self._text_page(page, body, response.charset_encoding, notes)
        return await self._html_page(page, body, response.charset_encoding, notes)

    def _text_page(self, page: Page, body: bytes, charset: str | None, notes: list[str]) -> Page:
        text = _text(body, charset).replace("\x00", "")
        cut = len(text) > self.max_chars
        if cut:
            notes.append(f"the text was cut at {self.max_chars} characters")
        update = {"content_type": page.content_type or "text/plain", "markdown": text[: self.max_chars]}
        return page.model_copy(
            update={**update, "truncated": page.truncated or cut, "note": "; ".join(notes)}
        )

    async def _html_page(self, page: Page, body: bytes, charset: str | None, notes: list[str]) -> Page:
        convert = (body, page.final_url or page.url, charset)
        try:
            if len(body) > _THREAD_ABOVE:  # the loop's other tasks get their turns meanwhile
                title, markdown, links, cut = await asyncio.to_thread(self._convert, *convert)
            else:
                title, markdown, links, cut = self._convert(*convert)
        except ValueError as exc:
            return _noted(page.model_copy(update={"ok": False}), f"not read: {exc}")
        if cut:
            notes.append(f"the text was cut at {self.max_chars} characters")
        return page.model_copy(
            update={
                "content_type": page.content_type or "text/html",
                "title": title,
                "markdown": markdown,
                "links": links,
                "truncated": page.truncated or cut,
                "note": "; ".join(notes),
            }
        )

    def _convert(self, body: bytes, url: str, encoding: str | None) -> tuple[str, str, list[str], bool]:
        return html_to_markdown(
            body, url, encoding=encoding, max_chars=self.max_chars, max_links=self.max_links
        )

    # -- robots.txt ----------------------------------------------------------------------

    async def robots(self, origin: str) -> Robots:
        """The robots.txt rules of ``origin`` (``scheme://host[:port]``), fetched now,
        following up to five redirects and reading at most 512 KiB, all within the fetcher's
        ``deadline`` (a robots.txt sent a byte at a time gives up there: the site is then
        :attr:`~Robots.unreachable`).

        An origin this fetcher may not reach (a private address without ``allow_private``)
        is not asked: its rules are those of a missing robots.txt (everything allowed), as
        the fetcher refuses its pages anyway, with a note that says why."""
        url = normalize_url(origin.rstrip("/") + "/robots.txt") if isinstance(origin, str) else None
        if url is None:
            return Robots(0, note=f"{str(origin)[:200]!r} is not an http(s) origin")
        try:
            return await asyncio.wait_for(self._robots(url), self.deadline)
        except asyncio.TimeoutError:
            return Robots(
                0, note=f"{url} gave no whole answer within {self.deadline:g} s (the deadline of a fetch)"
            )

    async def _robots(self, url: str) -> Robots:
        client = self._client()
        try:
            for _ in range(6):
                if not self.allow_private and await refusal(url) is not None:
                    return Robots(404, note=f"{url} was not asked: the fetcher keeps to public addresses")
                async with client.stream("GET", url) as response:
                    location = response.headers.get("location")
                    if response.status_code in _REDIRECTS and location:
                        url = normalize_url(location, url) or ""
                        if not url:
                            return Robots(
                                0, note=f"robots.txt redirects to an unusable location {location[:200]!r}"
                            )
                        continue
                    if response.status_code >= 300:
                        return Robots(
                            response.status_code, note=f"{url} answered HTTP {response.status_code}"
                        )
                    body, _ = await read_body(response, 512 * 1024)
                    return Robots(response.status_code, body.decode("utf-8", errors="replace"))
        except httpx.TimeoutException as exc:
            return Robots(0, note=f"{url} timed out after {self.timeout:g} s ({type(exc).__name__})")
        except (httpx.HTTPError, BodyError) as exc:
            return Robots(0, note=f"{url} could not be read: {type(exc).__name__}: {str(exc)[:300]}")
        return Robots(0, note=f"{url}: more than five redirects")

    # -- as a tool -----------------------------------------------------------------------

    def as_tool(self, name: str = "fetch_page", *, robots: bool = True) -> Tool:
        """This fetcher as a tool a model calls with a ``url``: it answers with the page's
        markdown and links (redirects followed; robots.txt honoured unless ``robots=False``,
        its rules kept per site for ten minutes in this process)."""
        cache: dict[str, tuple[float, Robots]] = {}

        async def allowed(url: str) -> bool:
            origin = origin_of(url)
            loop = asyncio.get_running_loop()
            hit = cache.get(origin)
            if hit is None or loop.time() - hit[0] > 600:
                hit = cache[origin] = (loop.time(), await self.robots(origin))
                if len(cache) > 1000:
                    cache.pop(next(iter(cache)))
            return hit[1].allows(url, self.user_agent)

        async def fetch_page(url: str) -> str:
            """Fetch a web page and read it as markdown, with the links it holds.

            Args:
                url: the http(s) URL of the page
            """
            page = await self.fetch(url, allowed=allowed if robots else None)
            return page.observation()

        return Tool(fetch_page, name=name)


def _noted(page: Page, note: str) -> Page:
    return page.model_copy(update={"note": note})


def _count(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _seconds(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def _other(url: str, start: str) -> str | None:
    return url if url != start else None


def _text(body: bytes, charset: str | None) -> str:
    """``body`` decoded as ``charset`` says, or as UTF-8 when Python has no such text codec."""
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except (LookupError, UnicodeError):  # 'bogus', 'base64', 'idna' (no errors="replace")...
        return body.decode("utf-8", errors="replace")


def _looks_like_html(body: bytes | bytearray) -> bool:
    return bytes(body[:512]).lstrip().startswith(b"<")
