"""The browser plug-in of the assistant, over the HTTP API of ``dflow serve``.

It starts a chat (``POST /runs`` of the assistant's pipeline, in a new session unless given
a session token), follows the run's steps as server-sent events, and meanwhile pulls the
session's jobs (``GET /jobs``, a long poll) and does them: ``fetch_page`` fetches a page of
the shop with httpx (only on the shop's own host, never with the session's token) and
reports it as markdown with its links; ``ask_user`` shows the question and its choices
(the first one is taken when no one is at the keyboard). Then it prints the plan, the steps
and the answer::

    python -m examples.assistant.client --server http://127.0.0.1:8000 --admin-token "$DFLOW_SERVER_TOKEN"

Without ``--shop`` it serves the demo shop itself and browses that. ``run_local`` uses the
same :class:`Plugin` against an in-process server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from dflow_agents import html_to_markdown

__all__ = [
    "DEFAULT_QUERY",
    "PIPELINE",
    "ClientError",
    "Outcome",
    "Plugin",
    "ask_stdin",
    "first_choice",
    "main",
    "print_outcome",
]

PIPELINE = "planning.assistant"
DEFAULT_QUERY = "What should I wear this spring? Something casual, please."
MAX_PAGE_BYTES = 2_000_000  # of a page's body read
MAX_PAGE_CHARS = 20_000  # of its markdown reported
MAX_REDIRECTS = 5

Chooser = Callable[[str, Sequence[str]], Awaitable[int]]
Printer = Callable[[str], None]


class ClientError(Exception):
    """The server refused the plug-in (a bad token, an unknown pipeline...) or cannot be reached."""


class _Refused(Exception):
    """A job the plug-in will not or cannot do; reported as the job's error."""


@dataclass
class Outcome:
    """How a chat went: the run's final state, and the jobs the plug-in did."""

    trace_id: str
    session: str
    status: str  #: the run's status: done, failed, cancelled
    result: Any = None  #: the planning flow's result (JSON), when done
    error: Any = None
    jobs: list[dict[str, Any]] = field(
        default_factory=list
    )  #: each: id, tool, arguments, report, http status
    steps: list[dict[str, Any]] = field(default_factory=list)  #: the run's step events

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "session": self.session,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "jobs": self.jobs,
            "steps": self.steps,
        }


async def first_choice(question: str, choices: Sequence[str]) -> int:
    """Take the first choice (no one is at the keyboard)."""
    return 0


