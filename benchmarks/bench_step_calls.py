"""The work of a trivial step counted, not timed: the Python function calls the runtime's
event loop makes per step of a local 200-step map chain, for two commits. A count does not
move with the machine's load, so it shows a change of a few calls a step that a busy
machine's timings cannot (``bench_compare.py`` times the same step path).

    python benchmarks/bench_step_calls.py --before A --after B   # table to results/step-calls.md

Each commit is exported as ``bench_compare.py`` does; a new process whose ``dflow`` comes
from that tree runs the chain under ``cProfile`` on the runtime's loop thread only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = 20  #: chains of 200 steps counted, after one to warm up


def count_here() -> dict[str, Any]:
    """(In the child, with the commit's ``dflow`` first on the path.) Calls per step, in all
    and by function, on the runtime's loop thread."""
    import cProfile
    import pstats
    import threading

    sys.path.insert(0, str(HERE))
    from _step_flows import chain200  # beside this file

    import dflow

    dflow.global_init_for_test()
    try:
        loop = dflow.client._current().thread.loop
        chain200.call(0).result(60)
        prof = cProfile.Profile()

        def on_loop(fn: Any) -> None:
            done = threading.Event()
            loop.call_soon_threadsafe(lambda: (fn(), done.set()))
            done.wait(10)

        on_loop(prof.enable)
        for _ in range(RUNS):
            assert chain200.call(0).result(60) == 200
        on_loop(prof.disable)
    finally:
        dflow.shutdown()
    steps = RUNS * 200
    by_fn: collections.Counter[str] = collections.Counter()
    stats: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    for (file, _, name), (_, calls, *_) in stats.items():
        where = file.split("/dflow/", 1)[-1] if "/dflow/" in file else Path(file).name
        by_fn[f"{where}:{name.split(' at 0x', 1)[0]}"] += calls  # (a built-in's address differs by process)
    return {
        "calls_per_step": sum(by_fn.values()) / steps,
        "by_function": {k: v / steps for k, v in by_fn.items() if v >= steps / 2},
    }


def counted(checkout: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--count-here"],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def render(before: str, after: str, b: dict[str, Any], a: dict[str, Any]) -> str:
    rows = [f"| all | {b['calls_per_step']:.1f} | {a['calls_per_step']:.1f} |"]
    fb, fa = b["by_function"], a["by_function"]
    for name in sorted(set(fb) | set(fa)):
        if round(fb.get(name, 0), 1) != round(fa.get(name, 0), 1):
            rows.append(f"| `{name}` | {fb.get(name, 0):.1f} | {fa.get(name, 0):.1f} |")
    return "\n".join(
        [
            f"Python function calls per step on the runtime's loop, local mode, 200-step map chain "
            f"({RUNS} runs), {before} (before) and {after} (after).",
            "",
            f"| calls per step | before ({before}) | after ({after}) |",
            "| --- | ---: | ---: |",
            *rows,
            "",
            "- Rows below `all`: the functions called a different number of times per step (those called "
            "at least every other step). A coroutine's resumptions count as calls.",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="HEAD~1")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--keep-as", default="step-calls")
    ap.add_argument("--count-here", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.count_here:
        print(json.dumps(count_here()))
        return
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_compare import exported

    into = Path(tempfile.mkdtemp(prefix="dflow-bench-calls-"))
    try:
        with exported(args.before, into) as (b, before), exported(args.after, into) as (a, after):
            text = render(before, after, counted(b), counted(a))
    finally:
        shutil.rmtree(into, ignore_errors=True)
    print(text)
    (HERE / "results" / f"{args.keep_as}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
