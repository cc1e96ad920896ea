"""A small web shop served on 127.0.0.1 for the crawler's tests, and scripted models that
crawl it.

:class:`Site` is a threaded ``http.server`` with a log of every request (path, start and
end times, bytes sent), an optional delay before each answer, and paths that can be held
until released (to kill a worker while a fetch is in flight). :func:`shop` is the site:
categories, products and their specification pages (the answer of the tests is on one of
those, three links from the home page), with broken links, redirects (one into a path
robots.txt disallows), a redirect loop, a huge page, a PDF and a link to another site.

The models decide from the prompt alone (steps run again after a crash, on any worker):
``bfs_research`` follows every link; ``focused_research`` follows the links whose text
names what the task is after, and first offers a wrong answer, which ``validate`` rejects.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dflow_agents import ChatMessage, ChatResponse, ToolSpec

TASK = "What warranty does the Zephyr 9 laptop come with?"
ANSWER = "3 years"
HUGE_BYTES = 40_000_000  # what the huge page would send if read to the end
ROBOTS = "User-agent: *\nDisallow: /private/\n"


@dataclass
class Hit:
    """One request the site served."""

    path: str
    start: float
    end: float = 0.0
    status: int = 0
    sent: int = 0  #: body bytes written before the answer ended (or the client went away)
    accept_encoding: str = ""  #: the request's Accept-Encoding header


Answer = Callable[[BaseHTTPRequestHandler, Hit], None]


def _send(
    handler: BaseHTTPRequestHandler,
    hit: Hit,
    status: int,
    body: bytes,
    ctype: str,
    headers: dict[str, str] | None = None,
) -> None:
    hit.status = status
    handler.send_response(status)
    handler.send_header("content-type", ctype)
    handler.send_header("content-length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)
    hit.sent = len(body)


def html(title: str, body: str) -> Answer:
    page = (
        f"<!doctype html><html><head><title>{title}</title><style>p {{ color: red }}</style>"
        f"<script>var tracking = 1;</script></head><body><nav><a href='/'>Home</a> | <a href='/about.html'>About"
        f"</a></nav><main>{body}</main><footer>Gadget Shop, all rights reserved</footer></body></html>"
    )
    data = page.encode()
    return lambda h, hit: _send(h, hit, 200, data, "text/html; charset=utf-8")


def redirect(location: str, status: int = 302) -> Answer:
    return lambda h, hit: _send(h, hit, status, b"", "text/html", {"location": location})


def status(code: int) -> Answer:
    """An empty answer with HTTP status ``code``."""
    return lambda h, hit: _send(h, hit, code, b"", "text/plain")


def missing() -> Answer:
    return lambda h, hit: _send(h, hit, 404, b"<html><body>Not here</body></html>", "text/html")


def file(ctype: str, data: bytes) -> Answer:
    return lambda h, hit: _send(h, hit, 200, data, ctype)


def encoded(data: bytes, encoding: str, ctype: str = "text/html; charset=utf-8") -> Answer:
    """``data`` as it is (compressed by the test), sent with ``Content-Encoding: encoding``."""
    return lambda h, hit: _send(h, hit, 200, data, ctype, {"content-encoding": encoding})


def text(data: str) -> Answer:
    return lambda h, hit: _send(h, hit, 200, data.encode(), "text/plain")


def huge(total: int = HUGE_BYTES) -> Answer:
    """An HTML page of ``total`` bytes, written in 64 KiB chunks until the client goes away."""

    def answer(h: BaseHTTPRequestHandler, hit: Hit) -> None:
        hit.status = 200
        h.send_response(200)
        h.send_header("content-type", "text/html")
        h.send_header("content-length", str(total))
        h.end_headers()
        head = b"<html><head><title>Huge</title></head><body><h1>A very long page</h1><p><a href='/'>Home</a></p>"
        chunk = b"<p>" + b"lorem ipsum dolor sit amet " * 2400 + b"</p>\n"
        try:
            h.wfile.write(head)
            hit.sent = len(head)
            while hit.sent < total:
                part = chunk[: total - hit.sent]
                h.wfile.write(part)
                hit.sent += len(part)
        except OSError:  # the client stopped reading
            h.close_connection = True

    return answer


def drip(data: bytes, every: float) -> Answer:
    """``data`` as text/plain, one byte each ``every`` seconds (never slow enough for a read
    timeout), until the client goes away."""

    def answer(h: BaseHTTPRequestHandler, hit: Hit) -> None:
        hit.status = 200
        h.send_response(200)
        h.send_header("content-type", "text/plain")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        try:
            for i in range(len(data)):
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
                hit.sent += 1
                time.sleep(every)
        except OSError:  # the client stopped reading
            h.close_connection = True

    return answer


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # the default (5) drops connections of a wave, which then wait a second to retry
    daemon_threads = True


@dataclass
class Site:
    """The pages of ``answers`` (path with its query -> answer) on 127.0.0.1; see the module."""

    answers: dict[str, Answer]
    delay: float = 0.0
    hits: list[Hit] = field(default_factory=list)
    held: dict[str, threading.Event] = field(default_factory=dict)
    holding: list[str] = field(default_factory=list)
    base_url: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Site:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hit = Hit(
                    self.path, time.monotonic(), accept_encoding=self.headers.get("accept-encoding", "")
                )
                with site._lock:
                    site.hits.append(hit)
                try:
                    if self.path != "/robots.txt" and site.delay:
                        time.sleep(site.delay)
                    gate = site.held.get(self.path)
                    if gate is not None and not gate.is_set():
                        site.holding.append(self.path)
                        gate.wait(60)
                    answer = site.answers.get(self.path)
                    if answer is None:
                        missing()(self, hit)
                    else:
                        answer(self, hit)
                except OSError:
                    pass
                finally:
                    hit.end = time.monotonic()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        for gate in self.held.values():
            gate.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def url(self, path: str) -> str:
        return self.base_url + path

    def paths(self) -> list[str]:
        """The paths requested, in order."""
        with self._lock:
            return [h.path for h in self.hits]

    def hit(self, path: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if h.path == path]

    def hold(self, path: str) -> threading.Event:
        """Answer ``path`` only once the returned event is set."""
        gate = self.held[path] = threading.Event()
        return gate


# -- the shop -------------------------------------------------------------------------------

CATEGORIES = {
    "laptops": ["Aster 3", "Borealis 5", "Cirrus 7", "Nimbus 2", "Stratus 4", "Zephyr 9"],
    "phones": ["Pico 1", "Quanta 6", "Rho 8", "Sigma 2", "Tau 5"],
    "tablets": ["Slate 3", "Folio 7", "Canvas 10", "Tablet Mini", "Pad Pro"],
}
LAPTOPS = "/c/laptops?ref=nav&utm_source=home"  # the canonical form of the two links to it


def slug(name: str) -> str:
    return name.lower().replace(" ", "-")


def warranty(name: str) -> str:
    return ANSWER if name == "Zephyr 9" else "2 years" if len(name) % 2 else "1 year"


def shop() -> dict[str, Answer]:
    """The shop's pages; what each request path gets."""
    pages: dict[str, Answer] = {
        "/robots.txt": text(ROBOTS),
        "/": html(
            "Gadget Shop",
            (
                "<h1>Gadget Shop</h1><p>Welcome! Browse our <a href='/c/laptops?utm_source=home&ref=nav#top'>Laptops</a>, "
                "<a href='/c/phones'>Phones</a> and <a href='/c/tablets'>Tablets</a>.</p>"
                "<ul><li><a href='/c/laptops?ref=nav&amp;utm_source=home'>All laptops</a></li>"
                "<li><a href='/about.html'>About us</a></li><li><a href='/old-about'>Our story</a></li>"
                "<li><a href='/private/staff.html'>Staff area</a></li><li><a href='/go/staff'>Staff login</a></li>"
                "<li><a href='/loop/a'>Special offers</a></li><li><a href='/files/catalog.pdf'>Catalogue (PDF)</a></li>"
                "<li><a href='/huge.html'>Every review ever written</a></li><li><a href='/missing.html'>Gift cards</a></li>"
                "<li><a href='http://elsewhere.invalid/partner?id=1'>Our partner</a></li>"
                "<li><a href='mailto:shop@example.invalid'>Write to us</a></li></ul>"
            ),
        ),
        "/about.html": html(
            "About", "<h1>About us</h1><p>A shop of gadgets since 1999.</p><a href='/'>Home</a>"
        ),
        "/old-about": redirect("/about.html", 301),
        "/go/staff": redirect("/private/payroll.html"),
        "/private/staff.html": html("Staff", "<p>Staff only. The Zephyr 9 warranty is 3 years.</p>"),
        "/private/payroll.html": html("Payroll", "<p>Secret.</p>"),
        "/loop/a": redirect("/loop/b"),
        "/loop/b": redirect("/loop/a"),
        "/files/catalog.pdf": file("application/pdf", b"%PDF-1.4 not really a pdf"),
        "/huge.html": huge(),
    }
    for category, names in CATEGORIES.items():
        items = "".join(f"<li><a href='/p/{category}/{slug(n)}.html'>{n}</a></li>" for n in names)
        path = LAPTOPS if category == "laptops" else f"/c/{category}"
        extra = (
            "<p><a href='/c/laptops/refurbished.html'>Refurbished laptops</a></p>"
            if category == "laptops"
            else ""
        )
        pages[path] = html(
            category.title(), f"<h1>{category.title()}</h1><ul>{items}</ul>{extra}<a href='/'>Home</a>"
        )
        for n in names:
            base = f"/p/{category}/{slug(n)}"
            pages[f"{base}.html"] = html(
                n,
                (
                    f"<h1>{n}</h1><p>Price: {100 + 37 * len(n)} EUR. Warranty: see the specifications.</p>"
                    f"<p><a href='{base}/specs.html#warranty'>Specifications of the {n}</a></p>"
                    f"<p><a href='/'>Home</a> <a href='/c/{category}'>More {category}</a></p>"
                ),
            )
            pages[f"{base}/specs.html"] = html(
                f"{n} specifications",
                (
                    f"<h1>{n}: specifications</h1><table><tr><th>Weight</th><td>{len(n) / 3:.1f} kg</td></tr>"
                    f"<tr><th>Warranty</th><td>Warranty: {warranty(n)}</td></tr></table><a href='/'>Home</a>"
                ),
            )
    return pages


