"""DeepCrawlerAgent and its fetcher over a web shop served on 127.0.0.1 (tests/agents/site.py),
with scripted models that decide from the prompt alone.

What must hold: the crawl reaches the page that holds the answer within its budgets; each
level is fetched concurrently (the site logs when each request starts and ends); no URL is
requested twice; robots.txt is read once and what it disallows is never requested; the huge
page is cut at the byte budget; the model sees short ids, never URLs, and the ids it
chooses map back to the URLs fetched; budgets stop the crawl; the summary is the answer,
given once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

import dflow
from dflow import DFlow
from dflow_agents import (
    AgentStatus,
    ChatMessage,
    ChatResponse,
    InMemoryChatMemory,
    ModelRateLimitError,
    ToolCallAgent,
    agent_tool,
    tool,
)
from dflow_agents._urlmap import UrlMap, parse_id, shorten_links
from dflow_agents.crawler import (
    CrawlBudget,
    CrawlFunctions,
    CrawlScope,
    DeepCrawlerAgent,
    Research,
    research_function,
    summary_function,
    validation_function,
)
from dflow_agents.fetch import Fetcher, Robots, html_to_markdown, normalize_url
from dflow_agents.testing import FunctionModel, ScriptedModel, call, reply

from . import site as S


@dataclass
class Crawl:
    agent: DeepCrawlerAgent
    research: FunctionModel
    validation: FunctionModel
    summary: FunctionModel

    def prompts(self) -> list[str]:
        """The research prompts, in order."""
        return [r.messages[-1].content for r in self.research.requests]


_names = iter(range(10**6))
PAGE_BUDGET = 256 * 1024


def crawler(research: Any = S.bfs_research, *, retry_backoff: float = 1.0, **options: Any) -> Crawl:
    """A crawler of the shop (each test its own name: names are per process)."""
    models = FunctionModel(research), FunctionModel(S.validate), FunctionModel(S.summarize)
    options.setdefault("crawler", Fetcher(max_bytes=PAGE_BUDGET, allow_private=True))
    functions = CrawlFunctions(
        research=research_function(models[0]),
        validation=validation_function(models[1]),
        summary=summary_function(models[2]),
        retry_backoff=retry_backoff,
    )
    agent = DeepCrawlerAgent(f"crawler-{next(_names)}", functions=functions, **options)
    return Crawl(agent, *models)


def served(site: S.Site) -> list[str]:
    return list(S.served(site))


# -- URLs, markdown, the fetcher -------------------------------------------------------------


def test_urls_are_normalised() -> None:
    assert normalize_url("HTTP://Shop.Example:80/a/../b?z=1&a=2#frag") == "http://shop.example/b?a=2&z=1"
    assert normalize_url("https://shop.example:443") == "https://shop.example/"
    assert normalize_url("https://shop.example:8443/x") == "https://shop.example:8443/x"
    assert normalize_url("../c d.html", "http://shop.example/a/b/") == "http://shop.example/a/c%20d.html"
    assert normalize_url("//cdn.example/x", "https://shop.example/") == "https://cdn.example/x"
    for bad in (
        "mailto:a@b.example",
        "javascript:alert(1)",
        "ftp://shop.example/f",
        "http://[::1",
        "http://",
        "",
        "   ",
        "http://shop.example/" + "x" * 3000,
    ):
        assert normalize_url(bad) is None, bad


def test_the_url_map_round_trips() -> None:
    urls = ["http://shop.example/", "http://shop.example/a?x=1", "http://shop.example/b"]
    m = UrlMap()
    assert [m.short(u) for u in urls] == ["L0", "L1", "L2"]
    assert m.short(urls[1]) == "L1", "a URL keeps its id"
    assert [m.url(s) for s in ("L0", "[L1]", " l2 ", "L3", "X1", 7, "L-1")] == [*urls, None, None, None, None]
    assert parse_id("(L12)") == 12 and parse_id("L12x") is None
    first = m.since(0)
    m.add("http://shop.example/c")
    rebuilt = UrlMap(first)
    rebuilt.extend(m.since(len(first)))  # what a run keeps: the URLs each step added
    assert [rebuilt.url(f"L{i}") for i in range(4)] == [m.url(f"L{i}") for i in range(4)]
    md = "See [A](http://shop.example/a?x=1), [B](http://shop.example/b) and [C](http://shop.example/c)."
    short = {urls[1]: "L1", urls[2]: "L2"}
    assert (
        shorten_links(md, [urls[1], urls[2], "http://shop.example/c"], short) == "See [A](L1), [B](L2) and C."
    )


def test_html_becomes_compact_markdown() -> None:
    html = b"""<html><head><title> The   page </title><base href="http://shop.example/dir/">
    <style>p{}</style></head><body><nav><a href="/n">Menu</a></nav><h1>Hello</h1>
    <p>Some    text,\n\n\n\n with <a href="a.html?b=2&amp;a=1#x">a link</a>, <a href="javascript:x()">a script</a>
    and <a href="http://shop.example/dir/a.html?a=1&b=2">the same link</a>. <img src="x.png" alt="pic"></p>
    <script>var secret = 1;</script><aside>ads</aside><footer>foot</footer></body></html>"""
    title, markdown, links, cut = html_to_markdown(html, "http://shop.example/page.html")
    assert title == "The page"
    assert markdown == (
        "# Hello\n\nSome text,\n\nwith [a link](http://shop.example/dir/a.html?a=1&b=2), a script "
        "and [the same link](http://shop.example/dir/a.html?a=1&b=2)."
    )
    assert links == ["http://shop.example/dir/a.html?a=1&b=2"]
    assert not cut
    _, short, _, cut = html_to_markdown(
        b"<p>" + b"word " * 1000 + b"</p>", "http://x.example/", max_chars=100
    )
    assert cut and short.endswith("[... cut]") and len(short) < 120


def test_broken_html_still_gives_its_text_and_links() -> None:
    broken = {
        "unclosed and misnested": b"<p>one <b>two <i>three</b> four</i><div><p>five</div></span></table>six",
        "no html nor body, a stray end tag": b"</div><h2>Title</h2>text <a href=/a>a link",
        "cut inside a tag": b"<p>before</p><p>after <a href='/b'>b</a> <a hre",
        "cut inside a script": b"<p>kept</p><script>var s = '<a href=/x>not text</a>",
        "unquoted and empty attributes": b"<a href=/c?x=1&y=2 class=>c</a><p =x>odd",
        "nul and control bytes": b"<p>nul\x00 and \x01\x02" + b"\x03" * 2000 + b" bell\x07</p>",
        "entities broken": b"<p>&#xD800; &notanentity; &amp &lt</p>",
    }
    got = {what: html_to_markdown(html, "http://x.example/d/") for what, html in broken.items()}
    assert got["unclosed and misnested"][1].replace("*", "").split() == [
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
    ]
    assert got["no html nor body, a stray end tag"][1] == "## Title\n\ntext [a link](http://x.example/a)"
    assert got["cut inside a tag"][1] == "before\n\nafter [b](http://x.example/b)"
    assert got["cut inside a script"][1] == "kept", "script text is never page text"
    assert got["unquoted and empty attributes"][2] == ["http://x.example/c?x=1&y=2"]
    assert got["nul and control bytes"][1] == "nul and bell", "control bytes are no text"
    assert got["entities broken"][1].startswith("\ufffd")
    deep = b"<div>" * 5000 + b"<p>deep</p>" + b"<a href='/after'>after</a>"
    title, markdown, _, _ = html_to_markdown(deep, "http://x.example/")
    assert isinstance(markdown, str) and title == "", "nesting too deep is cut short, never an error"


def test_only_the_part_of_a_long_page_that_is_kept_is_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    import dflow_agents._markdown as md

    sizes: list[int] = []
    real = md.convert
    monkeypatch.setattr(md, "convert", lambda html, options: sizes.append(len(html)) or real(html, options))
    chapter = (
        "<h2>Chapter</h2><p>"
        + "words of the chapter " * 40
        + "</p><script>var data = '<p>hidden</p>';</script>"
    )
    page = ("<html><head><title>Long</title></head><body>" + chapter * 20_000 + "</body></html>").encode()
    title, markdown, _, cut = html_to_markdown(page, "http://x.example/", max_chars=5_000)
    assert title == "Long" and cut and markdown.endswith("[... cut]") and "hidden" not in markdown
    assert sizes == [64 * 1024 + len(md._CLOSE)], f"converted {sizes} characters of {len(page)}"
    sizes.clear()
    sparse = ("<body><script>" + "x" * 200_000 + "</script>" + "<p>text</p>" * 10 + "</body>").encode()
    _, markdown, _, cut = html_to_markdown(sparse, "http://x.example/", max_chars=5_000)
    assert markdown == ("text\n\n" * 10).strip() and not cut
    assert sizes[0] < sizes[-1] == len(sparse) + len(md._CLOSE), (
        "a part that gives too little text is followed by a larger one"
    )


def test_the_fetcher_over_a_real_server(shop: S.Site) -> None:
    fetcher = Fetcher(max_bytes=PAGE_BUDGET, allow_private=True)

    async def main() -> dict[str, Any]:
        try:
            got = {
                p: await fetcher.fetch(shop.url(p), follow_redirects=False)
                for p in ("/", "/missing.html", "/files/catalog.pdf", "/old-about", "/huge.html")
            }
            got["followed"] = await fetcher.fetch(shop.url("/old-about"))
            got["loop"] = await fetcher.fetch(shop.url("/loop/a"))
            got["bad"] = await fetcher.fetch("file:///etc/passwd")
            got["robots"] = await fetcher.robots(shop.base_url)
            tool_ = fetcher.as_tool()
            got["tool"] = await tool_.run({"url": shop.url("/go/staff")})
            return got
        finally:
            await fetcher.aclose()

    got = asyncio.run(main())
    home = got["/"]
    assert home.ok and home.status == 200 and home.title == "Gadget Shop"
    assert shop.url(S.LAPTOPS) in home.links and "var tracking" not in home.markdown
    assert "all rights reserved" not in home.markdown, "the footer is noise"
    assert "http://elsewhere.invalid/partner?id=1" in home.links
    assert not got["/missing.html"].ok and got["/missing.html"].note == "HTTP 404 Not Found"
    assert got["/files/catalog.pdf"].note == "skipped: application/pdf is not HTML or text"
    assert got["/old-about"].redirect == shop.url("/about.html") and not got["/old-about"].ok
    assert got["followed"].ok and got["followed"].final_url == shop.url("/about.html")
    assert got["loop"].note == "a redirect loop: " + " -> ".join(
        shop.url(p) for p in ("/loop/a", "/loop/b", "/loop/a")
    )
    assert "is not an http(s) URL" in got["bad"].note
    huge = got["/huge.html"]
    assert huge.ok and huge.truncated and huge.bytes == PAGE_BUDGET
    assert "cut at the byte budget of 262144 bytes" in huge.note
    (hit,) = shop.hit("/huge.html")
    assert hit.sent < S.HUGE_BYTES / 2, f"the fetcher stopped reading: the site wrote {hit.sent} bytes"
    robots = got["robots"]
    assert isinstance(robots, Robots) and robots.status == 200
    assert robots.allows(shop.url("/c/phones")) and not robots.allows(shop.url("/private/staff.html"))
    assert Robots(404).allows(shop.url("/private/x")) and not Robots(503).allows(shop.url("/"))
    result = got["tool"]
    assert result.ok and "robots.txt disallows " + shop.url("/private/payroll.html") in result.observation
    assert not shop.hit("/private/payroll.html"), (
        "the tool checked the redirect's target before requesting it"
    )


def test_the_fetcher_gives_up_on_a_slow_site(shop: S.Site) -> None:
    gate = shop.hold("/c/phones")

    async def main() -> tuple[Any, Any]:
        slow, late = (
            Fetcher(timeout=0.3, allow_private=True),
            Fetcher(timeout=5, deadline=0.3, allow_private=True),
        )
        try:
            return await slow.fetch(shop.url("/c/phones")), await late.fetch(shop.url("/c/phones"))
        finally:
            await slow.aclose()
            await late.aclose()

    try:
        timed_out, gave_up = asyncio.run(main())
    finally:
        gate.set()
    assert not timed_out.ok and timed_out.note.startswith("timed out after 0.3 s")
    assert not gave_up.ok and gave_up.note == "gave up after 0.3 s (the deadline of a fetch)"


def test_markdown_of_other_encodings_and_link_floods() -> None:
    latin = "<p>Caf\u00e9 cr\u00e8me \u20ac5</p>".encode("cp1252")
    assert (
        html_to_markdown(latin, "http://x.example/", encoding="cp1252")[1] == "Caf\u00e9 cr\u00e8me \u20ac5"
    )
    assert html_to_markdown(latin, "http://x.example/", encoding="no-such-codec")[1].startswith("Caf")
    flood = "".join(f"<a href='/p{i}'>p{i}</a> " for i in range(50)).encode()
    _, markdown, links, _ = html_to_markdown(flood, "http://x.example/", max_links=3)
    assert links == ["http://x.example/p0", "http://x.example/p1", "http://x.example/p2"]
    assert markdown.startswith(
        "[p0](http://x.example/p0) [p1](http://x.example/p1) [p2](http://x.example/p2) p3 p4"
    )


# -- the crawler ----------------------------------------------------------------------------


def test_the_crawler_reaches_the_answer_within_its_budgets(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler(budget=CrawlBudget(max_pages=60))
    result = crawl.agent.run(S.TASK, url=shop.url("/")).result(30)
    assert result.status is AgentStatus.FINISHED, result.reason
    assert result.answer == "Summary: The Zephyr 9 comes with a 3 year warranty (3 years).", (
        "the summary, once"
    )
    assert len(crawl.summary.requests) == 1
    assert "validated" in result.reason
    paths = served(shop)
    assert "/p/laptops/zephyr-9/specs.html" in paths and len(paths) <= 60
    assert max(Counter(shop.paths()).values()) == 1, "no URL is requested twice (robots.txt included)"
    assert shop.paths()[0] == "/robots.txt"
    assert not [p for p in paths if p.startswith("/private/")], "robots.txt disallows /private/"
    assert {"/old-about", "/go/staff", "/loop/a", "/loop/b", "/huge.html", "/missing.html"} <= set(paths)
    prompts = "\n".join(crawl.prompts())
    assert shop.base_url not in prompts and "elsewhere.invalid" not in prompts, "the model sees ids, not URLs"
    assert "Our partner" in prompts, "an off-site link keeps its text"
    for note in (
        "HTTP 404 Not Found",
        "skipped: application/pdf is not HTML or text",
        "a redirect loop (L",
        "the body was cut at the byte budget of 262144 bytes",
        "redirects to L",
        "(robots.txt disallows it)",
    ):
        assert note in prompts, note


def test_each_level_is_fetched_at_once(local: dflow.Runtime) -> None:
    with S.Site(S.shop(), delay=0.3) as site:
        crawl = crawler(budget=CrawlBudget(max_depth=1))
        result = crawl.agent.run(S.TASK, url=site.url("/")).result(30)
        level = [h for h in site.hits if h.path not in ("/robots.txt", "/", "/loop/b")]
    assert result.status is AgentStatus.ERROR and "depth budget of 1" in result.reason
    assert len(level) == 10
    assert max(h.start for h in level) < min(h.end for h in level), (
        "the pages of a level were in flight together"
    )

    with S.Site(S.shop(), delay=0.3) as site:
        crawl = crawler(budget=CrawlBudget(max_depth=1, concurrency=4))
        crawl.agent.run(S.TASK, url=site.url("/")).result(30)
        level = sorted((h for h in site.hits if h.path not in ("/robots.txt", "/")), key=lambda h: h.start)
    waves = [level[i : i + 4] for i in range(0, len(level), 4)]
    assert [len(w) for w in waves] == [4, 4, 3]
    for wave, after in itertools.pairwise(waves):
        assert max(h.start for h in wave) < min(h.end for h in wave), "a wave's pages are fetched together"
        assert min(h.start for h in after) >= max(h.end for h in wave), "at most 4 at once"


def test_the_ids_the_model_chooses_map_back_to_their_urls(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler(S.focused_research)
    run = crawl.agent.run(S.TASK, url=shop.url("/"))
    result = run.result(30)
    assert result.status is AgentStatus.FINISHED, result.reason
    home, category = crawl.prompts()[:2]
    laptops = [i for label, i in S._LINK.findall(home) if label in ("Laptops", "All laptops")]
    assert len(laptops) == 2 and laptops[0] == laptops[1], "two spellings of one URL, one id"
    (zephyr,) = [i for label, i in S._LINK.findall(category) if label == "Zephyr 9"]
    data = run.context()
    ns = data.get(f"dflow_agents/{crawl.agent.name}")
    chunks = sorted(
        (k for k in data.keys() if k.startswith(f"{ns}/map/")),
        key=lambda k: int(k.rsplit("/", 1)[1]),
    )
    urls = UrlMap()
    for key in chunks:
        urls.extend(data.get(key)["urls"])
    assert urls.url(laptops[0]) == shop.url(S.LAPTOPS)
    assert urls.url(zephyr) == shop.url("/p/laptops/zephyr-9.html")
    assert served(shop) == ["/", S.LAPTOPS, "/p/laptops/zephyr-9.html", "/p/laptops/zephyr-9/specs.html"]


def test_a_rejected_answer_sends_the_crawl_on(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler(S.focused_research)
    result = crawl.agent.run(S.TASK, url=shop.url("/")).result(30)
    assert result.status is AgentStatus.FINISHED
    assert result.answer == "Summary: The Zephyr 9 comes with a 3 year warranty (3 years)."
    verdicts = [r.messages[-1].content for r in crawl.validation.requests]
    assert len(verdicts) == 2 and "Candidate answer: Warranty: see the specifications." in verdicts[0]
    assert (
        "Warranty: see the specifications. (rejected: the pages do not give a number of years)"
        in crawl.prompts()[-1]
    )
    assert len(crawl.summary.requests) == 1


@pytest.mark.parametrize(
    ("budget", "reason", "fetched"),
    [
        (CrawlBudget(max_pages=2), "the page budget of 2 pages is spent", ["/", S.LAPTOPS]),
        (
            CrawlBudget(max_depth=2),
            "the depth budget of 2 is reached",
            ["/", S.LAPTOPS, "/p/laptops/zephyr-9.html"],
        ),
        (CrawlBudget(max_bytes=800), "the byte budget of 800 bytes is spent", ["/"]),
    ],
)
def test_budgets_stop_the_crawl(
    local: dflow.Runtime, shop: S.Site, budget: CrawlBudget, reason: str, fetched: list[str]
) -> None:
    crawl = crawler(S.focused_research, budget=budget)
    result = crawl.agent.run(S.TASK, url=shop.url("/")).result(30)
    assert result.status is AgentStatus.ERROR
    assert result.reason.startswith(reason), result.reason
    assert served(shop) == fetched
    assert result.answer == "Summary: the warranty could not be found.", "the summary still writes the answer"


def test_robots_txt_is_honoured_unless_switched_off(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler()
    result = crawl.agent.run(f"{S.TASK} Start at {shop.url('/private/staff.html')}.").result(30)
    assert result.status is AgentStatus.TERMINATED and result.reason.endswith(
        "nothing is left to follow after 0 pages (1 URLs disallowed by robots.txt)"
    )
    assert shop.paths() == ["/robots.txt"]
    crawl = crawler(scope=CrawlScope(respect_robots=False), budget=CrawlBudget(max_depth=0))
    result = crawl.agent.run(S.TASK, url=shop.url("/private/staff.html")).result(30)
    assert shop.paths() == ["/robots.txt", "/private/staff.html"]


BROWSER_PAGES = {
    "https://docs.example/": "# Docs\nRead [the guide](guide?b=2&a=1#top), [the old guide](/old) or go [home](https://docs.example/).",
    "https://docs.example/guide?a=1&b=2": "# Guide\nThe answer is 42. Back to [docs](/).",
}
BROWSED: list[str] = []


def _browse(url: str) -> str:
    BROWSED.append(url)
    if url not in BROWSER_PAGES:
        raise LookupError(f"no page {url}")
    return BROWSER_PAGES[url]


@tool
def browser(url: str) -> str:
    """A browser plug-in, played by a dict: markdown text."""
    return _browse(url)


@tool
def remote_browser(url: str) -> DFlow[str]:
    """The same, as a flow tool that waits before answering."""
    return DFlow.delay(url, 0.01).map(_browse).id("browse")


@tool
def page_browser(url: str) -> dict[str, Any]:
    """The same, answering with a page dict (links relative, listed apart)."""
    text = _browse(url)
    return {"title": text.split("\n")[0][2:], "content": text, "links": ["/", "mailto:team@docs.example", 7]}


def follow_all(inputs: dict[str, Any]) -> Research:
    SEEN.append(inputs)
    pages = inputs["pages"]
    found = next((p for p in pages if "42" in p.get("content", "")), None)
    return Research(
        found=found is not None,
        answer="42",
        sources=[found["id"]] if found else [],
        follow=[i for p in pages for i in p.get("links", ())],
    )


SEEN: list[dict[str, Any]] = []


async def summarize(inputs: dict[str, Any]) -> str:
    SEEN.append(inputs)
    return f"the answer: {inputs['answer']}"


@pytest.mark.parametrize(
    "tool_", [browser, remote_browser, page_browser], ids=["tool", "flow-tool", "page-dict"]
)
def test_any_tool_can_be_the_crawler(local: dflow.Runtime, tool_: Any) -> None:
    BROWSED.clear()
    SEEN.clear()
    agent = DeepCrawlerAgent(
        f"crawler-{next(_names)}",
        functions=CrawlFunctions(research=follow_all, validation=lambda inputs: True, summary=summarize),
        crawler=tool_,
        scope=CrawlScope(respect_robots=False),
    )
    result = agent.run("What is the answer? https://docs.example").result(30)
    assert result.status is AgentStatus.FINISHED and result.answer == "the answer: 42"
    assert BROWSED[0] == "https://docs.example/" and len(BROWSED) == 3
    assert set(BROWSED[1:]) == {"https://docs.example/guide?a=1&b=2", "https://docs.example/old"}
    home, level, summary = SEEN
    assert (
        home["pages"][0]["content"] == "# Docs\nRead [the guide](L1), [the old guide](L2) or go [home](L0)."
    )
    guide, old = sorted(level["pages"], key=lambda p: p["id"])
    assert guide["content"].startswith("# Guide\nThe answer is 42. Back to [docs](L0)"), guide
    assert "content" not in old and "LookupError: no page https://docs.example/old" in old["note"], old
    assert summary["answer"] == "42" and summary["validated"]


def test_bad_input_is_refused(local: dflow.Runtime) -> None:
    crawl = crawler()
    with pytest.raises(ValueError, match="a crawl needs a start URL"):
        crawl.agent.run("find something")
    with pytest.raises(ValueError, match="is not an http"):
        crawl.agent.run("find something", url="ftp://shop.example/")
    with pytest.raises(TypeError, match="give a model"):
        DeepCrawlerAgent("no-model", functions=CrawlFunctions(research=follow_all))
    with pytest.raises(ValueError, match="must take a 'url' argument"):
        DeepCrawlerAgent("bad-tool", FunctionModel(S.validate), crawler=tool(lambda page: page, name="x"))
    with pytest.raises(TypeError, match="crawler must be"):
        DeepCrawlerAgent("bad-crawler", FunctionModel(S.validate), crawler="curl")  # type: ignore[arg-type]
    for bad, name in (
        ({"max_pages": 0}, "max_pages"),
        ({"concurrency": -1}, "concurrency"),
        ({"max_depth": -1}, "max_depth"),
        ({"page_chars": True}, "page_chars"),
        ({"link_chars": -1}, "link_chars"),
    ):
        with pytest.raises(ValueError, match=f"CrawlBudget.{name} must be an int"):
            CrawlBudget(**bad)
    with pytest.raises(ValueError, match="CrawlFunctions.attempts must be an int >= 1"):
        CrawlFunctions(attempts=0)
    with pytest.raises(TypeError, match="CrawlFunctions.summary must be an AIFunction or a callable"):
        CrawlFunctions(summary="write it")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CrawlScope.same_site must be a bool"):
        CrawlScope(same_site="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="budget must be a CrawlBudget, got"):
        DeepCrawlerAgent("bad-group", FunctionModel(S.validate), budget={"max_pages": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1"):
        Fetcher(max_bytes=0)


def test_a_research_function_that_fails_stops_the_crawl(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler(lambda messages, tools: "I think we should look at the laptops")
    result = crawl.agent.run(S.TASK, url=shop.url("/")).result(30)
    assert result.status is AgentStatus.ERROR
    assert result.reason.startswith(
        "the research function failed: ValueError: the research reply holds no JSON"
    )
    assert result.answer == "" and not crawl.summary.requests, "no summary of a crawl whose model fails"


CALLS: Counter[str] = Counter()


def rate_limited_once(messages: Any, tools: Any) -> Any:
    CALLS[messages[-1].content[:200]] += 1
    if CALLS[messages[-1].content[:200]] == 1:
        raise ModelRateLimitError("slow down", retry_after=0.01)
    return S.focused_research(messages, tools)


def test_a_rate_limited_model_is_called_again(local: dflow.Runtime, shop: S.Site) -> None:
    CALLS.clear()
    crawl = crawler(rate_limited_once, retry_backoff=0.01)
    result = crawl.agent.run(S.TASK, url=shop.url("/")).result(30)
    assert result.status is AgentStatus.FINISHED
    assert set(CALLS.values()) == {2}, "each research prompt failed once, then was answered"
    assert max(Counter(served(shop)).values()) == 1, "a step run again fetches nothing again"


def test_the_session_remembers_the_task_and_the_answer(local: dflow.Runtime, shop: S.Site) -> None:
    memory = InMemoryChatMemory()
    crawl = crawler(S.focused_research, memory=memory)
    result = crawl.agent.run(S.TASK, url=shop.url("/"), session="ann").result(30)
    stored = asyncio.run(memory.load("ann"))
    assert stored == [ChatMessage.user(S.TASK), ChatMessage.assistant(result.answer)]


def test_the_crawler_as_the_tool_of_another_agent(local: dflow.Runtime, shop: S.Site) -> None:
    crawl = crawler(S.focused_research)
    browse = agent_tool(
        crawl.agent, name="crawl", description="Crawl a site (give the start URL) for an answer."
    )
    model = ScriptedModel(
        [
            reply(calls=[call("crawl", query=f"{S.TASK} Start at {shop.url('/')}")]),
            reply(
                "The Zephyr 9 has a 3-year warranty.",
                expect="Summary: The Zephyr 9 comes with a 3 year warranty",
            ),
        ]
    )
    boss = ToolCallAgent(f"boss-{next(_names)}", model, [browse])
    result = boss.run("How long is the Zephyr 9's warranty?").result(30)
    assert result.status is AgentStatus.FINISHED and result.answer == "The Zephyr 9 has a 3-year warranty."
    assert served(shop) == ["/", S.LAPTOPS, "/p/laptops/zephyr-9.html", "/p/laptops/zephyr-9/specs.html"]


# -- long index pages ------------------------------------------------------------------------

MODULES = [f"module{i:03d}" for i in range(400)]


def long_index() -> dict[str, S.Answer]:
    """A documentation site's shape: an index of 400 modules, one line each (about 30,000
    characters of markdown), the module asked about near its end, its page holding the answer."""
    entries = "".join(
        f"<li><a href='/lib/{m}.html'><code>{m}</code> — tools for task {i}</a></li>"
        for i, m in enumerate(MODULES)
    )
    entries = entries.replace("tools for task 371", "Compression compatible with gzip")
    return {
        "/": S.html(
            "The Library", f"<h1>The Library</h1><p>{'An introduction. ' * 30}</p><ul>{entries}</ul>"
        ),
        "/lib/module371.html": S.html(
            "module371", "<h1>module371</h1><p>The checksum function is crc32.</p>"
        ),
        **{
            f"/lib/{m}.html": S.html(m, f"<h1>{m}</h1><p>Nothing here.</p>")
            for m in MODULES
            if m != "module371"
        },
    }


def follow_by_text(words: tuple[str, ...]) -> Any:
    """Research as a model does it: only from the prompt, following the links whose text
    names one of ``words``; the answer is a page that says 'crc32'."""

    def research(messages: Any, tools: Any) -> ChatResponse:
        prompt = messages[-1].content
        follow = [i for text, i in S._LINK.findall(prompt) if any(w in text for w in words)]
        found = next((pid for pid, body in S.pages_of(prompt) if "crc32" in body), None)
        reply = {
            "found": found is not None,
            "answer": "crc32",
            "sources": [found] if found else [],
            "follow": follow,
        }
        return ChatResponse(content=json.dumps(reply))

    return research


def test_links_beyond_the_text_shown_of_a_long_index_page_are_listed_with_their_text(
    local: dflow.Runtime,
) -> None:
    model = FunctionModel(follow_by_text(("gzip",)))
    agent = DeepCrawlerAgent(
        f"crawler-{next(_names)}",
        functions=CrawlFunctions(
            research=research_function(model), validation=lambda i: True, summary=lambda i: i["answer"]
        ),
        crawler=Fetcher(allow_private=True),
        budget=CrawlBudget(max_pages=5),
    )
    with S.Site(long_index()) as site:
        result = agent.run("Which zlib function computes a checksum?", url=site.url("/")).result(30)
        served = list(S.served(site))
    assert result.status is AgentStatus.FINISHED and result.answer == "crc32", result.reason
    assert served == ["/", "/lib/module371.html"]
    home = model.requests[0].messages[-1].content
    text, listed = home.split("Links further down this page, not opened yet:\n")
    assert "Compression compatible with gzip" not in text, "the link lies beyond the 6,000 characters shown"
    assert len(text) < 6_000 + 1_000
    (entry,) = [line for line in listed.splitlines() if "gzip" in line]
    assert re.fullmatch(r"- \[`module371` — Compression compatible with gzip\]\(L\d+\)", entry), entry
    more = [line for line in listed.splitlines() if line.startswith("- [")]
    assert sum(len(line) for line in more) <= CrawlBudget().link_chars, "the list keeps to link_chars"


def test_links_listed_apart_leave_out_those_the_crawl_has_already(local: dflow.Runtime) -> None:
    seen: list[dict[str, Any]] = []

    def research(inputs: dict[str, Any]) -> Research:
        seen.append(inputs)
        return Research(follow=[i for p in inputs["pages"] for i, _ in p.get("more_links", ())][:1])

    agent = DeepCrawlerAgent(
        f"crawler-{next(_names)}",
        functions=CrawlFunctions(research=research, validation=lambda i: False, summary=lambda i: "done"),
        crawler=Fetcher(allow_private=True),
        budget=CrawlBudget(max_pages=3, page_chars=2_000, link_chars=600),
    )
    with S.Site(long_index()) as site:
        agent.run("find it", url=site.url("/")).result(30)
    home = seen[0]["pages"][0]
    shown = set(re.findall(r"\]\((L\d+)\)", home["content"]))
    more = home["more_links"]
    assert more and not shown & {i for i, _ in more}, "a link shown in the text is not listed again"
    assert sum(len(text) + len(i) + 6 for i, text in more) <= 600
    assert all(text.startswith("`module") for _, text in more), more
