"""What the deep crawler follows, lists and requests, over a site the tests serve on
127.0.0.1 (also reachable as ``localhost``: another host name, so another site): ids a
model invents and raw URLs, links that are not http(s) or lead to another host, spellings
of one URL, user names in links, robots.txt behind spellings and redirects, off-site
redirects, pages with thousands of links; and what the fetcher refuses to request.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import dflow
from dflow_agents import AgentStatus
from dflow_agents.crawler import CrawlFunctions, DeepCrawlerAgent
from dflow_agents.fetch import Fetcher


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


Route = Callable[[], "tuple[int, dict[str, str], bytes]"]


@dataclass
class Site:
    """A site on 127.0.0.1 (also reachable as 'localhost': another host name, another site)."""

    routes: dict[str, Route]
    hits: list[tuple[str, str, int]] = field(default_factory=list)  # (Host header, path, body bytes sent)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, host: str | None = None) -> list[str]:
        with self.lock:
            return [p for h, p, _ in self.hits if host is None or h.startswith(host)]


def html(text: str, status: int = 200) -> Route:
    return lambda: (status, {"Content-Type": "text/html; charset=utf-8"}, text.encode())


def raw_html(body: bytes) -> Route:
    return lambda: (200, {"Content-Type": "text/html"}, body)


def redirect(to: str) -> Route:
    return lambda: (302, {"Location": to}, b"")


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site(routes={})

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            route = s.routes.get(self.path)
            status, headers, body = route() if route else (404, {"Content-Type": "text/plain"}, b"not here")
            with s.lock:
                s.hits.append((self.headers.get("Host", ""), self.path, len(body)))
            self.close_connection = True  # no connection outlives its request (none is left to the pools)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except OSError:  # the fetcher stopped reading (a byte budget)
                pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass

    server = Server(("127.0.0.1", 0), Handler)
    s.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield s
    finally:
        server.shutdown()
        server.server_close()


def fetch_once(fetcher: Fetcher, url: str) -> Any:
    """``fetcher.fetch(url)`` on a loop of its own, whose HTTP clients are closed after."""

    async def go() -> Any:
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()

    return asyncio.run(go())


def crawl(site: Site, research: Callable[[Mapping[str, Any]], Any], **options: Any) -> Any:
    options.setdefault("crawler", Fetcher(trust_env=False, allow_private=True))
    functions = CrawlFunctions(
        research=research, validation=lambda inputs: False, summary=lambda inputs: "the summary"
    )
    agent = DeepCrawlerAgent(unique("links-crawler"), functions=functions, **options)
    return agent.run("find it", url=site.base + "/").result(60)


def follow_everything(
    seen: list[Mapping[str, Any]] | None = None, extra: Sequence[str] = ()
) -> Callable[..., Any]:
    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if seen is not None:
            seen.append(inputs)
        ids = [i for page in inputs["pages"] for i in page.get("links", [])]
        return {"found": False, "follow": [*ids, *extra]}

    return research


def test_ids_the_model_invents_and_raw_urls_are_never_fetched(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/"] = html("<title>home</title><a href='/known'>known</a>")
    site.routes["/known"] = html("<p>known</p>")
    site.routes["/secret"] = html("<p>secret</p>")
    invented = [
        "L999999",
        "L2",
        "L-1",
        "L1.5",
        "L1e3",
        "l 1",
        "L0",
        "[L0]",
        f"{site.base}/secret",
        "/secret",
        "secret",
        "http://localhost/secret",
        "javascript:alert(1)",
        "L" + "9" * 50,
    ]
    result = crawl(site, follow_everything(extra=invented))
    assert result.status is AgentStatus.TERMINATED
    assert sorted(site.paths()) == ["/", "/known", "/robots.txt"], site.paths()
    assert result.answer == "the summary"


def test_links_that_are_not_http_or_lead_to_another_host_are_neither_listed_nor_fetched(
    runtime: dflow.Runtime, site: Site
) -> None:
    port = site.port
    hrefs = [
        "file:///etc/passwd",
        "ftp://127.0.0.1/x",
        "javascript:fetch('/evil')",
        "data:text/html,<b>x</b>",
        "mailto:a@b.example",
        "gopher://127.0.0.1:6379/_INFO",
        "ws://127.0.0.1/x",
        f"http://localhost:{port}/",
        f"http://localhost:{port}/offsite",
        f"http://[::1]:{port}/v6",
        "//localhost/x",
        "/ok",
    ]
    site.routes["/"] = html("".join(f'<a href="{h}">link {i}</a> ' for i, h in enumerate(hrefs)))
    site.routes["/ok"] = html("<p>ok</p>")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    home = seen[0]["pages"][0]
    assert home["links"] == ["L1"], home  # only /ok
    for i in range(len(hrefs) - 1):
        assert f"link {i}" in home["content"], i  # the text of a link not followed stays
    assert "[link 11](L1)" in home["content"]
    assert sorted(site.paths()) == ["/", "/ok", "/robots.txt"]
    assert site.paths("localhost") == [] and site.paths("[::1]") == []


def test_spellings_of_one_url_are_one_id_and_one_fetch(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    spellings = [
        "/page",
        "/page#top",
        "/./page",
        "/x/../page",
        "/x/./../page",
        f"HTTP://127.0.0.1:{port}/page",
        "/%70age",
        f"http://127.0.0.1:{port}/page?",
        "page",
        "/page#",
        f"//127.0.0.1:{port}/page",
    ]
    site.routes["/"] = html("".join(f"<a href='{h}'>s{i}</a> " for i, h in enumerate(spellings)))
    site.routes["/page"] = html("<p>the page</p>")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    assert seen[0]["pages"][0]["links"] == ["L1"]
    assert Counter(site.paths())["/page"] == 1


def test_userinfo_does_not_make_a_second_fetch_of_a_page(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    site.routes["/"] = html(f"<a href='/page'>a</a> <a href='http://user:pw@127.0.0.1:{port}/page'>b</a>")
    site.routes["/page"] = html("<p>the page</p>")
    crawl(site, follow_everything())
    assert Counter(site.paths())["/page"] == 1


def test_robots_txt_holds_against_spellings_and_redirects(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/robots.txt"] = lambda: (
        200,
        {"Content-Type": "text/plain"},
        b"User-agent: *\nDisallow: /private\n",
    )
    hrefs = ["/private", "/%70rivate", "/./private/x", "/public/../private/y", "/private#x", "/hop", "/hop2"]
    site.routes["/"] = html("".join(f"<a href='{h}'>h{i}</a> " for i, h in enumerate(hrefs)))
    site.routes["/hop"] = redirect("/private/secret")
    site.routes["/hop2"] = redirect(f"http://127.0.0.1:{site.port}/%70rivate/other")
    site.routes["/private/secret"] = html("<p>secret</p>")
    seen: list[Mapping[str, Any]] = []
    result = crawl(site, follow_everything(seen))
    assert not [p for p in site.paths() if p.startswith(("/private", "/%70rivate"))], site.paths()
    assert Counter(site.paths())["/robots.txt"] == 1
    assert "robots.txt" in result.reason


def test_off_site_redirects_below_the_start_are_not_followed(runtime: dflow.Runtime, site: Site) -> None:
    port = site.port
    site.routes["/"] = html("<a href='/away'>away</a> <a href='/away2'>away2</a> <a href='/ok'>ok</a>")
    site.routes["/ok"] = html("<p>ok</p>")
    site.routes["/away"] = redirect(f"http://localhost:{port}/offsite")
    site.routes["/away2"] = redirect("file:///etc/passwd")
    seen: list[Mapping[str, Any]] = []
    crawl(site, follow_everything(seen))
    assert site.paths("localhost") == []
    notes = " ".join(str(p.get("note")) for i in seen for p in i["pages"])
    assert "redirects to another site" in notes and "unusable location" in notes


def test_a_page_with_thousands_of_links_is_capped(runtime: dflow.Runtime, site: Site) -> None:
    site.routes["/"] = html("".join(f"<a href='/p{i}'>p{i}</a>" for i in range(5000)))
    seen: list[Mapping[str, Any]] = []

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(inputs)
        return {"found": False, "follow": []}

    t0 = time.monotonic()
    result = crawl(site, research, crawler=Fetcher(trust_env=False, allow_private=True, max_links=300))
    assert time.monotonic() - t0 < 20
    assert result.status is AgentStatus.TERMINATED
    assert len(seen[0]["pages"][0]["links"]) == 300
    assert site.paths() == ["/robots.txt", "/"]


def test_the_fetcher_refuses_what_is_not_an_http_url(site: Site) -> None:
    fetcher = Fetcher(trust_env=False, allow_private=True)
    for target in (
        "file:///etc/passwd",
        "ftp://127.0.0.1/",
        "javascript:alert(1)",
        "data:,x",
        "gopher://x/",
        "/relative",
        "http://",
        "http://:80/",
        "x" * 3000,
        f"{site.base}/" + "a" * 2100,
    ):
        page = fetch_once(fetcher, target)
        assert not page.ok and page.note.startswith("not fetched"), (target[:30], page.note)
    assert site.paths() == []


def test_the_fetch_tool_checks_robots_txt_at_every_redirect(site: Site) -> None:
    site.routes["/robots.txt"] = lambda: (
        200,
        {"Content-Type": "text/plain"},
        b"User-agent: *\nDisallow: /private\n",
    )
    site.routes["/open"] = redirect("/private/x")
    site.routes["/private/x"] = html("<p>secret</p>")
    fetcher = Fetcher(trust_env=False, allow_private=True)
    tool = fetcher.as_tool(unique("rv_fetch_page"))

    async def go() -> Any:
        try:
            return await tool.run({"url": site.base + "/open"})
        finally:
            await fetcher.aclose()

    result = asyncio.run(go())
    assert "robots.txt disallows" in result.observation and "secret" not in result.observation
    assert "/private/x" not in site.paths()