# -- scripted models: they decide from the prompt alone -------------------------------------

_PAGE = re.compile(r"^=== Page (L\d+)(?::[^\n]*)? ===\n(.*?)(?=^=== Page |\Z)", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\[([^\]]*)\]\((L\d+)\)")


def pages_of(prompt: str) -> list[tuple[str, str]]:
    """``(id, text)`` of each page a research or validation prompt shows."""
    return [(m.group(1), m.group(2)) for m in _PAGE.finditer(prompt)]


def _user(messages: Sequence[ChatMessage]) -> str:
    return next(m.content for m in reversed(messages) if m.role == "user")


def _found(pages: list[tuple[str, str]]) -> tuple[str, str] | None:
    for pid, body in pages:
        if "Zephyr 9" in body and f"Warranty: {ANSWER}" in body:
            return pid, f"The Zephyr 9 comes with a {ANSWER.replace('years', 'year')} warranty ({ANSWER})."
    return None


def bfs_research(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Follow every link; answer when a page shows the Zephyr 9's warranty."""
    pages = pages_of(_user(messages))
    follow = [link for _, body in pages for _, link in _LINK.findall(body)]
    follow += [
        i
        for _, body in pages
        for line in body.splitlines()
        if line.startswith("Other links:")
        for i in line.split()[2:]
    ]
    hit = _found(pages)
    reply = {
        "found": hit is not None,
        "answer": hit[1] if hit else "",
        "sources": [hit[0]] if hit else [],
        "follow": follow,
        "notes": f"read {len(pages)} pages",
    }
    return ChatResponse(content="```json\n" + json.dumps(reply) + "\n```")


KEYWORDS = ("Laptops", "Zephyr 9", "Specifications")


def focused_research(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Follow links whose text names laptops, the Zephyr 9 or its specifications; on the
    product page, first offer its text as the answer (validation rejects it)."""
    prompt = _user(messages)
    pages = pages_of(prompt)
    follow = [
        link for _, body in pages for label, link in _LINK.findall(body) if any(k in label for k in KEYWORDS)
    ]
    hit = _found(pages)
    if hit is None:
        product = next((pid for pid, body in pages if body.startswith("# Zephyr 9\n")), None)
        if product is not None and "rejected" not in prompt:
            hit = (product, "Warranty: see the specifications.")
    reply = {
        "found": hit is not None,
        "answer": hit[1] if hit else "",
        "sources": [hit[0]] if hit else [],
        "follow": follow,
        "notes": "looking for the Zephyr 9",
    }
    return ChatResponse(content=json.dumps(reply))


def validate(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """Valid when the answer names the warranty and a page it comes from shows it."""
    prompt = _user(messages)
    answer = prompt.split("Candidate answer: ", 1)[1].split("\n", 1)[0]
    ok = ANSWER in answer and _found(pages_of(prompt)) is not None
    return ChatResponse(
        content=json.dumps(
            {"valid": ok, "reason": "the page shows it" if ok else "the pages do not give a number of years"}
        )
    )


def summarize(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
    """The validated answer, or that none was found."""
    prompt = _user(messages)
    if "The answer found and validated: " in prompt:
        return ChatResponse(
            content="Summary: " + prompt.split("The answer found and validated: ", 1)[1].split("\n")[0]
        )
    return ChatResponse(content="Summary: the warranty could not be found.")


def served(site: Site) -> Iterator[str]:
    """The paths of the pages requested (robots.txt aside)."""
    return (p for p in site.paths() if p != "/robots.txt")
