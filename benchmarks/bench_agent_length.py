"""Does an agent turn cost more as the conversation grows? The agent of ``_bench_agents.py``
in local mode, 10 and 40 turns, for two commits in interleaved rounds: CPU and wall time per
turn, what of that CPU its model-call records cost (against the same agent keeping none),
and the bytes of a run's records.

    python benchmarks/bench_agent_length.py --before A --after B   # writes results/agent-length.{json,md}
    python benchmarks/bench_agent_length.py --quick                # 2 rounds, prints only

Each commit is exported as ``bench_compare.py`` does; every round runs ``_agent_length.py`` of
this checkout once per commit and length, in a new process whose ``dflow`` is that commit's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._fair import NOISE, Load, ms, table
from benchmarks._results import report
from benchmarks.bench_compare import exported

DRIVER = Path(__file__).resolve().parent / "_agent_length.py"
LENGTHS = (10, 40)


def one_round(checkout: Path, turns: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "BENCH_AGENT_TURNS": str(turns)}
    done = subprocess.run(
        [sys.executable, str(DRIVER)], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout.name} ({turns} turns) failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def render(res: dict[str, Any]) -> str:
    rows = []
    for side in (res["before"], res["after"]):
        seen = res["figures"][side]
        cpu = {n: statistics.median(r["cpu_per_turn_s"] for r in seen[str(n)]) for n in LENGTHS}
        wall = {n: statistics.median(r["wall_per_turn_s"] for r in seen[str(n)]) for n in LENGTHS}
        bare = {n: statistics.median(r["unrecorded_cpu_per_turn_s"] for r in seen[str(n)]) for n in LENGTHS}
        size = {n: seen[str(n)][-1]["record_bytes"] for n in LENGTHS}
        rows.append(
            [side, *(ms(cpu[n]) for n in LENGTHS), f"{cpu[40] / cpu[10]:.2f}×"]
            + [*(ms(cpu[n] - bare[n]) for n in LENGTHS), *(ms(wall[n]) for n in LENGTHS)]
            + [f"{size[n]:,}" for n in LENGTHS]
        )
    head = ["commit", "CPU/turn, 10 turns", "CPU/turn, 40 turns", "40 ÷ 10"]
    head += ["of it recording, 10", "of it recording, 40", "wall/turn, 10", "wall/turn, 40"]
    head += ["records, 10 turns (bytes)", "records, 40 turns (bytes)"]
    return "\n".join(
        [
            f"ToolCallAgent in local mode, 10 and 40 turns (3 tool calls a turn), {res['rounds']} interleaved"
            " rounds of 8 runs; medians.",
            "",
            *table(head, rows),
            "",
            f"- {NOISE} Here: {Load.text(res['load'])}.",
            "- CPU/turn: the process's CPU time (every thread) over a run, divided by its turns + 1. Of it"
            " recording: CPU/turn less that of the same agent keeping no records (`recording=None`), run in turn.",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="HEAD~1")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 rounds, print only")
    args = ap.parse_args()
    count, load = (2 if args.quick else args.rounds), Load()
    into = Path(tempfile.mkdtemp(prefix="dflow-bench-length-"))
    try:
        with exported(args.before, into) as (b, before), exported(args.after, into) as (a, after):
            sides = {before: b, after: a}
            figures: dict[str, dict[str, list[dict[str, float]]]] = {
                s: {str(n): [] for n in LENGTHS} for s in sides
            }
            order = [(s, n) for s in sides for n in LENGTHS]
            for i in range(count):
                for side, turns in order if i % 2 == 0 else order[::-1]:
                    figures[side][str(turns)].append(one_round(sides[side], turns))
                load.sample()
                print(f"  round {i + 1}/{count} done", flush=True)
    finally:
        shutil.rmtree(into, ignore_errors=True)
    results = {"before": before, "after": after, "rounds": count, "load": load.summary(), "figures": figures}
    report("agent-length", results, render(results), keep=not args.quick)


if __name__ == "__main__":
    main()
