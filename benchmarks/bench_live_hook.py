"""What live events (``dflow.live``) cost a step that publishes none: the runtime sets a
context variable around the function of each ``map`` and ``flat_map`` step
(``runtime.step``), for ``dflow.live.publish``. In one process,
in local mode, interleaved rounds of the same flows with the real hook and with it replaced
by one that does nothing; the median gap between step starts of each, and their ratio.

    python benchmarks/bench_live_hook.py            # 16 rounds, table to benchmarks/results/live-hook.md
    python benchmarks/bench_live_hook.py --rounds 4 # fewer
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _step_flows import agent_turn, chain200  # beside this file

import dflow
import dflow.runtime.step as step
from dflow import DFlow


class _NoHook:
    """The hook's stand-in: no context variable is set."""

    def set(self, value: Any) -> None:
        return None

    def reset(self, token: Any) -> None:
        return None


def _gap(run: Any, skip: int) -> float:
    starts = [s.started for s in run.context().steps[skip:]]
    return statistics.median(b - a for a, b in itertools.pairwise(starts))


def chain_gap() -> float:
    run = chain200.call(0)
    run.result(60)
    return _gap(run, 2)


def loop_gap() -> float:
    run = DFlow.direct_run({"turn": 0, "until": 100}, lambda s: DFlow.just(s).flat_map(agent_turn).id("loop"))
    run.result(60)
    return _gap(run, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args()
    hook = step.running_step
    dflow.global_init_for_test()
    try:
        chain_gap(), loop_gap()  # (warm)
        found: dict[tuple[str, str], list[float]] = {}
        for i in range(args.rounds):
            order = [("with the hook", hook), ("without", _NoHook())]
            for name, obj in order if i % 2 else order[::-1]:
                step.running_step = obj  # type: ignore[assignment]
                found.setdefault(("chain", name), []).append(chain_gap())
                found.setdefault(("loop", name), []).append(loop_gap())
    finally:
        step.running_step = hook
        dflow.shutdown()
    rows = []
    for flow, what in (("chain", "200-step map chain"), ("loop", "flat_map loop (agent-like), 100 turns")):
        on = statistics.median(found[(flow, "with the hook")])
        off = statistics.median(found[(flow, "without")])
        rows.append(
            f"| {what}: median gap between step starts | {off * 1e6:.2f} µs | {on * 1e6:.2f} µs | "
            f"{on / off:.3f}× | {(on - off) * 1e9:+.0f} ns |"
        )
    load = os.getloadavg()[0]
    text = "\n".join(
        [
            f"Live-event hook on the step path, local mode, one process, {args.rounds} interleaved rounds.",
            "",
            "| benchmark | without the hook | with it | with ÷ without | added per step |",
            "| --- | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"- Load average (1 min) at the end: {load:.2f}, on {os.cpu_count()} cores, shared with other work.",
        ]
    )
    print(text)
    (HERE / "results" / "live-hook.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
