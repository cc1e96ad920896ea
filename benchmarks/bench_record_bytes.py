"""What a run's step records hold on Redis before and after a change, side by side in one run:
a 10-step chain passing a 100 KB value (each step returns a new one), run by each commit's
dflow on one Redis server of the benchmark's own, and the bytes its keys hold after.

    python benchmarks/bench_record_bytes.py                       # 77386b0 (before) vs HEAD
    python benchmarks/bench_record_bytes.py --before A --after B  # any two commits
    python benchmarks/bench_record_bytes.py --quick               # one round, prints only

Each commit is exported (``git archive``) as ``bench_compare.py`` does; every round runs
``_record_bytes.py`` of this checkout once per commit, in a new process whose ``dflow`` comes
from that commit's folder, under a key prefix of its own. The figures: the summed sizes of
the run's step records as the server keeps them, and ``MEMORY USAGE`` of the run's keys (all
of them, and its record list alone). The table goes to ``benchmarks/results/record_bytes.md``.
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

from benchmarks._fair import own_redis, table
from benchmarks._results import report
from benchmarks.bench_compare import exported

DRIVER = Path(__file__).resolve().parent / "_record_bytes.py"
FIGURES = {
    "record_bytes": "the run's 11 step records, summed sizes",
    "memory_usage_of_records_bytes": "MEMORY USAGE of the run's record list",
    "memory_usage_bytes": "MEMORY USAGE of all the run's keys",
}


def one_round(checkout: Path, server: str, name: str) -> dict[str, Any]:
    cmd = [sys.executable, str(DRIVER), "--checkout", str(checkout), "--redis", f"{server}/0", "--name", name]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not found["inputs_read_back"]:
        raise RuntimeError(f"{name}: a step's input did not read back as the output before it")
    return found


def measure(sides: dict[str, Path], count: int) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {side: {k: [] for k in FIGURES} for side in sides}
    order = list(sides)
    with own_redis() as server:
        for i in range(count):
            for side in order if i % 2 == 0 else order[::-1]:
                found = one_round(sides[side], server, f"rb{i}-{side}")
                for key in FIGURES:
                    figures[side][key].append(found[key])
            print(f"  round {i + 1}/{count} done", flush=True)
    return figures


def kb(n: float) -> str:
    return f"{n / 1000:,.0f} KB"


def render(res: dict[str, Any]) -> str:
    before, after = res["before"], res["after"]
    fb, fa = res["figures"][before], res["figures"][after]
    rows = [
        [
            what,
            kb(statistics.median(fb[k])),
            kb(statistics.median(fa[k])),
            f"{statistics.median(fa[k]) / statistics.median(fb[k]):.2f}×",
        ]
        for k, what in FIGURES.items()
    ]
    head = [
        "a 10-step chain passing a 100 KB value, on Redis",
        f"before ({before})",
        f"after ({after})",
        "after ÷ before",
    ]
    return "\n".join(
        [
            f"Step records of one run, {before} (before) and {after} (after), {res['rounds']} rounds; medians.",
            "",
            *table(head, rows),
            "",
            "- Each step returns a new 100 KB value (its bytes turned by one); the run has 11 records (the entry and 10 steps).",
            "- Before, each value is in two records (the output of one step and the input of the next); after, the",
            "  input of a record that is the output of the record before it refers to it.",
            "- MEMORY USAGE counts the server's allocations (`samples 0`: every element); all the run's keys include",
            "  its hash, which holds the run's current value and its result.",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="77386b0")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 round, print only")
    args = ap.parse_args()
    count = 1 if args.quick else args.rounds
    into = Path(tempfile.mkdtemp(prefix="dflow-bench-record-bytes-"))
    try:
        with exported(args.before, into) as (b, before), exported(args.after, into) as (a, after):
            if before == after:
                raise SystemExit(f"--before and --after are the same commit ({before})")
            figures = measure({before: b, after: a}, count)
    finally:
        shutil.rmtree(into, ignore_errors=True)
    results = {"before": before, "after": after, "rounds": count, "figures": figures}
    report("record_bytes", results, render(results), keep=not args.quick)


if __name__ == "__main__":
    main()
