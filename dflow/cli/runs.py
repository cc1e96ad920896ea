"""The commands that read runs: ``dflow inspect`` (a run's step tree) and ``dflow ls``
(recent runs, then the schedules with their next fire times), as text for people or as
JSON for scripts (the runs only)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..context import RunInfo, RunStatus
from ..ops.tree import safe
from ..run_notes import check_business_key
from ..run_pages import (
    SORTS,
    StartedWindow,
    check_find,
    find_in_window,
    page_in_window,
    parse_sort,
    parse_started,
)
from .circuits import circuit_notes
from .options import add_store, count, store_url

if TYPE_CHECKING:
    from ..schedules import ScheduleEntry
    from ..store import Store

_BRANCH_DEPTH = 8  # zip/any branches nested deeper than this are listed by id only


def register_inspect(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = sub.add_parser("inspect", help="print a run's step tree")
    i.add_argument("trace_id", metavar="TRACE_ID")
    add_store(i)
    i.add_argument(
        "--requests",
        action="store_true",
        help="print the whole request of each model call the run recorded (else a line on what it held)",
    )
    i.add_argument(
        "--json",
        action="store_true",
        help="print the run, its steps (with their inputs and outputs) and its branch runs as JSON",
    )


def register_ls(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ls = sub.add_parser("ls", help="list recent runs (not zip/any branches: inspect their parent)")
    add_store(ls)
    ls.add_argument("--limit", type=count, default=20, help="runs shown at most (default 20)")
    ls.add_argument("--status", choices=[s.value for s in RunStatus], help="only runs in this status now")
    ls.add_argument("--pipeline", help="only runs started by this pipeline (its name)")
    ls.add_argument(
        "--after",
        type=_started("--after"),
        metavar="TIME",
        help="only runs started at or after TIME (ISO 8601, e.g. 2026-12-02T14:30; UTC unless it has an offset)",
    )
    ls.add_argument(
        "--before",
        type=_started("--before"),
        metavar="TIME",
        help="only runs started before TIME (as --after)",
    )
    ls.add_argument(
        "--id",
        metavar="START",
        help="the runs whose trace id starts with START, in id order (the other filters apply to them)",
    )
    ls.add_argument(
        "--sort",
        choices=SORTS,
        default="newest",
        help="the order of the runs: newest first (the default) or oldest first",
    )
    ls.add_argument(
        "--oldest",
        dest="sort",
        action="store_const",
        const="oldest",
        help="list the oldest runs first (as --sort oldest)",
    )
    ls.add_argument(
        "--key",
        metavar="KEY",
        help="the runs a step gave this business key (dflow.set_business_key): the first --limit "
        "of them that pass the other filters, in the order --sort asks",
    )
    ls.add_argument(
        "--json", action="store_true", help="print a JSON list (times in seconds since the epoch)"
    )


async def inspect(args: argparse.Namespace) -> int:
    from ..ops.tree import render
    from ..runtime.connect import store_from_url
    from ..wire.ids import check_trace_id, is_run_id

    if not is_run_id(args.trace_id):
        check_trace_id(args.trace_id)  # says what is wrong with it
    store = store_from_url(store_url(args))
    try:
        if args.json:
            tree = await _run_tree(store, args.trace_id, 0)
            print(json.dumps(tree, indent=2))  # (ASCII: stored text cannot reach the terminal raw)
            return 0 if tree is not None else 1
        print(await render(store, args.trace_id, requests=args.requests))
        for line in await circuit_notes(store, args.trace_id):
            print(line)
        return 0 if await store.get_run(args.trace_id) is not None else 1
    finally:
        await store.close()


async def _run_tree(store: Store, trace_id: str, depth: int) -> dict[str, Any] | None:
    """Run ``trace_id`` as JSON, its steps under ``"steps"``, each FORKED step's branch
    runs under its ``"branches"`` (``None`` when there is no such run)."""
    from ..ops.as_json import record_json, run_json
    from ..ops.tree import branch_runs
    from ..patterns.rerun import RERUN_KEY, link_of

    info = await store.get_run(trace_id)
    if info is None:
        return None
    steps = []
    for rec in await store.get_steps(trace_id):
        step = record_json(rec, with_input=True)
        children = branch_runs(rec)
        if children:
            step["branches"] = (
                [await _run_tree(store, child, depth + 1) or {"trace_id": child} for child in children]
                if depth < _BRANCH_DEPTH
                else [{"trace_id": child} for child in children]
            )
        steps.append(step)
    out = {**run_json(info), "steps": steps}
    if depth == 0:  # (a rerun: the run it reruns, and from which step)
        link = link_of((await store.get_data(trace_id)).get(RERUN_KEY))
        out["rerun_of"] = (
            {"trace_id": link.trace_id, "seq": link.seq} if link and link.run == trace_id else None
        )
    return out


async def ls(args: argparse.Namespace) -> int:
    from ..runtime.connect import store_from_url

    try:
        StartedWindow(args.after, args.before)
        if args.id is not None:
            check_find(args.id, 1)
        if args.key is not None:
            check_business_key(args.key)
    except ValueError as exc:
        print(f"dflow ls: {exc}", file=sys.stderr)
        return 2
    store = store_from_url(store_url(args))
    try:
        runs = await _listed(store, args)
        kept = await _schedules(store) if not args.json else []
    finally:
        await store.close()
    if args.json:
        from ..ops.as_json import run_json

        print(json.dumps([run_json(r) for r in runs], indent=2))
        return 0
    # STEP: the run's step sequence number, how many steps it has taken (its position)
    print(f"{'TRACE ID':<40} {'STATUS':<9} {'PIPELINE':<24} {'STEP':>5} {'STARTED':<19} {'AGE':>8}  NOTE")
    now = time.time()
    for r in runs:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created))
        pipeline = safe(r.pipeline or "-")
        pipeline = pipeline if len(pipeline) <= 24 else pipeline[:23] + "~"
        print(
            f"{safe(r.trace_id):<40} {r.status.value:<9} {pipeline:<24} {r.seq:>5} {started:<19} "
            f"{now - r.created:>7.0f}s  {safe(_note(r)[:80])}"
        )
    if kept:
        from ..ops.schedules import table

        print()
        print("\n".join(safe(line) for line in table(kept, now)))
    return 0


async def _schedules(store: Store) -> list[ScheduleEntry]:
    """The schedules ``dflow ls`` shows under the runs (none for a store that keeps none)."""
    from ..errors import ConfigurationError
    from ..schedules import book_of

    try:
        book = book_of(store)
    except ConfigurationError:
        return []
    return await book.entries()


def _started(flag: str) -> Callable[[str], float]:
    """The argparse type of a start time given to ``flag``."""

    def parse(text: str) -> float:
        try:
            return parse_started(flag, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


async def _listed(store: Store, args: argparse.Namespace) -> list[RunInfo]:
    """The runs ``dflow ls`` shows: newest first (oldest first with ``--oldest``), as many
    as ``--limit``, filtered (with ``--id``: in id order)."""
    runs: list[RunInfo] = []
    cursor: str | None = None
    status = RunStatus(args.status) if args.status else None
    window = StartedWindow(args.after, args.before)  # (checked by ``ls``)
    if args.key is not None:
        return await _keyed(store, args, status, window)
    if args.id is not None:
        return await find_in_window(
            store, args.id, min(args.limit, 1000), window, status=status, pipeline=args.pipeline or None
        )
    while len(runs) < args.limit:
        page = await page_in_window(
            store,
            min(args.limit - len(runs), 1000),
            window,
            status=status,
            pipeline=args.pipeline or None,
            cursor=cursor,
            oldest_first=parse_sort(args.sort),
        )
        runs += page.runs
        if page.cursor is None:
            break
        cursor = page.cursor
    return runs


async def _keyed(
    store: Store, args: argparse.Namespace, status: RunStatus | None, window: StartedWindow
) -> list[RunInfo]:
    """The first runs ``--key`` names (the runs with that business key) that pass the other
    filters, in the order asked; with ``--id`` too, those of the first 1000 whose id starts so."""
    runs = await store.run_notes.find_by_business_key(
        args.key,
        1000 if args.id is not None else min(args.limit, 1000),
        status=status,
        pipeline=args.pipeline or None,
        window=window,
        oldest_first=parse_sort(args.sort),
    )
    return [r for r in runs if args.id is None or r.trace_id.startswith(args.id)][: args.limit]


def _note(r: RunInfo) -> str:
    """What ``dflow ls`` says of a run beside its status."""
    if r.extra.get("parked"):
        return f"parked x{r.extra.get('park_count')}: {r.extra['parked']}"
    if r.error:
        return f"{r.error.get('type')}: {_first_line(str(r.error.get('message')))}"
    return f"waiting for {r.waiting_for}" if r.waiting_for else ""


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0]
