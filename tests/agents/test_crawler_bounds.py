"""What the fetcher and the deep crawler refuse or bound, over sites served on 127.0.0.1
(tests/agents/site.py): credentials in links, compressed bodies (gzip and deflate inflated
within the byte budget, other encodings refused), charsets Python cannot decode text with,
private and loopback addresses (refused unless ``allow_private=True``), what ``same_site``
compares, the bytes a wave may read, and how much of a page and of the URL map a wave keeps.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
import time
import tracemalloc
import zlib
from collections.abc import Mapping
from typing import Any

import pytest

import dflow
import dflow_agents.crawler as crawler_module
import dflow_agents.fetch as fetch_module
from dflow_agents import AgentStatus
from dflow_agents._crawl_waves import shares, site_of
from dflow_agents.crawler import CrawlBudget, CrawlFunctions, DeepCrawlerAgent
from dflow_agents.fetch import Fetcher, Robots, html_to_markdown, normalize_url

from . import site as S

PAGE = (
    "<html><head><title>Packed</title></head><body><p>" + "squeezed words " * 2000 + "</p></body></html>"
).encode()
_names = iter(range(10**6))


def run_fetcher(fetcher: Fetcher, job: Any) -> Any:
    """``await job(fetcher)`` on a loop of its own, whose HTTP clients are closed after."""

    async def main() -> Any:
        try:
            return await job(fetcher)
        finally:
            await fetcher.aclose()

    return asyncio.run(main())


def recording(seen: list[Mapping[str, Any]], follow: bool = True) -> Any:
    """A research function that keeps its inputs and follows every link (or none)."""

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        seen.append(inputs)
        return {"follow": [i for p in inputs["pages"] for i in p.get("links", [])] if follow else []}

    return research


def agent(research: Any, **options: Any) -> DeepCrawlerAgent:
    options.setdefault("crawler", Fetcher(allow_private=True))
    functions = CrawlFunctions(
        research=research, validation=lambda inputs: False, summary=lambda inputs: "the summary"
    )
    return DeepCrawlerAgent(f"bounds-{next(_names)}", functions=functions, **options)


def _gzip_bomb(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()


# -- URLs ------------------------------------------------------------------------------------


def test_user_names_and_passwords_are_dropped_from_urls() -> None:
    assert normalize_url("http://user:pw@Shop.Example:8080/x") == "http://shop.example:8080/x"
    assert normalize_url("https://user@shop.example:443/x#f") == "https://shop.example/x"
    assert normalize_url("http://a:b@[::1]:80/") == "http://[::1]/"
    assert normalize_url("//evil:secret@shop.example/p", "http://shop.example/") == "http://shop.example/p"
    assert normalize_url("http://@shop.example/") == "http://shop.example/"


def test_same_site_compares_scheme_host_and_port() -> None:
    assert (
        site_of("HTTP://WWW.Shop.Example/x")
        == site_of("http://shop.example:80/y")
        == "http://shop.example:80"
    )
    assert site_of("https://shop.example/") == "https://shop.example:443" != site_of("http://shop.example/")
    assert site_of("https://shop.example:8443/") != site_of("https://shop.example/")
    assert site_of("http://[::1]:8080/") == "http://[::1]:8080"


def test_a_crawl_stays_on_its_scheme_host_and_port(local: dflow.Runtime) -> None:
    with S.Site({}) as other, S.Site({}) as site:
        port = site.base_url.rsplit(":", 1)[1]
        site.answers["/"] = S.html(
            "Home",
            f"<a href='{other.url('/x')}'>another port</a> "
            f"<a href='https://127.0.0.1:{port}/y'>https</a> <a href='/ok'>ok</a>",
        )
        site.answers["/ok"] = S.html("OK", "<p>ok</p>")
        seen: list[Mapping[str, Any]] = []
        result = agent(recording(seen)).run("find it", url=site.url("/")).result(30)
        assert result.status is AgentStatus.TERMINATED
        assert seen[0]["pages"][0]["links"] == ["L1"], seen[0]["pages"][0]
        assert "another port" in seen[0]["pages"][0]["content"] and "https" in seen[0]["pages"][0]["content"]
        assert list(S.served(site)) == ["/", "/ok"]
        assert other.paths() == []


# -- bodies ----------------------------------------------------------------------------------


def test_gzip_and_deflate_are_inflated_within_the_budget_and_other_encodings_refused() -> None:
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    answers = {
        "/gzip": S.encoded(gzip.compress(PAGE), "gzip"),
        "/x-gzip": S.encoded(gzip.compress(PAGE), "x-gzip"),
        "/deflate": S.encoded(zlib.compress(PAGE), "deflate"),
        "/raw-deflate": S.encoded(raw.compress(PAGE) + raw.flush(), "deflate"),
        "/identity": S.encoded(PAGE, "identity"),
        "/cut": S.encoded(gzip.compress(PAGE), "gzip"),
        "/br": S.encoded(b"\x1b\x03\x00\xf8\xa5\x00", "br"),
        "/zstd": S.encoded(b"(\xb5/\xfd\x00X\x00\x00", "zstd"),
        "/twice": S.encoded(gzip.compress(gzip.compress(PAGE)), "gzip, gzip"),
        "/corrupt": S.encoded(b"this is no gzip at all", "gzip"),
    }
    with S.Site(answers) as site:

        async def job(fetcher: Fetcher) -> dict[str, Any]:
            got = {p: await fetcher.fetch(site.url(p)) for p in answers if p != "/cut"}
            got["/cut"] = await fetcher.fetch(site.url("/cut"), max_bytes=1000)
            return got

        got = run_fetcher(Fetcher(allow_private=True), job)
        assert {h.accept_encoding for h in site.hits} == {"gzip, deflate"}, (
            "no encoding it cannot bound is asked for"
        )
    for path in ("/gzip", "/x-gzip", "/deflate", "/raw-deflate", "/identity"):
        page = got[path]
        assert page.ok and page.title == "Packed" and page.bytes == len(PAGE) and not page.truncated, (
            path,
            page.note,
        )
        assert page.markdown.startswith("squeezed words squeezed words"), path
    cut = got["/cut"]
    assert cut.ok and cut.truncated and cut.bytes == 1000 and "byte budget of 1000 bytes" in cut.note
    for coding in ("br", "zstd"):
        page = got[f"/{coding}"]
        assert not page.ok and page.note == (
            f"not read: the body is encoded as '{coding}', which the fetcher does "
            "not read (it asks for gzip, deflate)"
        )
    assert not got["/twice"].ok and "the body is encoded 2 times (gzip, gzip)" in got["/twice"].note
    assert not got["/corrupt"].ok and got["/corrupt"].note.startswith("not read: the gzip body is corrupt")


def test_a_gzip_bomb_as_robots_txt_is_read_to_512_kib_only() -> None:
    bomb = _gzip_bomb(64 << 20)
    with S.Site({"/robots.txt": S.encoded(bomb, "gzip", "text/plain")}) as site:
        tracemalloc.start()
        try:
            robots = run_fetcher(Fetcher(allow_private=True), lambda f: f.robots(site.base_url))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert robots.status == 200 and len(robots.text) == 512 * 1024
    assert peak < 16 * 1024 * 1024, f"reading 512 KiB of robots.txt allocated {peak / 1e6:.0f} MB"


def test_a_gzip_bomb_page_is_cut_at_the_byte_budget_without_inflating_it() -> None:
    bomb = _gzip_bomb(128 << 20)
    with S.Site({"/bomb": S.encoded(bomb, "gzip", "text/html")}) as site:
        tracemalloc.start()
        try:
            page = run_fetcher(
                Fetcher(allow_private=True, max_bytes=100_000), lambda f: f.fetch(site.url("/bomb"))
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert page.ok and page.truncated and page.bytes == 100_000, page.note
    assert peak < 16 * 1024 * 1024, f"reading a 100 KB budget allocated {peak / 1e6:.0f} MB"


@pytest.mark.parametrize("resolved", ["idna", "base64", "uu", None])
def test_a_page_not_in_utf8_whose_meta_charset_python_cannot_decode_text_with_reads_as_windows_1252(
    resolved: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What w3lib resolves a ``<meta charset>`` to differs between its releases (2.6 keeps to
    the labels browsers know): here it resolves the page's to a codec Python has but cannot
    decode text with, or to none."""
    from dflow_agents import _markdown

    monkeypatch.setattr(_markdown, "html_body_declared_encoding", lambda _: resolved)
    html = f'<html><head><meta charset="{resolved}"></head><body><p>Caf\u00e9 \u20ac5</p></body></html>'
    title, markdown, *_ = html_to_markdown(html.encode("cp1252"), "http://x.example/")
    assert markdown == "Caf\u00e9 \u20ac5", (resolved, title, markdown)


