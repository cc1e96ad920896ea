"""The crawlers of ``benchmarks/bench_crawler.py``, imported by its worker process
(``dflow worker benchmarks._bench_crawler``) and by the benchmark itself, and the sites they
crawl, each served by a process of its own:

* ``python -m benchmarks._bench_crawler serve PAGES``: a generated tree, page ``i`` linking to
  pages ``16 i + 1`` ... ``16 i + 16``, its parent and the home page, with a paragraph of
  text (about 1.5 KB of HTML a page), answered at once from memory;
* ``python -m benchmarks._bench_crawler serve-dir FOLDER``: the files of a folder (real
  pages: Debian's Python documentation), as a static web server sends them.

Both print their port and answer over HTTP/1.1 with keep-alive. The research function of
every crawler here is a plain function that follows every new link (no model), so what is
measured is the framework and the fetcher: a step per page on any worker, the fetch, the
HTML-to-markdown conversion, the URL map. ``docs_crawler_old`` is the same crawler with the
HTML converter this project used before html-to-markdown (beautifulsoup4 and markdownify,
the whole body converted), kept here to measure the change.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import statistics
import sys
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dflow_agents.crawler import CrawlBudget, CrawlFunctions, DeepCrawlerAgent, Research
from dflow_agents.fetch import Fetcher, normalize_url

FANOUT = 16
PAGES = int(os.environ.get("BENCH_CRAWL_PAGES", "600"))  # the generated crawl's page budget
DOCS_PAGES = int(os.environ.get("BENCH_CRAWL_DOCS_PAGES", "200"))  # the real-pages crawl's budget
CONCURRENCY = int(os.environ.get("BENCH_CRAWL_CONCURRENCY", "16"))


def follow_all(inputs: Mapping[str, Any]) -> Research:
    """Follow every link of every page (the crawl ends at its page budget)."""
    return Research(follow=[i for page in inputs["pages"] for i in page.get("links", ())])


def never(inputs: Mapping[str, Any]) -> bool:
    return False


def report(inputs: Mapping[str, Any]) -> str:
    return f"crawled {inputs['pages_fetched']} pages"


FOLLOW_ALL = CrawlFunctions(research=follow_all, validation=never, summary=report)

crawler = DeepCrawlerAgent(
    "bench-crawler",
    functions=FOLLOW_ALL,
    crawler=Fetcher(allow_private=True),
    budget=CrawlBudget(max_pages=PAGES, max_depth=50, concurrency=CONCURRENCY),
)


class OldConverterFetcher(Fetcher):
    """The built-in fetcher with the HTML converter of dflow-agents before html-to-markdown."""

    def _convert(self, body: bytes, url: str, encoding: str | None) -> tuple[str, str, list[str], bool]:
        return old_html_to_markdown(
            body, url, encoding=encoding, max_chars=self.max_chars, max_links=self.max_links
        )


_DOCS_BUDGET = CrawlBudget(max_pages=DOCS_PAGES, max_depth=50, max_bytes=10**9, concurrency=CONCURRENCY)
docs_crawler = DeepCrawlerAgent(
    "bench-docs-crawler", functions=FOLLOW_ALL, crawler=Fetcher(allow_private=True), budget=_DOCS_BUDGET
)
docs_crawler_old = DeepCrawlerAgent(
    "bench-docs-crawler-old",
    functions=FOLLOW_ALL,
    crawler=OldConverterFetcher(allow_private=True),
    budget=_DOCS_BUDGET,
)


# -- the converter before html-to-markdown (beautifulsoup4 + markdownify), as it was -----------

_NOISE = frozenset(
    [
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
        "head",
    ]
)
_NOISE_ROLES = frozenset(("navigation", "banner", "search"))
_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_TRAILING = re.compile(r"[ \t]+\n")
_SPACES = re.compile(r"[ \t\u00a0]{2,}")


def old_html_to_markdown(
    html: bytes, url: str, *, encoding: str | None = None, max_chars: int = 40_000, max_links: int = 1_000
) -> tuple[str, str, list[str], bool]:
    """dflow-agents 0.2's html_to_markdown: the whole body parsed and converted, then cut."""
    from bs4 import BeautifulSoup  # the dev extra: only this benchmark uses them
    from markdownify import MarkdownConverter

    from dflow_agents._markdown import trim_open_link

    decoded: str | bytes = html
    try:
        decoded = html.decode(encoding or "utf-8", errors="replace" if encoding else "strict")
    except (LookupError, UnicodeError):
        pass
    soup = BeautifulSoup(decoded, "html.parser")
    tags = soup.find_all(True)
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
    inside: set[int] = set()
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
                tag.unwrap()
                continue
            tag.attrs = {"href": target}
            if target not in seen:
                seen.add(target)
                links.append(target)
    for tag in noise:
        tag.decompose()
    converter = MarkdownConverter(
        heading_style="ATX",
        bullets="*",
        autolinks=False,
        strip=["img"],
        escape_underscores=False,
        escape_asterisks=False,
        escape_misc=False,
    )
    markdown = converter.convert_soup(soup).replace("\x00", "")
    markdown = _BLANKS.sub("\n\n", _SPACES.sub(" ", _TRAILING.sub("\n", markdown))).strip()
    truncated = len(markdown) > max_chars
    if truncated:
        markdown = trim_open_link(markdown[:max_chars]).rstrip() + "\n\n[... cut]"
    return title, markdown, links, truncated


# -- the sites ---------------------------------------------------------------------------------


