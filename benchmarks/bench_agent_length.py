"""Does an agent turn cost more as the conversation grows? The agent of ``_bench_agents.py``
in local mode and on Redis Streams with one worker process, 10 and 40 turns, for two commits
in interleaved rounds: CPU and wall time per turn, what of that CPU its model-call records
cost (against the same agent keeping none), and the bytes of a run's records.

    python benchmarks/bench_agent_length.py --before A --after B   # writes results/agent-length.{json,md}
    python benchmarks/bench_agent_length.py --quick                # 2 rounds, prints only
    python benchmarks/bench_agent_length.py --modes local          # local mode only

Each commit is exported as ``bench_compare.py`` does; every round runs ``_agent_length.py`` of
this checkout once per commit, mode and length, in a new process whose ``dflow`` is that
commit's (on Redis: with a ``redis-server`` of its own and a worker process of that commit).
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
MODES = ("local", "redis")
SHOWN = {"local": "local mode", "redis": "Redis Streams, 1 worker"}


def one_round(checkout: Path, mode: str, turns: int) -> dict[str, float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "BENCH_AGENT_TURNS": str(turns),
        "BENCH_AGENT_MODE": mode,
    }
    done = subprocess.run(
        [sys.executable, str(DRIVER)], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{checkout.name} ({mode}, {turns} turns) failed:\n{done.stderr[-3000:]}")
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def growth(seen: dict[str, list[dict[str, float]]], what: str) -> float:
    """The median over rounds of the 40-turn figure ``what`` over the 10-turn one of the round."""
    return statistics.median(
        b[what] / a[what] for a, b in zip(seen[str(LENGTHS[0])], seen[str(LENGTHS[1])], strict=True)
    )


def row(mode: str, side: str, seen: dict[str, list[dict[str, float]]]) -> list[str]:
    def mid(what: str, n: int) -> float:
        return statistics.median(r[what] for r in seen[str(n)])

    cpu = {n: mid("cpu_per_turn_s", n) for n in LENGTHS}
    wall = {n: mid("wall_per_turn_s", n) for n in LENGTHS}
    bare = {n: mid("unrecorded_cpu_per_turn_s", n) for n in LENGTHS}
    server = [ms(mid("redis_cpu_per_turn_s", n)) if mode == "redis" else "–" for n in LENGTHS]
    return (
        [SHOWN[mode], side, *(ms(cpu[n]) for n in LENGTHS), f"{growth(seen, 'cpu_per_turn_s'):.2f}×"]
        + [*(ms(wall[n]) for n in LENGTHS), f"{growth(seen, 'wall_per_turn_s'):.2f}×"]
        + [*(ms(cpu[n] - bare[n]) for n in LENGTHS), *server]
        + [f"{seen[str(n)][-1]['record_bytes']:,}" for n in LENGTHS]
    )


def render(res: dict[str, Any]) -> str:
    rows = [
        row(m, side, res["figures"][side][m]) for m in res["modes"] for side in (res["before"], res["after"])
    ]
    head = ["mode", "commit", "CPU/turn, 10 turns", "CPU/turn, 40 turns", "CPU 40 ÷ 10"]
    head += ["wall/turn, 10", "wall/turn, 40", "wall 40 ÷ 10", "of it recording, 10", "of it recording, 40"]
    head += ["Redis server CPU/turn, 10", "Redis server CPU/turn, 40"]
    head += ["records, 10 turns (bytes)", "records, 40 turns (bytes)"]
    return "\n".join(
        [
            f"ToolCallAgent, 10 and 40 turns (3 tool calls a turn), {res['rounds']} interleaved rounds of 8 runs"
            " (after 2 to warm up); medians.",
            "",
            *table(head, rows),
            "",
            f"- {NOISE} Here: {Load.text(res['load'])}.",
            "- CPU/turn: over a run, divided by its turns + 1: in local mode the process's CPU time (every"
            " thread), on Redis the worker process's (every thread), the Redis server's beside it. Of it"
            " recording: CPU/turn less that of the same agent keeping no records (`recording=None`), run in"
            " turn. 40 ÷ 10: the median of each round's 40-turn figure over its 10-turn one.",
            "- The model doubles keep only their last request (`FunctionModel.requests` keeps all by default:"
            " collecting their garbage would be counted in every later turn of the process); before each run"
            " (not timed), a full garbage collection in the processes that run it (on Redis, the worker and the client).",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="HEAD~1")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES), help="local, redis, or both (default)")
    ap.add_argument("--quick", action="store_true", help="2 rounds, print only")
    args = ap.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    count, load = (2 if args.quick else args.rounds), Load()
    into = Path(tempfile.mkdtemp(prefix="dflow-bench-length-"))
    try:
        with exported(args.before, into) as (b, before), exported(args.after, into) as (a, after):
            sides = {before: b, after: a}
            figures: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
                s: {m: {str(n): [] for n in LENGTHS} for m in modes} for s in sides
            }
            order = [(s, m, n) for s in sides for m in modes for n in LENGTHS]
            for i in range(count):
                for side, mode, turns in order if i % 2 == 0 else order[::-1]:
                    figures[side][mode][str(turns)].append(one_round(sides[side], mode, turns))
                load.sample()
                print(f"  round {i + 1}/{count} done", flush=True)
    finally:
        shutil.rmtree(into, ignore_errors=True)
    results = {
        "before": before,
        "after": after,
        "modes": modes,
        "rounds": count,
        "load": load.summary(),
        "figures": figures,
    }
    report("agent-length", results, render(results), keep=not args.quick)


if __name__ == "__main__":
    main()
