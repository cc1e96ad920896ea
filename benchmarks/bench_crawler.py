"""The deep crawler's pages per second: over a generated local site that answers at once,
over real pages (Debian's Python documentation), and how many questions whose links lie
deep in a long index page it reaches.

    python benchmarks/bench_crawler.py           # writes benchmarks/results/crawler.{json,md}
    python benchmarks/bench_crawler.py --quick   # one round, fewer pages, prints only

The real pages are those of the Debian package python3.11-doc (``apt-get install -y
python3.11-doc`` puts them in /usr/share/doc/python3.11/html, about 530 pages of 100 KB on
average; ``--docs FOLDER`` names another folder of HTML). Each site is served on 127.0.0.1 by
a process of its own (``benchmarks/_bench_crawler.py``), on the same two cores as what crawls.

* Generated site: a tree of 16 links a page; a crawl follows every link, 16 pages at a time
  (each page a step in a ``zip``, any worker's), until its budget of pages; in local mode and
  with one ``dflow worker`` process on Redis Streams (Redis store). ``fetch only`` is the same
  pages fetched and converted by the fetcher directly, 16 at a time: the work without dflow.
* Real pages: a crawl from the documentation's home page following every link, up to its
  page budget; beside it a plain httpx crawler fetching the same URLs, 16 at a time, reading
  each body and finding its links with a regular expression (what any crawler does at the
  least). Each system runs once per round, rounds interleaved; each ratio is the median of
  the per-round ratios. The crawler runs with html-to-markdown (now) and with the converter
  it replaced (beautifulsoup4 + markdownify, the whole body converted; kept in
  ``_bench_crawler.py``), in local mode and on one worker.
* Questions: six questions whose page is linked from the library index (30,000 characters
  of markdown) beyond its first 6,000 characters; research follows, from the prompt alone,
  the links whose text names the module asked about (a model can only choose a link whose
  text it sees). Reached: the answer's page was read within 12 pages.

Pages per second = pages fetched / wall time of the crawl (start of the run to its result).
Redis needs 127.0.0.1:6379: the benchmark uses db 12 under a key prefix of its own, and
deletes only the keys under that prefix when it ends (it flushes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx

import dflow
from benchmarks import _bench_crawler as app
from benchmarks._procs import log_path, start, stop, worker_cmd
from benchmarks._results import report, system_rows
from dflow_agents.fetch import Fetcher, normalize_url

SECRET = "bench-crawler-secret-0123456789abcdef"
REDIS = "redis://127.0.0.1:6379/12"
SITE_PAGES = 2000  # more than a crawl fetches
DOCS = Path("/usr/share/doc/python3.11/html")
_HREF = re.compile(rb"""href\s*=\s*["']([^"'#]+)""", re.IGNORECASE)


def start_site(*args: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks._bench_crawler", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/"


@contextlib.contextmanager
def redis_worker() -> Iterator[str]:
    """One ``dflow worker`` serving the benchmark's crawlers on Redis Streams, under a key
    prefix of its own; after the block, the worker stopped and the keys under the prefix
    deleted (and nothing else). Yields the prefix."""
    import redis

    prefix = f"bench-crawler-{uuid.uuid4().hex[:10]}"
    transport, store = f"{REDIS}?stream={prefix}", f"{REDIS}?prefix={prefix}"
    worker, _ = start(
        worker_cmd("benchmarks._bench_crawler", transport, store, app.CONCURRENCY),
        log_path("bench-crawler-worker"),
        {"DFLOW_SECRET": SECRET},
        "serving",
    )
    try:
        yield prefix
    finally:
        stop(worker)
        r = redis.Redis.from_url(REDIS)
        keys = list(r.scan_iter(match=f"*{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
        r.close()


@contextlib.contextmanager
def mode(name: str, prefix: str | None) -> Iterator[None]:
    """This process as the runtime of local mode, or as the client of the Redis worker."""
    if name == "local":
        dflow.global_init_for_test(concurrency=app.CONCURRENCY)
    else:
        assert prefix is not None
        dflow.configure(f"{REDIS}?stream={prefix}", f"{REDIS}?prefix={prefix}", secret=SECRET, consume=False)
    try:
        yield
    finally:
        dflow.shutdown()


def crawl(agent: Any, url: str, pages: int, timeout: float = 900) -> float:
    """One crawl of ``agent`` from ``url`` to its page budget; its wall time."""
    t0 = time.perf_counter()
    result = agent.run("crawl the site", url=url).result(timeout)
    wall = time.perf_counter() - t0
    assert result.answer == f"crawled {pages} pages", (result.reason, result.answer)
    return wall


# -- the generated site ------------------------------------------------------------------------


def bench_generated(runs: int, prefix: str) -> dict[str, Any]:
    site, url = start_site("serve", str(SITE_PAGES))
    try:
        results: dict[str, Any] = {"pages_per_crawl": app.PAGES, "links_per_page": app.FANOUT}
        results["fetch_only"] = fetch_only(url)
        for key, name in (("dflow_local", "local"), ("dflow_redis_streams_1_worker", "redis")):
            try:
                with mode(name, prefix):
                    crawl(app.crawler, url, app.PAGES)  # warm-up
                    walls = [crawl(app.crawler, url, app.PAGES) for _ in range(runs)]
                results[key] = rates(walls, app.PAGES)
            except Exception as exc:
                results[key] = {"error": f"{type(exc).__name__}: {exc}"}
        return results
    finally:
        site.terminate()
        site.wait(10)


def rates(walls: list[float], pages: int) -> dict[str, Any]:
    per_s = [pages / w for w in walls]
    return {
        "pages_per_s_median": statistics.median(per_s),
        "pages_per_s_min": min(per_s),
        "pages_per_s_max": max(per_s),
        "ms_per_page_median": statistics.median(walls) / pages * 1e3,
        "runs": len(walls),
    }


def fetch_only(url: str) -> dict[str, Any]:
    """The pages the generated crawl fetches, fetched and converted directly, 16 at a time."""
    urls = [url] + [
        normalize_url(f"/p/{i}.html?from={(i - 1) // app.FANOUT}", url) or "" for i in range(1, app.PAGES)
    ]

    async def main() -> float:
        fetcher = Fetcher(allow_private=True)
        sem = asyncio.Semaphore(app.CONCURRENCY)

        async def one(u: str) -> None:
            async with sem:
                page = await fetcher.fetch(u, follow_redirects=False)
                assert page.ok, page

        try:
            await asyncio.gather(*(one(u) for u in urls[:50]))  # warm-up
            t0 = time.perf_counter()
            await asyncio.gather(*(one(u) for u in urls))
            return time.perf_counter() - t0
        finally:
            await fetcher.aclose()

    wall = asyncio.run(main())
    return {"pages_per_s": len(urls) / wall, "ms_per_page": wall / len(urls) * 1e3}


# -- real pages --------------------------------------------------------------------------------


def plain_crawl(urls: list[str]) -> tuple[float, int]:
    """``urls`` fetched with httpx, 16 at a time, each body read whole and its links found
    (a regular expression) and made absolute (each once); the wall time and the bytes read."""

    async def main() -> tuple[float, int]:
        limits = httpx.Limits(max_connections=app.CONCURRENCY, max_keepalive_connections=app.CONCURRENCY)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
            sem = asyncio.Semaphore(app.CONCURRENCY)
            read = 0
            links: set[str] = set()

            async def one(u: str) -> None:
                nonlocal read
                async with sem:
                    body = (await client.get(u)).content
                read += len(body)
                links.update(urljoin(u, h.decode("utf-8", "replace")) for h in set(_HREF.findall(body)))

            t0 = time.perf_counter()
            await asyncio.gather(*(one(u) for u in urls))
            return time.perf_counter() - t0, read

    return asyncio.run(main())


def recorded_urls(url: str) -> list[str]:
    """The URLs a local crawl of the docs requests, in order (the plain crawler's list)."""
    fetched: list[str] = []
    real = app.docs_crawler.fetcher.fetch

    async def recording(target: str, **options: Any) -> Any:
        fetched.append(target)
        return await real(target, **options)

    app.docs_crawler.fetcher.fetch = recording  # type: ignore[method-assign]
    try:
        with mode("local", None):
            crawl(app.docs_crawler, url, app.DOCS_PAGES)
    finally:
        del app.docs_crawler.fetcher.fetch
    return fetched


def bench_real(rounds: int, prefix: str, docs: Path) -> dict[str, Any]:
    site, base = start_site("serve-dir", str(docs))
    url = base + "index.html"
    systems: dict[str, Callable[[], float]] = {
        "dflow_local": lambda: local(app.docs_crawler),
        "dflow_local_old_converter": lambda: local(app.docs_crawler_old),
        "dflow_redis_1_worker": lambda: remote(app.docs_crawler),
        "dflow_redis_1_worker_old_converter": lambda: remote(app.docs_crawler_old),
    }

    def local(agent: Any) -> float:
        with mode("local", None):
            return crawl(agent, url, app.DOCS_PAGES)

    def remote(agent: Any) -> float:
        with mode("redis", prefix):
            return crawl(agent, url, app.DOCS_PAGES)

    try:
        urls = recorded_urls(url)  # also the warm-up of the site's page cache
        plain_crawl(urls)
        walls: dict[str, list[float]] = {"plain_httpx": [], **{k: [] for k in systems}}
        bytes_read = 0
        for r in range(rounds):
            wall, bytes_read = plain_crawl(urls)
            walls["plain_httpx"].append(wall)
            for key, run in systems.items():
                walls[key].append(run())
                print(
                    f"round {r + 1}/{rounds} {key}: {app.DOCS_PAGES / walls[key][-1]:.1f} pages/s", flush=True
                )
        return summarise_real(walls, len(urls), bytes_read, docs)
    finally:
        site.terminate()
        site.wait(10)


def summarise_real(walls: dict[str, list[float]], pages: int, bytes_read: int, docs: Path) -> dict[str, Any]:
    results: dict[str, Any] = {
        "pages_per_crawl": pages,
        "kb_per_page": bytes_read / pages / 1e3,
        "rounds": len(walls["plain_httpx"]),
        "site_pages": sum(1 for _ in docs.rglob("*.html")),
    }
    for key, w in walls.items():
        results[key] = rates(w, pages)

    def ratio(a: str, b: str) -> float:
        return statistics.median(y / x for x, y in zip(walls[a], walls[b]))  # (pages/s of a) / (pages/s of b)

    results["ratios"] = {
        f"{key}_vs_plain": ratio(key, "plain_httpx") for key in walls if key != "plain_httpx"
    } | {
        "local_new_vs_old": ratio("dflow_local", "dflow_local_old_converter"),
        "redis_new_vs_old": ratio("dflow_redis_1_worker", "dflow_redis_1_worker_old_converter"),
    }
    return results


def converter_cost(docs: Path, files: int) -> dict[str, Any]:
    """CPU time of the HTML to markdown conversion alone, per page, over ``files`` pages."""
    from dflow_agents._markdown import html_to_markdown

    pages = sorted(docs.rglob("*.html"))[:: max(1, len(list(docs.rglob("*.html"))) // files)][:files]
    bodies = [(p.read_bytes(), "http://127.0.0.1/" + str(p.relative_to(docs))) for p in pages]
    cost = {}
    for name, convert in (
        ("html_to_markdown", html_to_markdown),
        ("old_bs4_markdownify", app.old_html_to_markdown),
    ):
        t0 = time.process_time()
        for body, url in bodies:
            convert(body, url)
        cost[f"{name}_ms_per_page"] = (time.process_time() - t0) / len(bodies) * 1e3
    cost["pages"] = len(bodies)
    cost["kb_per_page"] = sum(len(b) for b, _ in bodies) / len(bodies) / 1e3
    return cost


def bench_questions(docs: Path) -> dict[str, Any]:
    site, base = start_site("serve-dir", str(docs))
    try:
        with mode("local", None):
            return app.ask_all(base + "library/index.html")
    finally:
        site.terminate()
        site.wait(10)


# -- the report --------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round, fewer pages, print only")
    ap.add_argument("--docs", type=Path, default=DOCS, help="a folder of real HTML pages (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the real pages")
    args = ap.parse_args()
    rounds, runs = (1, 2) if args.quick else (args.rounds, 5)
    results: dict[str, Any] = {"concurrency": app.CONCURRENCY}
    with redis_worker() as prefix:
        results["generated"] = bench_generated(runs, prefix)
        if (args.docs / "library" / "index.html").exists():
            results["real"] = bench_real(rounds, prefix, args.docs)
            results["real"]["converter_cpu"] = converter_cost(args.docs, 60)
            results["questions"] = bench_questions(args.docs)
        else:
            results["real"] = {"error": f"no documentation in {args.docs}: apt-get install -y python3.11-doc"}
    report("crawler", results, render(results), keep=not args.quick)


def render(results: dict[str, Any]) -> str:
    return "\n".join([*render_generated(results), "", *render_real(results), "", *render_questions(results)])


def render_generated(results: dict[str, Any]) -> list[str]:
    g = results["generated"]
    lines = [
        f"## Generated site: {g['pages_per_crawl']} pages a crawl, {g['links_per_page']} links a page, "
        f"{results['concurrency']} pages at a time, answered at once from memory",
        "",
        "| system | pages/s (median) | min | max | per page |",
        "|---|---:|---:|---:|---:|",
        f"| fetcher alone, 16 at a time, no dflow | {g['fetch_only']['pages_per_s']:.0f} | | | "
        f"{g['fetch_only']['ms_per_page']:.2f} ms |",
    ]
    names = {
        "dflow_local": "DeepCrawlerAgent, local mode",
        "dflow_redis_streams_1_worker": "DeepCrawlerAgent, Redis Streams, 1 worker process",
    }
    return lines + system_rows(g, names, _rate_cells, columns=4)


def _rate_cells(r: dict[str, Any]) -> str:
    return (
        f"**{r['pages_per_s_median']:.1f}** | {r['pages_per_s_min']:.1f} | {r['pages_per_s_max']:.1f} | "
        f"{r['ms_per_page_median']:.1f} ms"
    )


def render_real(results: dict[str, Any]) -> list[str]:
    r = results["real"]
    if "error" in r:
        return ["## Real pages", "", r["error"]]
    ratios, cpu = r["ratios"], r["converter_cpu"]
    names = {
        "plain_httpx": "plain httpx crawler (the same URLs; bodies read, links found by a regex)",
        "dflow_local": "DeepCrawlerAgent, local mode, html-to-markdown",
        "dflow_local_old_converter": "DeepCrawlerAgent, local mode, bs4 + markdownify (before)",
        "dflow_redis_1_worker": "DeepCrawlerAgent, Redis Streams, 1 worker, html-to-markdown",
        "dflow_redis_1_worker_old_converter": "DeepCrawlerAgent, Redis Streams, 1 worker, bs4 + markdownify (before)",
    }
    lines = [
        f"## Real pages: Debian's Python 3.11 documentation ({r['site_pages']} pages) on loopback, "
        f"{r['pages_per_crawl']} pages a crawl ({r['kb_per_page']:.0f} KB a page on average), "
        f"{results['concurrency']} at a time, {r['rounds']} interleaved rounds",
        "",
        "| system | pages/s (median) | min | max | per page | ÷ plain (median of rounds) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, name in names.items():
        vs = f"{ratios[f'{key}_vs_plain']:.2f}×" if key != "plain_httpx" else ""
        lines.append(f"| {name} | {_rate_cells(r[key])} | {vs} |")
    lines += [
        "",
        f"html-to-markdown ÷ before, same run: local mode **{ratios['local_new_vs_old']:.1f}×** the pages/s, "
        f"one worker **{ratios['redis_new_vs_old']:.1f}×**. The conversion alone, CPU per page over "
        f"{cpu['pages']} of the pages ({cpu['kb_per_page']:.0f} KB on average): "
        f"{cpu['html_to_markdown_ms_per_page']:.1f} ms now, {cpu['old_bs4_markdownify_ms_per_page']:.1f} ms before.",
        "",
        "Caveats: the site, the crawler and (on Redis) the worker and Redis share the two cores of this "
        "machine, so every figure includes the static server's CPU. The plain crawler does no more "
        "than read each body and find its hrefs: no markdown, no URL normalisation, no robots.txt, "
        "no durable steps; it fetches the URLs the crawl requested, in its order, without waves "
        "(the crawl waits for each wave's slowest page). Pages are the documentation's own HTML "
        "from the local disk, answered without compression.",
    ]
    return lines


def render_questions(results: dict[str, Any]) -> list[str]:
    q = results.get("questions")
    if not q:
        return []
    lines = [
        "## Questions whose link lies beyond the first 6,000 characters of a long index page",
        "",
        "From the library index (about 30,000 characters of markdown), six questions about modules "
        "listed past its first 6,000 characters; research follows, from the prompt alone, the links "
        "whose text names the module (as a model can only choose a link whose text it sees); at most "
        "12 pages, depth 3.",
        "",
        "| what research reads of each page | questions reached | pages fetched | research prompt, mean | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for view, r in q.items():
        lines.append(
            f"| {view} | **{r['reached']} of {r['of']}** | {r['pages_fetched']} | "
            f"{r['prompt_chars_mean']:,.0f} chars | {r['prompt_chars_max']:,.0f} chars |"
        )
    return lines


if __name__ == "__main__":
    main()