def test_charsets_python_cannot_decode_text_with_fall_back_to_utf8() -> None:
    body = "h\u00e9llo w\u00f6rld".encode()
    answers = {
        f"/{c}.{kind}": S.file(
            f"text/{kind}; charset={c}", b"<p>" + body + b"</p>" if kind == "html" else body
        )
        # (not x-user-defined: w3lib 2.6 registers a codec of that name, as browsers decode it)
        for c in ("idna", "base64", "rot13", "uu", "bogus")
        for kind in ("plain", "html")
    }
    with S.Site(answers) as site:

        async def job(fetcher: Fetcher) -> dict[str, Any]:
            return {p: await fetcher.fetch(site.url(p)) for p in answers}

        got = run_fetcher(Fetcher(allow_private=True), job)
    for path, page in got.items():
        assert page.ok and page.markdown == "h\u00e9llo w\u00f6rld", (path, page.note, page.markdown)


def test_a_fetch_may_lower_the_byte_budget_but_not_raise_it(shop: S.Site) -> None:
    async def job(fetcher: Fetcher) -> list[Any]:
        return [
            await fetcher.fetch(shop.url("/huge.html"), max_bytes=5000),
            await fetcher.fetch(shop.url("/huge.html"), max_bytes=10**9),
        ]

    lowered, capped = run_fetcher(Fetcher(allow_private=True, max_bytes=20_000), job)
    assert lowered.truncated and lowered.bytes == 5000 and "byte budget of 5000 bytes" in lowered.note
    assert capped.truncated and capped.bytes == 20_000
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1"):
        run_fetcher(Fetcher(allow_private=True), lambda f: f.fetch(shop.url("/"), max_bytes=0))


