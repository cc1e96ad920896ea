"""``dflow schedule add|ls|pause|resume|rm``: the schedules kept in a store (the logic is
``dflow.ops.schedules``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ScheduleError
from ..ops.tree import safe
from ..schedules import LATE, MISSED, OVERLAP, Schedule, book_of
from .options import add_store, count, store_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sc = sub.add_parser("schedule", help="add, list, pause, resume or remove the schedules that start runs")
    verbs = sc.add_subparsers(dest="verb", required=True)
    add = verbs.add_parser(
        "add",
        help="start a pipeline's runs at the fire times of a cron expression or every so often",
        description="Keep schedule NAME: the workers that have PIPELINE start one run of it per tick "
        "(trace id sched:NAME:TIME). The same name again replaces its settings.",
    )
    add.add_argument("name", metavar="NAME")
    add.add_argument("--pipeline", required=True, help="the name of the pipeline to start")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a cron expression, such as '*/5 * * * *'")
    when.add_argument("--every", metavar="SPAN", help="an interval: seconds, or 30s, 5m, 1h, 1d")
    add.add_argument("--param", metavar="JSON", help="the parameter of each run, as JSON (default: none)")
    add.add_argument("--tz", default="UTC", help="the time zone the cron expression is read in (default UTC)")
    add.add_argument(
        "--missed",
        choices=MISSED,
        default="run_once",
        help=f"ticks missed ({LATE:g}s past while no worker fired them): skip them, start one run for them "
        "all, or one each (default run_once)",
    )
    add.add_argument("--max-missed", type=count, default=10, help="missed ticks that fire under --missed all")
    add.add_argument(
        "--overlap",
        choices=OVERLAP,
        default="allow",
        help="a tick while the previous run goes on (default allow)",
    )
    add_store(add)
    ls = verbs.add_parser("ls", help="list the schedules with their next fire times")
    ls.add_argument("--json", action="store_true", help="print JSON (times in seconds since the epoch)")
    add_store(ls)
    for verb, what in (
        ("pause", "stop firing a schedule until resumed"),
        ("resume", "fire a paused schedule again, from its next fire time"),
        ("rm", "remove a schedule (a worker whose module declares it keeps it again when it starts)"),
    ):
        v = verbs.add_parser(verb, help=what)
        v.add_argument("name", metavar="NAME")
        add_store(v)


async def run(args: argparse.Namespace) -> int:
    from ..ops import schedules as ops
    from ..runtime.connect import store_from_url

    schedule = _schedule(args) if args.verb == "add" else None  # (bad settings: before connecting)
    store = store_from_url(store_url(args))
    try:
        book = book_of(store)
        if schedule is not None:
            entry = await ops.add(book, schedule)
            print("\n".join(ops.table([entry])))
            return 0
        if args.verb == "ls":
            entries = await book.entries()
            if args.json:
                print(json.dumps([ops.entry_json(e) for e in entries], indent=2))
            elif entries:
                print("\n".join(safe(line) for line in ops.table(entries)))
            else:
                print("no schedules are kept in this store")
            return 0
        act = {"pause": ops.pause, "resume": ops.resume, "rm": ops.remove}[args.verb]
        if not await act(book, args.name):
            print(
                f"dflow schedule {args.verb}: no schedule {safe(args.name)!r}: `dflow schedule ls` lists them",
                file=sys.stderr,
            )
            return 1
        return 0
    finally:
        await store.close()


def _schedule(args: argparse.Namespace) -> Schedule:
    """The schedule ``dflow schedule add`` keeps; ``ScheduleError`` saying what is wrong."""
    from ..ops.schedules import every_of
    from ..wire.values import encode

    param: Any = None
    if args.param is not None:
        try:
            param = json.loads(args.param)
        except ValueError as exc:
            raise ScheduleError(
                f"--param {args.param!r} is not JSON ({exc}): give a JSON value, such as '{{\"n\": 1}}'"
            ) from None
    return Schedule(
        args.name,
        args.pipeline,
        cron=args.cron,
        every=None if args.every is None else every_of(args.every),
        tz=args.tz,
        param=encode(param, "--param"),
        missed=args.missed,
        overlap=args.overlap,
        max_missed=args.max_missed,
    )
