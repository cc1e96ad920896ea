"""The step path before and after a change, side by side in one run: the step-path benchmarks
(local mode, and Redis Streams with one worker) of two commits, in interleaved rounds, with the
median of per-round ratios.

    python benchmarks/bench_compare.py                      # f4c2405 (before issue 21's refactor) vs HEAD
    python benchmarks/bench_compare.py --before A --after B # any two commits (or branches, tags)
    python benchmarks/bench_compare.py --quick              # fewer rounds, prints only
    python benchmarks/bench_compare.py --modes local        # local mode only (a quick bisect)

Each commit is exported (``git archive``) into a temporary folder; every round runs
``_step_path.py`` of this checkout once per commit and mode, in a new process whose ``dflow``
(and its worker's) comes from that commit's folder. Redis: a server of the benchmark's own.
The table goes to ``benchmarks/results/compare.md`` (``--keep-as NAME`` for another name).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._fair import NOISE, Load, ms, own_redis, ratio, spread, table
from benchmarks._results import report

DRIVER = Path(__file__).resolve().parent / "_step_path.py"
FIGURES = {  # key: (what, unit, lower is better)
    "local_chain_gap_s": ("local, 200-step map chain: median gap between step starts", "time", True),
    "local_chain_mean_wall_s": ("local, 200-step map chain: mean of run wall time / steps", "time", True),
    "local_loop_gap_s": ("local, flat_map loop (agent-like): median gap", "time", True),
    "local_loop_mean_wall_s": ("local, flat_map loop: mean of run wall time / steps", "time", True),
    "local_steps_per_s": ("local, 2,000 5-step runs at once: steps/s", "rate", False),
    "local_agent_turn_s": ("local, ToolCallAgent: per turn (a model call + 3 tool calls)", "time", True),
    "redis_chain_per_step_s": (
        "Redis Streams, 10-step chain one at a time: per step, end to end",
        "time",
        True,
    ),
    "redis_chain_gap_s": ("Redis Streams, 10-step chain: median gap between step starts", "time", True),
    "redis_agent_turn_s": ("Redis Streams, 1 worker, ToolCallAgent: per turn", "time", True),
    "redis_steps_per_s": ("Redis Streams, 1 worker, 400 5-step runs at once: steps/s", "rate", False),
    "redis_worker_cpu_per_step_s": ("Redis Streams, same: worker CPU per step", "time", True),
}


@contextlib.contextmanager
def exported(rev: str, into: Path) -> Iterator[tuple[Path, str]]:
    """The tree of commit ``rev`` in a folder under ``into``; yields it and the short hash."""
    sha = git("rev-parse", "--short", f"{rev}^{{commit}}")
    folder = into / sha
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    # The folder adapters/ installs as dflow.adapters: give it that name in the tree too, so that
    # an installed (editable) dflow elsewhere cannot answer for it.
    if (folder / "adapters").is_dir() and not (folder / "dflow" / "adapters").exists():
        (folder / "dflow" / "adapters").symlink_to(Path("..") / "adapters")
    yield folder, sha


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def one_round(checkout: Path, mode: str, server: str, name: str) -> dict[str, float]:
    """``_step_path.py MODE`` for ``checkout`` in a new process (streams and keys ``name``); its figures."""
    cmd = [
        sys.executable,
        str(DRIVER),
        mode,
        "--checkout",
        str(checkout),
        "--redis",
        f"{server}/0",
        "--name",
        name,
    ]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name} ({mode}) failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: v for k, v in found.items() if k in FIGURES}


def measure(
    sides: dict[str, Path], count: int, load: Load, modes: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Every figure of every side in ``modes``, by round; each round runs every side and mode
    once, in an order reversed every other round."""
    keys = [k for k in FIGURES if k.split("_", 1)[0] in modes]
    figures: dict[str, dict[str, list[float]]] = {side: {k: [] for k in keys} for side in sides}
    order = [(side, mode) for side in sides for mode in modes]
    with own_redis() as server:
        for i in range(count):
            seen: dict[str, dict[str, float]] = {side: {} for side in sides}
            for side, mode in order if i % 2 == 0 else order[::-1]:
                seen[side].update(one_round(sides[side], mode, server, f"cmp{i}-{side}-{mode}"))
            for side, found in seen.items():
                for key, value in found.items():
                    figures[side][key].append(value)
            load.sample()
            print(f"  round {i + 1}/{count} done, load average {load.samples[-1]:.2f}", flush=True)
    return figures


def render(res: dict[str, Any]) -> str:
    before, after = res["before"], res["after"]
    fb, fa = res["figures"][before], res["figures"][after]
    rows = []
    for key, (what, unit, _) in FIGURES.items():
        if key not in fb:
            continue
        shown = ms if unit == "time" else (lambda x: f"{x:,.0f}")
        r = ratio({"a": fa[key], "b": fb[key]}, "a", "b")
        rows.append(
            [
                what,
                shown(statistics.median(fb[key])),
                shown(statistics.median(fa[key])),
                f"{r:.2f}×",
                spread([a / b for a, b in zip(fa[key], fb[key], strict=True)]),
            ]
        )
    head = [
        "benchmark",
        f"before ({before})",
        f"after ({after})",
        "after ÷ before",
        "spread of per-round ratios",
    ]
    return "\n".join(
        [
            f"Step path, {before} (before) and {after} (after), {res['rounds']} interleaved rounds; medians of the rounds.",
            "",
            *table(head, rows),
            "",
            f"- {NOISE} Here: {Load.text(res['load'])}.",
            "- after ÷ before: below 1 is faster for times, above 1 is faster for steps/s. A ratio within its spread "
            "of per-round ratios is within this run's noise.",
            "- Both commits run this checkout's `benchmarks/_step_path.py`, which uses only the public API both "
            "have; the worker and Redis (a server of the benchmark's own) share the machine's 2 cores with the client.",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--before", default="f4c2405")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 rounds, print only")
    ap.add_argument("--keep-as", default="compare")
    ap.add_argument("--modes", default="local,redis", help="local, redis or both (default %(default)s)")
    args = ap.parse_args()
    count, load = (2 if args.quick else args.rounds), Load()
    into = Path(tempfile.mkdtemp(prefix="dflow-bench-compare-"))
    try:
        with exported(args.before, into) as (b, before), exported(args.after, into) as (a, after):
            if before == after:
                raise SystemExit(f"--before and --after are the same commit ({before})")
            figures = measure({before: b, after: a}, count, load, args.modes.split(","))
    finally:
        shutil.rmtree(into, ignore_errors=True)
    results = {"before": before, "after": after, "rounds": count, "load": load.summary(), "figures": figures}
    report(args.keep_as, results, render(results), keep=not args.quick)


if __name__ == "__main__":
    main()
