"""The crawler of ``benchmarks/bench_crawler.py``, imported by its worker process
(``dflow worker benchmarks._bench_crawler``) and by the benchmark itself; and the generated
site it crawls (``python -m benchmarks._bench_crawler serve PAGES``).

The site is a tree: page ``i`` links to pages ``16 i + 1`` ... ``16 i + 16``, to its parent
and to the home page, with a paragraph of text (about 1.5 KB of HTML a page); it answers
at once from memory (HTTP/1.1, keep-alive). The crawler's research function is a plain
function that follows every new link (no model), so what is measured is the framework: a
step per page on any worker, the fetch, the HTML-to-markdown conversion, the URL map.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dflow_agents.crawler import DeepCrawlerAgent, Research
from dflow_agents.fetch import Fetcher

FANOUT = 16
PAGES = int(os.environ.get("BENCH_CRAWL_PAGES", "600"))  # the crawl's page budget
CONCURRENCY = int(os.environ.get("BENCH_CRAWL_CONCURRENCY", "16"))


def follow_all(inputs: Mapping[str, Any]) -> Research:
    """Follow every link of every page (the crawl ends at its page budget)."""
    return Research(follow=[i for page in inputs["pages"] for i in page.get("links", ())])


def never(inputs: Mapping[str, Any]) -> bool:
    return False


def report(inputs: Mapping[str, Any]) -> str:
    return f"crawled {inputs['pages_fetched']} pages"


crawler = DeepCrawlerAgent(
    "bench-crawler", research=follow_all, validation=never, summary=report, crawler=Fetcher(allow_private=True),
    max_pages=PAGES, max_depth=50, concurrency=CONCURRENCY,
)


def page(i: int, total: int) -> bytes:
    children = [c for c in range(FANOUT * i + 1, FANOUT * i + FANOUT + 1) if c < total]
    links = "".join(f"<li><a href='/p/{c}.html?from={i}#top'>Page {c}</a></li>" for c in children)
    parent = f"<a href='/p/{(i - 1) // FANOUT}.html'>Up</a>" if i else ""
    text = f"Page {i} of a generated site. " * 12
    return (f"<!doctype html><html><head><title>Page {i}</title><style>p{{margin:0}}</style></head><body>"
            f"<nav><a href='/'>Home</a> {parent}</nav><h1>Page {i}</h1><p>{text}</p><ul>{links}</ul>"
            f"<footer>generated</footer></body></html>").encode()


def serve(total: int) -> None:
    """Serve the site on a free port of 127.0.0.1; print the port."""
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

    class Server(ThreadingHTTPServer):
        request_queue_size = 256
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(int(sys.argv[2]))