# -- addresses -------------------------------------------------------------------------------


def test_the_fetcher_keeps_to_public_addresses_unless_allowed(shop: S.Site) -> None:
    port = shop.base_url.rsplit(":", 1)[1]
    targets = {
        shop.url("/"): "127.0.0.1 is",
        f"http://localhost:{port}/": "localhost (",
        f"http://[::1]:{port}/": "::1 is",
        f"http://[::ffff:127.0.0.1]:{port}/": "::ffff:7f00:1",
        f"http://0.0.0.0:{port}/": "0.0.0.0 is",
        # w3lib 2.6 reads the number as the address, as browsers do; earlier releases leave it
        f"http://2130706433:{port}/": "127.0.0.1",
        "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is",
        "http://10.0.0.1/": "10.0.0.1 is",
        "http://192.168.1.1/": "192.168.1.1 is",
        "http://100.64.0.1/": "100.64.0.1 is",
        "http://224.0.0.1/": "224.0.0.1 is",
        "http://[fe80::1]/": "fe80::1 is",
        "http://[fd00::1]/": "fd00::1 is",
    }
    fetcher = Fetcher()
    tool = fetcher.as_tool(f"fetch_{next(_names)}")

    async def job(f: Fetcher) -> tuple[dict[str, Any], Any, Any]:
        pages = {u: await f.fetch(u) for u in targets}
        return pages, await f.robots(shop.base_url), await tool.run({"url": shop.url("/c/phones")})

    pages, robots, result = run_fetcher(fetcher, job)
    for url, shown in targets.items():
        note = pages[url].note
        assert not pages[url].ok and note.startswith("not fetched: ") and shown in note, (url, note)
        assert "private, loopback, link-local or reserved address" in note and "allow_private=True" in note
    assert robots.status == 404, "robots.txt is not asked of an address the fetcher refuses"
    assert "127.0.0.1 is a private, loopback, link-local or reserved address" in result.observation
    assert shop.paths() == [], "nothing was requested"
    allowed = run_fetcher(Fetcher(allow_private=True), lambda f: f.fetch(shop.url("/")))
    assert allowed.ok and allowed.title == "Gadget Shop"
    with pytest.raises(TypeError, match="allow_private must be a bool"):
        Fetcher(allow_private="yes")  # type: ignore[arg-type]