async def ask_stdin(question: str, choices: Sequence[str]) -> int:
    """Ask on the terminal; Enter (or anything that is not a choice's number) takes the first."""
    lines = [
        f"  ? {question}",
        *(f"    {n}. {c}" for n, c in enumerate(choices, 1)),
        f"    your choice (1-{len(choices)}, Enter for 1): ",
    ]
    print("\n".join(lines), end="", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    text = line.strip()
    return int(text) - 1 if text.isdigit() and 1 <= int(text) <= len(choices) else 0


class Plugin:
    """The plug-in of one session on ``server`` (see the module).

    Args:
        token: a session token (the chat joins that session); else ``admin_token`` (or none,
            on a server without one) starts a new session.
        allowed_sites: where it fetches pages from, each ``host:port`` (default: the site of
            the page the chat is about); any other URL is refused, as a plug-in must not let
            a model browse the user's network.
        choose: picks the answer of an ``ask_user`` job.
        out: where progress lines go.
    """

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        admin_token: str | None = None,
        allowed_sites: Iterable[str] = (),
        choose: Chooser = first_choice,
        out: Printer = print,
        poll_wait: float = 10.0,
    ) -> None:
        if not server.startswith(("http://", "https://")):
            raise ClientError(f"the server is an http(s) URL, got {server!r}")
        self.server = server.rstrip("/")
        self.token = token
        self.admin_token = admin_token
        self.allowed_sites = {s.lower() for s in allowed_sites}
        for site in self.allowed_sites:
            if not site.rpartition(":")[2].isdigit() or not site.rpartition(":")[0]:
                raise ClientError(f"an allowed site is host:port (as in 127.0.0.1:8001), got {site!r}")
        self.choose = choose
        self.out = out
        self.poll_wait = poll_wait

    # -- the chat ------------------------------------------------------------------------------

    async def chat(self, query: str, *, page: str | None = None, timeout: float = 600.0) -> Outcome:
        """Start a chat about ``page`` (the shop the user is on), do its jobs until the run
        ends, and return how it went."""
        text = f"{query}\n(I am browsing the shop at {page})" if page else query
        sites = set(self.allowed_sites) or ({_site(page)} if page else set())
        async with (
            httpx.AsyncClient(base_url=self.server, timeout=httpx.Timeout(30.0, read=60.0)) as api,
            httpx.AsyncClient(timeout=10.0, trust_env=False) as web,
        ):
            outcome = await self._start(api, text)
            self.out(f"chat {outcome.trace_id} started in session {outcome.session}")
            work = asyncio.ensure_future(self._work(api, web, sites, outcome))
            follow = asyncio.ensure_future(self._follow(api, outcome))
            try:
                done, _ = await asyncio.wait(
                    {work, follow}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    await self._cancel(api, outcome.trace_id, f"the plug-in gave up after {timeout:g} s")
                    raise ClientError(f"the chat did not end within {timeout:g} s (it was cancelled)")
                if work in done:  # it ends only when it failed
                    work.result()
                follow.result()
            finally:
                for task in (work, follow):
                    task.cancel()
                await asyncio.gather(work, follow, return_exceptions=True)
        return outcome

    async def _cancel(self, api: httpx.AsyncClient, trace_id: str, reason: str) -> None:
        try:
            await api.post(f"/runs/{trace_id}/cancel", headers=self._headers(), json={"reason": reason})
        except httpx.HTTPError:
            pass  # the run's own timers end its waits

    def _headers(self) -> dict[str, str]:
        token = self.token or self.admin_token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _start(self, api: httpx.AsyncClient, text: str) -> Outcome:
        try:
            r = await api.post("/runs", headers=self._headers(), json={"pipeline": PIPELINE, "param": text})
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the server {self.server}: {type(exc).__name__}: {exc}") from None
        _check(r, "starting the chat")
        body = r.json()
        self.token = body.get("token") or self.token  # a new session's token: this plug-in's from now on
        if not self.token:
            raise ClientError("the server started the chat but gave no session token: pass --token")
        return Outcome(trace_id=body["trace_id"], session=body["session"], status="running")

    # -- following the run -----------------------------------------------------------------------

    async def _follow(self, api: httpx.AsyncClient, outcome: Outcome) -> None:
        """The run's steps as they commit, until its end (reconnecting after a cut)."""
        last: str | None = None
        for attempt in range(6):
            headers = {**self._headers(), **({"Last-Event-ID": last} if last else {})}
            try:
                async with api.stream(
                    "GET",
                    f"/runs/{outcome.trace_id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(30.0, read=None),
                ) as r:
                    if r.status_code != 200:
                        await r.aread()
                        _check(r, "following the chat")
                    async for event, data, event_id in _sse(r.aiter_lines()):
                        last = event_id or last
                        if not isinstance(data, dict):
                            continue  # not an event of dflow serve
                        if event == "step":
                            outcome.steps.append(data)
                            self._show_step(data)
                        elif event in ("end", "error"):
                            outcome.status = data.get("status", "expired")
                            outcome.result, outcome.error = data.get("result"), data.get("error")
                            return
            except httpx.TransportError as exc:
                self.out(f"  (the event stream was cut: {type(exc).__name__}; reconnecting)")
            await asyncio.sleep(0.2 * (attempt + 1))
        raise ClientError("the event stream kept breaking off before the chat ended")

    def _show_step(self, step: dict[str, Any]) -> None:
        node = str(step.get("key") or "").split("/", 1)[0].split(">", 1)[0]  # the step's own node
        output, status = step.get("output"), step.get("status")
        if status == "done" and node == "record" and isinstance(output, dict) and output.get("steps"):
            last = output["steps"][-1]
            self.out(
                f"  step {last.get('index')} {last.get('status')}: {_short(last.get('answer') or last.get('reason'))}"
            )
        elif status == "done" and node == "finalize":
            self.out("  the plan is done; its summary is written")
        elif status in ("failed", "retrying"):
            self.out(f"  {node}: {status}: {_short(step.get('error'))}")

    # -- doing jobs ------------------------------------------------------------------------------

    async def _work(
        self, api: httpx.AsyncClient, web: httpx.AsyncClient, sites: set[str], outcome: Outcome
    ) -> None:
        """Pull the session's jobs and do each (at once), until cancelled."""
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                r = await api.get(
                    "/jobs",
                    headers=self._headers(),
                    params={"wait": self.poll_wait, "limit": 20},
                    timeout=httpx.Timeout(30.0, read=self.poll_wait + 30),
                )
                _check(r, "pulling jobs")
                for job in r.json()["jobs"]:
                    task = asyncio.ensure_future(self._do(api, web, sites, job, outcome))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            for task in running:
                task.cancel()

    async def _do(
        self,
        api: httpx.AsyncClient,
        web: httpx.AsyncClient,
        sites: set[str],
        job: dict[str, Any],
        outcome: Outcome,
    ) -> None:
        tool, args = job.get("tool"), job.get("arguments") or {}
        try:
            if tool == "fetch_page":
                self.out(f"  fetching {str(args.get('url'))[:200]}")
                body: dict[str, Any] = {"result": await _fetch(web, args.get("url"), sites)}
            elif tool == "ask_user":
                body = {"result": await self._ask(args)}
            else:
                raise _Refused(f"this plug-in does not do {str(tool)[:64]!r} jobs")
        except _Refused as exc:
            self.out(f"  job {tool} refused: {exc}")
            body = {"error": str(exc)}
        except Exception as exc:
            self.out(f"  job {tool} failed: {type(exc).__name__}: {exc}")
            body = {"error": f"the plug-in failed: {type(exc).__name__}: {str(exc)[:500]}"}
        try:
            r = await api.post(f"/jobs/{job['id']}", headers=self._headers(), json=body)
        except httpx.HTTPError as exc:  # the job's timeout tells the run
            self.out(f"  job {tool} could not be reported: {type(exc).__name__}: {exc}")
            status = 0
        else:
            status = r.status_code
            if status >= 400:  # 409 answered already, 410 too late (the run went on without it)...
                self.out(f"  job {tool} not taken: HTTP {status}: {_detail(r)}")
        outcome.jobs.append(
            {"id": job["id"], "tool": tool, "arguments": args, "report": body, "http": status}
        )

    async def _ask(self, args: dict[str, Any]) -> str:
        question, choices = args.get("question"), args.get("choices")
        if (
            not isinstance(question, str)
            or not isinstance(choices, list)
            or not 1 <= len(choices) <= 3
            or not all(isinstance(c, str) for c in choices)
        ):
            raise _Refused("a question to the user is a text and one to three choices (texts)")
        pick = await self.choose(question, choices)
        answer = str(choices[pick if 0 <= pick < len(choices) else 0])
        self.out(f"  asked: {question} -> {answer}")
        return answer


def _site(url: str) -> str:
    """``host:port`` of an http(s) URL (the default port written out)."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port that is not a number
        port = 0
    return f"{(parts.hostname or '').lower()}:{port}"


async def _fetch(web: httpx.AsyncClient, url: Any, sites: set[str]) -> dict[str, Any]:
    """The page at ``url`` as the report of a ``fetch_page`` job; redirects followed, but
    only on ``sites``."""
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise _Refused(f"not an http(s) URL: {str(url)[:200]!r}")
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        site = _site(current)
        if site not in sites:
            allowed = ", ".join(sorted(sites)) or "no site (give the page the chat is about)"
            raise _Refused(f"this plug-in only opens pages of {allowed}, not of {site}")
        try:
            async with web.stream("GET", current) as r:
                if r.is_redirect and r.headers.get("location"):
                    current = urljoin(current, r.headers["location"])
                    continue
                if r.status_code >= 400:
                    raise _Refused(f"HTTP {r.status_code} {r.reason_phrase}".strip())
                ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
                if ctype not in ("", "text/html", "application/xhtml+xml", "text/plain"):
                    raise _Refused(f"not a web page: {ctype}")
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) >= MAX_PAGE_BYTES:
                        break
                encoding = r.charset_encoding
        except httpx.HTTPError as exc:
            raise _Refused(f"the page could not be fetched: {type(exc).__name__}: {str(exc)[:200]}") from None
        final = current if current != url else None
        if ctype == "text/plain":
            text = bytes(body).decode(encoding or "utf-8", "replace")[:MAX_PAGE_CHARS]
            return {"markdown": text, "final_url": final}
        title, markdown, links, _ = html_to_markdown(
            bytes(body), current, encoding=encoding, max_chars=MAX_PAGE_CHARS, max_links=300
        )
        return {"title": title, "markdown": markdown, "links": links, "final_url": final}
    raise _Refused(f"more than {MAX_REDIRECTS} redirects from {url[:200]}")


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, Any, str | None]]:
    """``(event, data, id)`` of each server-sent event (its data decoded as JSON, or as text
    when it is not JSON)."""
    event, event_id = "message", None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield event, _json("\n".join(data)), event_id
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            event_id = line[3:].strip()
    if data:
        yield event, _json("\n".join(data)), event_id


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail"))[:500]
    except ValueError:
        return r.text[:500]


def _check(r: httpx.Response, doing: str) -> None:
    if r.status_code >= 400:
        raise ClientError(f"{doing}: HTTP {r.status_code}: {_detail(r)}")


def _short(text: Any, limit: int = 160) -> str:
    s = " ".join(str(text or "").split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def print_outcome(outcome: Outcome, out: Printer = print) -> None:
    """The plan, the steps and the answer (or why there is none)."""
    result = outcome.result if isinstance(outcome.result, dict) else {}
    if outcome.status != "done" or not result:
        out(f"\nthe chat ended {outcome.status}: {outcome.error}")
        return
    out("\n" + (result.get("plan_text") or "(no plan)").rstrip())
    out("\nResults of the steps:")
    for s in result.get("steps") or ():
        out(
            f"  {s['index']}. [{s['status']}] {s['step']}\n     {_short(s.get('answer') or s.get('reason'), 400)}"
        )
    out(f"\n{str(result.get('status', '')).upper()}: {result.get('answer', '')}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module)."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.assistant.client",
        description="The assistant's browser plug-in, over dflow serve's HTTP API.",
    )
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="dflow serve's URL")
    parser.add_argument("--token", default=None, help="a session token (default: start a new session)")
    parser.add_argument(
        "--admin-token",
        default=os.environ.get("DFLOW_SERVER_TOKEN"),
        help="the server's admin token, to start a new session (default: $DFLOW_SERVER_TOKEN)",
    )
    parser.add_argument("--query", default=DEFAULT_QUERY, help="what to ask the assistant")
    parser.add_argument(
        "--shop", default=None, help="the shop the user browses (default: serve the demo shop here)"
    )
    parser.add_argument(
        "--allow-site",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a site pages may be fetched from (repeatable; default: the shop's)",
    )
    parser.add_argument(
        "--ask",
        choices=("stdin", "first"),
        default="stdin" if sys.stdin.isatty() else "first",
        help="how ask_user is answered: on the terminal, or the first choice (default when stdin "
        "is not a terminal)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the chat may take")
    parser.add_argument(
        "--json", action="store_true", help="also print the outcome as one JSON line at the end"
    )
    args = parser.parse_args(argv)
    shop = None
    if args.shop is None:
        from .shop import ShopSite

        shop = ShopSite()
        args.shop = shop.start()
        print(f"serving the demo shop at {args.shop}", flush=True)
    plugin = Plugin(
        args.server,
        token=args.token,
        admin_token=args.admin_token,
        allowed_sites=args.allow_site,
        choose=ask_stdin if args.ask == "stdin" else first_choice,
        out=lambda line: print(line, flush=True),
    )
    try:
        outcome = asyncio.run(plugin.chat(args.query, page=args.shop, timeout=args.timeout))
    except ClientError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if shop is not None:
            shop.stop()
    print_outcome(outcome)
    if args.json:
        print(json.dumps(outcome.to_json(), ensure_ascii=False), flush=True)
    return 0 if outcome.status == "done" and (outcome.result or {}).get("status") == "finished" else 1


if __name__ == "__main__":
    raise SystemExit(main())