def page(i: int, total: int) -> bytes:
    children = [c for c in range(FANOUT * i + 1, FANOUT * i + FANOUT + 1) if c < total]
    links = "".join(f"<li><a href='/p/{c}.html?from={i}#top'>Page {c}</a></li>" for c in children)
    parent = f"<a href='/p/{(i - 1) // FANOUT}.html'>Up</a>" if i else ""
    text = f"Page {i} of a generated site. " * 12
    return (
        f"<!doctype html><html><head><title>Page {i}</title><style>p{{margin:0}}</style></head><body>"
        f"<nav><a href='/'>Home</a> {parent}</nav><h1>Page {i}</h1><p>{text}</p><ul>{links}</ul>"
        f"<footer>generated</footer></body></html>"
    ).encode()


class _Server(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that closed its connection (a fetcher at its byte budget)


def serve(total: int) -> None:
    """Serve the generated site on a free port of 127.0.0.1; print the port."""
    pages = {f"/p/{i}.html?from={(i - 1) // FANOUT}": page(i, total) for i in range(1, total)}
    pages["/"] = page(0, total)
    pages["/robots.txt"] = b"User-agent: *\nDisallow: /private/\n"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else the body waits for the ACK of the headers (delayed ACK: ~40 ms)

        def do_GET(self) -> None:
            body = pages.get(self.path)
            status = 200 if body is not None else 404
            body = body if body is not None else b"not found"
            self.send_response(status)
            self.send_header("content-type", "text/plain" if self.path == "/robots.txt" else "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = _Server(("127.0.0.1", 0), Handler)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


def serve_dir(folder: str) -> None:
    """Serve the files of ``folder`` on a free port of 127.0.0.1; print the port."""

    class Handler(SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = _Server(("127.0.0.1", 0), functools.partial(Handler, directory=folder))
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(int(sys.argv[2]))
elif __name__ == "__main__" and sys.argv[1:2] == ["serve-dir"]:
    serve_dir(sys.argv[2])


# -- questions whose links lie deep in a long index page ----------------------------------------

#: (question, the module whose page answers it, the words on that page that answer it): each
#: page is linked from the library index beyond its first 6,000 characters of markdown.
QUESTIONS = [
    ("Which zlib function computes a CRC-32 checksum?", "zlib", "crc32"),
    ("Which function of secrets returns a random text string in hexadecimal?", "secrets", "token_hex"),
    ("Which tomllib function parses a TOML document given as a str?", "tomllib", "loads"),
    ("Which class of the wave module reads WAV files?", "wave", "Wave_read"),
    ("Which file does venv write into the directory of a new environment?", "venv", "pyvenv.cfg"),
    ("Which zipapp function makes an application archive?", "zipapp", "create_archive"),
]
VIEWS = {  # what research reads of each page
    "6,000 characters, no links apart (before)": CrawlBudget(page_chars=6_000, link_chars=0),
    "6,000 characters and the links beyond (now, the default)": CrawlBudget(page_chars=6_000),
    "40,000 characters, no links apart": CrawlBudget(page_chars=40_000, link_chars=0),
}
_PAGE = re.compile(r"^=== Page (L\d+)(?::([^\n]*))? ===\n(.*?)(?=^=== Page |\Z)", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\[([^\]\n]*)\]\((L\d+)\)")


def by_link_text(messages: Any, tools: Any) -> Any:
    """Research as a model does it, from the prompt alone: open the links whose text names the
    module asked about; the answer is a page of that module that says the answer's words."""
    from dflow_agents import ChatResponse

    prompt = messages[-1].content
    _, module, words = next(q for q in QUESTIONS if q[0] in prompt)
    pages = _PAGE.findall(prompt)
    found = [pid for pid, title, body in pages if module in (title or "") and words in body]
    follow = [i for text, i in _LINK.findall(prompt) if f"`{module}`" in text]
    reply = {"found": bool(found), "answer": words, "sources": found, "follow": follow}
    return ChatResponse(content=json.dumps(reply))


class CountingFetcher(Fetcher):
    """The built-in fetcher, counting the pages it fetched."""

    fetched = 0

    async def fetch(self, url: str, **options: Any) -> Any:
        self.fetched += 1
        return await super().fetch(url, **options)


def ask_all(start: str) -> dict[str, Any]:
    """Each question asked from ``start`` with each view: reached, pages, prompt characters."""
    from dflow_agents.crawler import research_function
    from dflow_agents.testing import FunctionModel

    results: dict[str, Any] = {}
    for n, (view, budget) in enumerate(VIEWS.items()):
        model, fetcher = FunctionModel(by_link_text, name="by-link-text"), CountingFetcher(allow_private=True)
        agent = DeepCrawlerAgent(
            f"bench-questions-{n}",
            functions=CrawlFunctions(
                research=research_function(model),
                validation=lambda inputs: any(
                    inputs["answer"] in p.get("content", "") for p in inputs["pages"]
                ),
                summary=lambda inputs: inputs["answer"],
            ),
            crawler=fetcher,
            budget=dataclasses.replace(budget, max_pages=12, max_depth=3),
        )
        reached = [agent.run(q, url=start).result(120).status.value == "finished" for q, _, _ in QUESTIONS]
        prompts = [len(r.messages[-1].content) for r in model.requests]
        results[view] = {
            "reached": sum(reached),
            "of": len(QUESTIONS),
            "each": reached,
            "pages_fetched": fetcher.fetched,
            "research_calls": len(prompts),
            "prompt_chars_mean": statistics.mean(prompts),
            "prompt_chars_max": max(prompts),
        }
    return results
