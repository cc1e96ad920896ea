"""A tiny clothes shop on 127.0.0.1: the site the user browses, whose pages the browser
plug-in fetches for the assistant's crawler (offline, for the demo and the tests).

Its pages render the catalogue: a home page with the categories, a page per category
listing its items, and a page per item with what only the page tells (material, sizes,
care). ``ShopSite`` serves it from a thread and logs the paths requested::

    with ShopSite() as shop:
        print(shop.url)        # http://127.0.0.1:PORT/

``python -m examples.assistant.shop --port 8001`` serves it until interrupted.
"""

from __future__ import annotations

import argparse
import html
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from .catalogue import CATALOGUE, KINDS, Item

__all__ = ["CATEGORY_LABELS", "ShopSite", "main", "pages"]

#: the link text of each category
CATEGORY_LABELS = {
    "top": "Tops and shirts",
    "bottom": "Trousers and jeans",
    "shoes": "Shoes",
    "outerwear": "Jackets and coats",
}


def _page(title: str, body: str) -> bytes:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body { font-family: sans-serif }</style><script>var cart = [];</script></head><body>"
        "<nav><a href='/'>Spring Shop</a> | <a href='/about.html'>About</a></nav>"
        f"<main>{body}</main><footer>Spring Shop, a demo site</footer></body></html>"
    ).encode()


def _item_page(item: Item) -> bytes:
    e = html.escape
    return _page(
        f"{item.name} | Spring Shop",
        (
            f"<h1>{e(item.name)}</h1><p>{e(item.colour.capitalize())}, {e(item.style)} style, for "
            f"{e(', '.join(item.seasons))}.</p><p>Price: {item.price} EUR</p>"
            f"<h2>Details</h2><ul><li>Material: {e(item.material)}</li><li>Sizes: {e(item.sizes)}</li>"
            "<li>Care: machine wash at 30 °C</li></ul>"
            f"<p><a href='/c/{item.kind}'>More {e(CATEGORY_LABELS[item.kind].lower())}</a></p>"
        ),
    )


def pages() -> dict[str, tuple[str, bytes]]:
    """Every path of the shop, with its content type and body."""
    out: dict[str, tuple[str, bytes]] = {
        "/robots.txt": ("text/plain", b"User-agent: *\nDisallow: /checkout/\n")
    }
    categories = "".join(f"<li><a href='/c/{k}'>{CATEGORY_LABELS[k]}</a></li>" for k in KINDS)
    out["/"] = (
        "text/html; charset=utf-8",
        _page(
            "Spring Shop",
            (
                "<h1>Spring Shop</h1><p>Clothes for the new season.</p>"
                f"<h2>Categories</h2><ul>{categories}</ul>"
                "<p><a href='/about.html'>About the shop</a> | <a href='/checkout/cart'>Your cart</a></p>"
            ),
        ),
    )
    out["/about.html"] = (
        "text/html; charset=utf-8",
        _page(
            "About | Spring Shop",
            ("<h1>About</h1><p>A demo shop for the dflow assistant example.</p><p><a href='/'>Home</a></p>"),
        ),
    )
    for kind in KINDS:
        items = "".join(
            f"<li><a href='/p/{i.id}.html'>{html.escape(i.name)}</a> ({i.price} EUR)</li>"
            for i in CATALOGUE
            if i.kind == kind
        )
        out[f"/c/{kind}"] = (
            "text/html; charset=utf-8",
            _page(
                f"{CATEGORY_LABELS[kind]} | Spring Shop",
                (f"<h1>{CATEGORY_LABELS[kind]}</h1><ul>{items}</ul><p><a href='/'>Home</a></p>"),
            ),
        )
    for item in CATALOGUE:
        out[f"/p/{item.id}.html"] = ("text/html; charset=utf-8", _item_page(item))
    return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # a crawl wave connects at once


class ShopSite:
    """The shop served from a thread on ``host`` (a free port by default); ``hits`` are the
    paths requested, in order."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.hits: list[str] = []
        self.url = ""
        self._lock = threading.Lock()
        self._pages = pages()
        self._httpd: _Server | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("#", 1)[0]
                with site._lock:
                    site.hits.append(path)
                found = site._pages.get(path.split("?", 1)[0])
                if found is None:
                    status, ctype, body = (
                        404,
                        "text/html; charset=utf-8",
                        _page("Not found", "<h1>Not found</h1>"),
                    )
                else:
                    status, (ctype, body) = 200, found
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def start(self) -> str:
        """Serve; the shop's base URL (ending in ``/``)."""
        self._httpd = _Server((self.host, self.port), self._handler())
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="spring-shop"
        ).start()
        self.url = f"http://{self.host}:{self._httpd.server_address[1]}/"
        return self.url

    def stop(self) -> None:
        """Stop serving."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def paths(self) -> list[str]:
        """The paths requested so far."""
        with self._lock:
            return list(self.hits)

    def __enter__(self) -> ShopSite:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve the shop until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.assistant.shop", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    site = ShopSite(args.host, args.port)
    print(f"the shop is at {site.start()} (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