def test_each_redirect_hop_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 plays a public site (the check lets it through); it redirects to localhost."""
    real = fetch_module.refusal

    async def public_127(url: str) -> str | None:
        return None if url.startswith("http://127.0.0.1:") else await real(url)

    monkeypatch.setattr(fetch_module, "refusal", public_127)
    with S.Site({}) as site:
        port = site.base_url.rsplit(":", 1)[1]
        site.answers["/go"] = S.redirect(f"http://localhost:{port}/inside")
        site.answers["/inside"] = S.html("Inside", "<p>the intranet</p>")
        page = run_fetcher(Fetcher(), lambda f: f.fetch(site.url("/go")))
        assert site.paths() == ["/go"]
    assert not page.ok and page.final_url == f"http://localhost:{port}/inside"
    assert page.note.startswith("not fetched: localhost (") and "allow_private=True" in page.note


def test_a_crawl_of_a_private_address_says_why_nothing_was_read(local: dflow.Runtime, shop: S.Site) -> None:
    seen: list[Mapping[str, Any]] = []
    result = agent(recording(seen), crawler=Fetcher()).run("find it", url=shop.url("/")).result(30)
    assert result.status is AgentStatus.TERMINATED and result.answer == "the summary"
    assert result.reason.startswith(
        "no validated answer: nothing is left to follow after 1 pages; no page could "
        "be read: L0: not fetched: 127.0.0.1 is a private"
    ), result.reason
    assert shop.paths() == [] and seen == []


# -- what a wave reads and keeps -------------------------------------------------------------


def test_a_wave_keeps_a_bounded_part_of_a_flood_of_long_links(local: dflow.Runtime) -> None:
    pad = "z" * 2000
    answers = {"/": S.html("Home", "".join(f"<a href='/p{i}'>p{i}</a> " for i in range(3)))}
    for i in range(3):
        answers[f"/p{i}"] = S.file(
            "text/html", "".join(f"<a href='/q{i}-{j}-{pad}'>l{j}</a>" for j in range(400)).encode()
        )
    seen: list[Mapping[str, Any]] = []

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:  # the home page's links, then none
        return recording(seen, follow=inputs["depth"] == 0)(inputs)

    crawl = agent(research, crawler=Fetcher(allow_private=True, max_chars=2_000_000))  # keeps the flood
    with S.Site(answers) as site:
        run = crawl.run("find it", url=site.url("/"))
        result = run.result(60)
    assert result.status is AgentStatus.TERMINATED and result.answer == "the summary"
    _, level = seen
    assert len(level["pages"]) == 3
    for page in level["pages"]:
        assert 0 < len(page["links"]) < 400, len(page["links"])
        assert "links left out (their text stays)" in page["note"], page["note"]
        assert "http" not in page["content"], "a link left out (or cut) keeps its text, never its URL"
        assert set(re.findall(r"\]\((L\d+)\)", page["content"])) <= set(page["links"])
    data = run.context()
    ns = data.get(f"dflow_agents/{crawl.name}")
    sizes = [sum(map(len, data.get(k)["urls"])) for k in data.keys() if k.startswith(f"{ns}/map/")]
    assert max(sizes) <= 2_000_000 and sum(sizes) > 600_000, sizes


def test_a_value_still_over_the_limit_ends_the_crawl_with_error(
    local: dflow.Runtime, shop: S.Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crawl's bounds keep its values small; a store that counts a map chunk 100,000 times
    larger stands for one whose limit they would not meet."""
    real = crawler_module.encoded_size
    monkeypatch.setattr(
        crawler_module, "encoded_size", lambda value: real(value) * (100_000 if "urls" in value else 1)
    )
    seen: list[Mapping[str, Any]] = []
    result = agent(recording(seen)).run("find it", url=shop.url("/")).result(30)
    assert result.status is AgentStatus.ERROR and result.answer == "the summary"
    assert result.reason.startswith("the URLs this level adds to the crawl's map would take about "), (
        result.reason
    )
    assert "over the store's limit of 8388608 bytes on one value: the crawl stops here" in result.reason
    assert list(S.served(shop)) == ["/"] and len(seen) == 1


