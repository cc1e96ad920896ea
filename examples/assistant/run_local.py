"""The assistant in one process, offline: local mode (the in-memory store and transport),
the HTTP API on a free port of 127.0.0.1, the demo shop on another, and the browser plug-in
(``client.Plugin``) talking to the API as it would to ``dflow serve``: it starts the chat,
follows its steps, pulls the jobs, fetches the shop's pages and answers the question.

    python -m examples.assistant [--query "..."] [--ask stdin|first]

With ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` set, a real model plans,
shops, crawls and summarises instead of the scripted one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import dflow
from dflow import DFlow

from .client import DEFAULT_QUERY, Outcome, Plugin, Printer, ask_stdin, first_choice, print_outcome
from .shop import ShopSite

__all__ = ["Local", "local", "main", "run"]


@dataclass
class Local:
    """What local mode runs: the API's URL and the shop."""

    api: str
    shop: ShopSite


@contextlib.contextmanager
def local() -> Iterator[Local]:
    """Local mode with the assistant's API (``dflow serve``'s app on a free port) and the shop."""
    from dflow.server import ServerThread, create_app

    DFlow.global_init_for_test()
    try:
        from . import app  # the flows, built at import as a worker builds them

        api = create_app(routes=app.DFLOW_ROUTES, pipelines=[app.PIPELINE])
        with ShopSite() as shop, ServerThread(api) as url:
            yield Local(url, shop)
    finally:
        dflow.shutdown()


def run(
    query: str = DEFAULT_QUERY, *, ask: str = "first", out: Printer = print, timeout: float = 600.0
) -> Outcome:
    """One chat in local mode, the plug-in answering the assistant's question on the
    terminal (``ask="stdin"``) or with the first choice."""
    with local() as here:
        from . import app

        out(f"local mode: the API at {here.api}, the shop at {here.shop.url}, model: {app.MODEL!r}")
        plugin = Plugin(here.api, choose=ask_stdin if ask == "stdin" else first_choice, out=out)
        return asyncio.run(plugin.chat(query, page=here.shop.url, timeout=timeout))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module)."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.assistant", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--query", default=DEFAULT_QUERY, help="what to ask the assistant")
    parser.add_argument(
        "--ask",
        choices=("stdin", "first"),
        default="stdin" if sys.stdin.isatty() else "first",
        help="how the assistant's question is answered: on the terminal, or the first choice",
    )
    args = parser.parse_args(argv)
    outcome = run(args.query, ask=args.ask, out=lambda line: print(line, flush=True))
    print_outcome(outcome)
    return 0 if outcome.status == "done" and (outcome.result or {}).get("status") == "finished" else 1
