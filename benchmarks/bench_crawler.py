"""The deep crawler's pages per second over a generated local site that answers at once:
in local mode, and with one ``dflow worker`` process on Redis Streams (Redis store).

    python benchmarks/bench_crawler.py           # writes benchmarks/results/crawler.{json,md}
    python benchmarks/bench_crawler.py --quick   # fewer runs, prints only

The site (``benchmarks/_bench_crawler.py``) is a tree with 16 links a page, served by a
separate process; a crawl follows every link, 16 pages at a time (each page a step in a
``zip``, any worker's), until its budget of ``PAGES`` pages. Pages per second = pages
fetched / wall time of the crawl (start of the run to its result), crawls one at a time
after a warm-up. ``fetch only`` is the same pages fetched and converted by the fetcher
directly, 16 at a time, in this process: what the work itself costs without dflow. Redis
needs 127.0.0.1:6379 (db 12, flushed).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks import _bench_crawler as app
from benchmarks._procs import one_worker
from benchmarks._results import quick, report, system_rows
from dflow_agents.fetch import Fetcher

SECRET = "bench-crawler-secret-0123456789abcdef"
REDIS = "redis://127.0.0.1:6379/12"
SITE_PAGES = 2000  # more than a crawl fetches
TARGET = 200.0  # pages/s with one worker


def start_site() -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks._bench_crawler", "serve", str(SITE_PAGES)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/"


def crawl_once(url: str, timeout: float = 120) -> tuple[float, int]:
    t0 = time.perf_counter()
    result = app.crawler.run("crawl the generated site", url=url).result(timeout)
    wall = time.perf_counter() - t0
    assert result.reason.startswith(f"the page budget of {app.PAGES} pages"), result
    assert result.answer == f"crawled {app.PAGES} pages", result
    return wall, app.PAGES


def measure(url: str, runs: int) -> dict[str, Any]:
    crawl_once(url)  # warm-up
    rates, walls = [], []
    for _ in range(runs):
        wall, pages = crawl_once(url)
        walls.append(wall)
        rates.append(pages / wall)
    return {"pages_per_s_median": statistics.median(rates), "pages_per_s_min": min(rates),
            "pages_per_s_max": max(rates), "wall_s_median": statistics.median(walls),
            "ms_per_page_median": statistics.median(walls) / app.PAGES * 1e3, "runs": runs}


def bench_fetch_only(url: str) -> dict[str, Any]:
    """The pages the crawl fetches, fetched and converted directly, 16 at a time."""
    from benchmarks._bench_crawler import FANOUT
    from dflow_agents.fetch import normalize_url

    urls = [url] + [normalize_url(f"/p/{i}.html?from={(i - 1) // FANOUT}", url) or "" for i in range(1, app.PAGES)]

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


def bench_local(url: str, runs: int) -> dict[str, Any]:
    dflow.global_init_for_test(concurrency=app.CONCURRENCY)
    try:
        return measure(url, runs)
    finally:
        dflow.shutdown()


def bench_redis(url: str, runs: int) -> dict[str, Any]:
    with one_worker("benchmarks._bench_crawler", REDIS, "bench-crawler", SECRET, app.CONCURRENCY):
        return measure(url, runs)


def main() -> None:
    is_quick = quick(__doc__)
    runs = 2 if is_quick else 5
    site, url = start_site()
    try:
        results: dict[str, Any] = {"pages_per_crawl": app.PAGES, "concurrency": app.CONCURRENCY,
                                   "links_per_page": app.FANOUT}
        results["fetch_only"] = bench_fetch_only(url)
        results["dflow_local"] = bench_local(url, runs)
        try:
            results["dflow_redis_streams_1_worker"] = bench_redis(url, runs)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            results["dflow_redis_streams_1_worker"] = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        site.terminate()
        site.wait(10)
    report("crawler", results, render(results), keep=not is_quick)


def render(results: dict[str, Any]) -> str:
    lines = [
        (f"Deep crawler over a generated local site that answers at once: {results['pages_per_crawl']} pages a "
         f"crawl, {results['links_per_page']} links a page, {results['concurrency']} pages at a time (a wave is a "
         "zip of one fetch step per page); every page fetched over HTTP and turned into markdown"),
        "",
        "| system | pages/s (median) | min | max | per page | crawl wall time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    f = results["fetch_only"]
    lines.append(f"| fetcher alone, 16 at a time, no dflow | {f['pages_per_s']:.0f} | | | {f['ms_per_page']:.2f} ms | |")
    names = {"dflow_local": "DeepCrawlerAgent, local mode",
             "dflow_redis_streams_1_worker": "DeepCrawlerAgent, Redis Streams, 1 worker process"}
    lines += system_rows(results, names, lambda r: (
        f"**{r['pages_per_s_median']:.0f}** | {r['pages_per_s_min']:.0f} | {r['pages_per_s_max']:.0f} | "
        f"{r['ms_per_page_median']:.2f} ms | {r['wall_s_median']:.2f} s"), columns=5)
    shares = [f"{name.split(',', 1)[1].strip()} {results[key]['ms_per_page_median'] - f['ms_per_page']:.2f} ms"
              for key, name in names.items() if "ms_per_page_median" in results.get(key, {})]
    if shares:
        lines += ["", "dflow's own share of a page (per page, minus the fetcher alone): " + "; ".join(shares) + "."]
    w = results.get("dflow_redis_streams_1_worker", {})
    if "pages_per_s_median" in w:
        verdict = "met" if w["pages_per_s_median"] >= TARGET else "not met"
        lines += ["", f"Target ≥ {TARGET:.0f} pages/s with 1 worker: **{verdict}** ({w['pages_per_s_median']:.0f})."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