def test_markdown_cut_inside_a_link_keeps_no_part_of_its_url() -> None:
    html = (
        b"<p>"
        + b"".join(b"<a href='/page-%d-%s'>link %d</a> " % (i, b"x" * 50, i) for i in range(20))
        + b"</p>"
    )
    for limit in range(40, 900, 7):
        _, markdown, links, cut = html_to_markdown(html, "http://shop.example/", max_chars=limit)
        assert cut and markdown.endswith("[... cut]") and len(markdown) <= limit + len("\n\n[... cut]")
        whole = re.findall(r"\]\((http[^)]*)\)", markdown)
        assert markdown.count("](") == len(whole) and set(whole) <= set(links), (limit, markdown)


def test_a_flood_of_long_links_ends_the_crawl_with_a_result(local: dflow.Runtime) -> None:
    pad = "z" * 1800
    answers = {"/": S.html("Home", "".join(f"<a href='/p{i}'>p{i}</a>" for i in range(6)))}
    for i in range(6):
        answers[f"/p{i}"] = S.file(
            "text/html", "".join(f"<a href='/q{i}-{j}-{pad}'>l</a>" for j in range(1000)).encode()
        )

    def research(inputs: Mapping[str, Any]) -> dict[str, Any]:
        if inputs["depth"] == 0:
            return {"follow": [i for p in inputs["pages"] for i in p.get("links", [])]}
        return {"follow": []}

    with S.Site(answers) as site:
        run = agent(research, crawler=Fetcher(allow_private=True, max_chars=4_000_000)).run(
            "find it", url=site.url("/")
        )
        try:
            result = run.result(60)
        except dflow.RunFailedError as exc:
            pytest.fail(f"the crawl's run failed instead of ending with a result: {str(exc)[:300]}")
    assert result.answer == "the summary"


# -- deadlines, budgets and unreachable sites --------------------------------------------------


