"""The cost of a rate-limited step against a plain one, locally and on Redis Streams.

    python benchmarks/bench_rate_limit.py            # full run, writes benchmarks/results/rate_limit.{json,md}
    python benchmarks/bench_rate_limit.py --quick    # fewer rounds, prints only

The same 10-step chain of trivial steps runs plain and with ``rate_limit`` on every step, on a
bucket whose tokens are always free: the difference is what taking a token costs a step (an
in-memory call locally; one Lua script on Redis), never a wait. Per step: the median gap
between the starts of consecutive steps of a run (everything a step costs), over runs one at a
time, each figure the mean of two copies of the flow (where in memory a flow's objects fall
moves a local step by a few µs). Locally in this process; on Redis with one ``dflow worker`` on a Redis server of the
benchmark's own. Rounds take the two in turn; the ratio is the median of per-round ratios.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks._bench_rates import limited10, limited10b, plain10, plain10b
from benchmarks._fair import Load, ms, ratio, rounds, spread, table
from benchmarks._procs import one_worker
from benchmarks._results import quick, report

SECRET = "bench-rate-limit-secret-0123456789abcdef"


def gap(pipeline: Any, runs: int) -> float:
    """The median gap between step starts over ``runs`` runs of ``pipeline``, one at a time."""
    gaps: list[float] = []
    for _ in range(runs):
        r = pipeline.call(0)
        assert r.result(60) == 10
        starts = [s.started for s in r.context().steps[1:] if s.status is dflow.StepStatus.DONE]
        gaps += [b - a for a, b in itertools.pairwise(starts)]
    return statistics.median(gaps)


def measured(count: int, runs: int) -> dict[str, list[float]]:
    """``plain`` and ``limited`` per-step gaps, ``count`` rounds on the runtime configured now."""
    for p in (plain10, limited10, limited10b, plain10b):
        gap(p, 5)  # warm up
    systems: dict[str, Callable[[], float]] = {  # (each the mean of its two flows: see _bench_rates)
        "plain": lambda: (gap(plain10, runs) + gap(plain10b, runs)) / 2,
        "limited": lambda: (gap(limited10, runs) + gap(limited10b, runs)) / 2,
    }
    return rounds(systems, count)


def main() -> None:
    q = quick(__doc__ or "")
    count, runs = (3, 20) if q else (9, 60)
    load = Load()
    results: dict[str, Any] = {}
    dflow.global_init_for_test()
    try:
        results["local"] = measured(count, runs)
    finally:
        dflow.shutdown()
    with one_worker("benchmarks._bench_rates", "bench-rates", SECRET, 64):
        results["redis"] = measured(count, runs)
    load.sample()
    rows = []
    for mode, what in (("local", "local mode"), ("redis", "Redis Streams, 1 worker")):
        seen = results[mode]
        plain, limited = statistics.median(seen["plain"]), statistics.median(seen["limited"])
        rows.append(
            [
                what,
                ms(plain),
                ms(limited),
                ("+" if limited >= plain else "-") + ms(abs(limited - plain)),
                f"{ratio(seen, 'limited', 'plain'):.2f}x ({spread(seen['limited'])})",
            ]
        )
    lines = [
        "# Rate limit benchmark",
        "",
        f"`python benchmarks/bench_rate_limit.py`: {count} rounds of {runs} runs of a 10-step chain each;"
        f" load average {min(load.samples):.2f} to {max(load.samples):.2f}.",
        "",
        *table(
            ["per step (median gap between step starts)", "plain", "rate-limited", "a token costs", "ratio"],
            rows,
        ),
        "",
        "Every step of the limited chain takes a token of one bucket, always free: the cost of the",
        "token alone (the time a step waits for a token that is not free is the bucket's schedule).",
        "Locally a token is a call into the in-memory bucket on the event loop (a few µs); on Redis it",
        "is one more round trip to the server (a Lua script) before the step runs, on a machine whose",
        "2 cores the worker, Redis and the client share (and others' work: see the load average).",
    ]
    report(
        "rate_limit",
        {**results, "rounds": count, "runs": runs, "load": load.samples},
        "\n".join(lines),
        keep=not q,
    )


if __name__ == "__main__":
    main()