def test_a_robots_txt_sent_a_byte_at_a_time_is_given_up_at_the_fetch_deadline(local: dflow.Runtime) -> None:
    """A robots.txt that drips a byte at a time never trips the read timeout; the fetch's
    deadline bounds it, and the crawl says the site could not be reached."""
    robots = b"User-agent: *\n" + b"Disallow: /private/\n" * 20
    answers = {"/robots.txt": S.drip(robots, 0.1), "/": S.html("Home", "<p>home</p>")}
    fetcher = Fetcher(allow_private=True, timeout=2, deadline=0.8)
    with S.Site(answers) as site:
        t0 = time.monotonic()
        rules = run_fetcher(fetcher, lambda f: f.robots(site.base_url))
        took = time.monotonic() - t0
        assert took < 2, f"robots() took {took:.1f} s for a deadline of 0.8 s"
        assert rules.unreachable and not rules.allows(site.url("/"))
        assert (
            rules.note
            == f"{site.url('/robots.txt')} gave no whole answer within 0.8 s (the deadline of a fetch)"
        )
        t0 = time.monotonic()
        result = agent(recording([]), crawler=fetcher).run("find it", url=site.url("/")).result(30)
        took = time.monotonic() - t0
        served = list(S.served(site))
    assert took < 5, f"the crawl took {took:.1f} s"
    assert result.status is AgentStatus.TERMINATED and served == []
    assert "disallowed by robots.txt" not in result.reason
    assert result.reason.endswith(
        "(1 URLs not fetched because their site could not be reached: "
        f"{site.url('/robots.txt')} gave no whole answer within 0.8 s (the deadline of a fetch) "
        "(nothing is fetched from a site whose robots.txt cannot be read))"
    ), result.reason


def test_an_unreachable_site_is_reported_as_unreachable_not_as_disallowed(local: dflow.Runtime) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = agent(recording([])).run("find it", url=closed + "/").result(30)
    assert result.status is AgentStatus.TERMINATED and "disallowed" not in result.reason
    assert "1 URLs not fetched because their site could not be reached: " in result.reason, result.reason
    assert f"{closed}/robots.txt could not be read: ConnectError" in result.reason, result.reason
    with S.Site({"/robots.txt": S.status(503), "/": S.html("Home", "<p>home</p>")}) as site:
        result = agent(recording([])).run("find it", url=site.url("/")).result(30)
        assert list(S.served(site)) == [], "RFC 9309: a robots.txt answering 5xx disallows everything"
    assert "disallowed" not in result.reason
    assert f"could not be reached: {site.url('/robots.txt')} answered HTTP 503" in result.reason, (
        result.reason
    )
    assert not Robots(503).allows(site.url("/")) and Robots(503).unreachable and not Robots(404).unreachable


class CountingFetcher(Fetcher):
    """The built-in fetcher, counting the body bytes of each page it reads."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.read: list[int] = []

    async def fetch(self, url: str, **options: Any) -> Any:
        page = await super().fetch(url, **options)
        self.read.append(page.bytes)
        return page


def test_the_byte_budget_is_never_exceeded_when_a_wave_shares_it() -> None:
    assert shares(1003, 4) == [251, 251, 251, 250]
    for left in range(1, 200):
        for pages in range(1, min(left, 17) + 1):
            split = shares(left, pages)
            assert sum(split) == left and max(split) - min(split) <= 1 and min(split) >= 1, (left, pages)


def test_a_crawl_reads_no_more_than_its_byte_budget(local: dflow.Runtime) -> None:
    """The shape the issue measured: the bytes left (1003) do not divide by the wave's pages
    (4), and each page is longer than its share; rounded up, the wave read 1004."""
    home = S.html("Home", "".join(f"<a href='/p{i}'>p{i}</a>" for i in range(4)))
    answers = {"/": home, **{f"/p{i}": S.html(f"P{i}", "<p>" + "y" * 5000 + "</p>") for i in range(4)}}
    with S.Site(answers) as site:
        fetcher = CountingFetcher(allow_private=True)
        home_bytes = run_fetcher(Fetcher(allow_private=True), lambda f: f.fetch(site.url("/"))).bytes
        budget = CrawlBudget(max_bytes=home_bytes + 1003)
        result = (
            agent(recording([]), crawler=fetcher, budget=budget).run("find it", url=site.url("/")).result(30)
        )
    assert result.status is AgentStatus.ERROR and "byte budget" in result.reason, result.reason
    assert fetcher.read[0] == home_bytes and sorted(fetcher.read[1:]) == [250, 251, 251, 251]
    assert sum(fetcher.read) == budget.max_bytes, (
        f"{sum(fetcher.read)} bytes read for a budget of {budget.max_bytes}"
    )
