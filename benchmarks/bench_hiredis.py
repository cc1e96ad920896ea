"""What hiredis (in dflow's ``redis`` extra) does for one worker: trivial steps/s and the
worker's CPU per step, with and without it, side by side in one run.

    python benchmarks/bench_hiredis.py           # writes benchmarks/results/hiredis.{json,md}
    python benchmarks/bench_hiredis.py --quick   # fewer rounds, prints only

redis-py uses hiredis (its C reply parser and command packer) whenever ``import hiredis``
works. The worker "without" is started with ``sys.modules["hiredis"] = None``, so that import
fails and redis-py falls back to its pure-Python parser and packer, as on a machine without
hiredis. Two workers (one of each) serve the same flows on streams of their own on a Redis
server of the benchmark's own; the client (with hiredis) drives one at a time, in turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks import _procs
from benchmarks._fair import NOISE, Load, ms, own_redis, process_cpu, ratio, rounds, spread, table
from benchmarks._results import quick, report

SECRET = "bench-hiredis-secret-0123456789abcdef"
BLOCK = "import sys; sys.modules['hiredis'] = None"  # makes ``import hiredis`` raise ImportError
WITHOUT = [sys.executable, "-c", f"{BLOCK}; from dflow.cli import main; sys.exit(main(sys.argv[1:]))"]
NAMES = {"with": "with hiredis", "without": "without hiredis (redis-py's pure-Python parser)"}


def hiredis_in_use(blocked: bool) -> bool:
    """Whether redis-py in a new process (with hiredis ``blocked`` or not) uses hiredis."""
    code = f"{BLOCK if blocked else 'import sys'}; import redis.utils; print(redis.utils.HIREDIS_AVAILABLE)"
    return (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "True"
    )


@contextlib.contextmanager
def two_workers(server: str) -> Iterator[dict[str, tuple[str, str, int]]]:
    """The two workers; yields, by name, their transport URL, store URL and pid."""
    procs, out = [], {}
    try:
        for name in NAMES:
            transport, store = f"{server}/0?stream=hiredis-{name}", f"{server}/0?prefix=hiredis-{name}"
            cmd = _procs.worker_cmd("benchmarks._bench_flows", transport, store, 64)
            if name == "without":
                cmd = [*WITHOUT, *cmd[3:]]  # in place of ``python -m dflow.cli``
            proc, _ = _procs.start(
                cmd, _procs.log_path(f"hiredis-{name}"), {"DFLOW_SECRET": SECRET}, "serving"
            )
            procs.append(proc)
            out[name] = (transport, store, proc.pid)
        yield out
    finally:
        for p in procs:
            _procs.stop(p)


def driver(urls: tuple[str, str, int], runs: int, cpu: list[float]) -> Callable[[], float]:
    """A round's figure: steps/s of ``runs`` 5-step chains started at once on that worker;
    its CPU per step goes to ``cpu``."""
    from benchmarks import _bench_flows as f

    transport, store, pid = urls

    async def start_all() -> list[dflow.Run]:
        return list(await asyncio.gather(*(f.chain5.acall(i) for i in range(runs))))

    def measure() -> float:
        dflow.configure(transport, store, secret=SECRET, consume=False)
        try:
            assert f.chain5.call(0).result(30) == 5
            c0, t0 = process_cpu(pid), time.perf_counter()
            assert dflow.gather(asyncio.run(start_all()), timeout=300) == [i + 5 for i in range(runs)]
            wall = time.perf_counter() - t0
            cpu.append((process_cpu(pid) - c0) / (runs * 5))
            return runs * 5 / wall
        finally:
            dflow.shutdown()

    return measure


def main() -> None:
    is_quick = quick(__doc__ or "")
    count, runs = (2, 200) if is_quick else (9, 600)
    checks = {"with": hiredis_in_use(blocked=False), "without": hiredis_in_use(blocked=True)}
    if checks != {"with": True, "without": False}:
        raise SystemExit(f"hiredis must be installed and blockable here; found {checks}")
    load, cpu = Load(), {name: [] for name in NAMES}
    with own_redis() as server, two_workers(server) as workers:
        seen = rounds({n: driver(workers[n], runs, cpu[n]) for n in NAMES}, count, load=load)
    results = {
        "rounds": count,
        "runs": runs,
        "load": load.summary(),
        "steps_per_s": seen,
        "cpu_per_step_s": cpu,
    }
    report("hiredis", results, render(results), keep=not is_quick)


def render(res: dict[str, Any]) -> str:
    seen, cpu = res["steps_per_s"], res["cpu_per_step_s"]
    rows = [
        [
            NAMES[n],
            f"{statistics.median(seen[n]):,.0f}",
            spread(seen[n]),
            f"{ratio(seen, n, 'without'):.2f}×",
            ms(statistics.median(cpu[n])),
            f"{ratio(cpu, n, 'without'):.2f}×",
        ]
        for n in NAMES
    ]
    head = [
        "one dflow worker, 5-step chains of trivial steps",
        "steps/s",
        "spread",
        "÷ without",
        "worker CPU / step",
    ]
    lines = [
        f"{res['rounds']} interleaved rounds of {res['runs']} runs started at once (Redis Streams, concurrency 64).",
        "",
        *table([*head, "÷ without"], rows),
        "",
        f"- {NOISE} Here: {Load.text(res['load'])}.",
        "- The client has hiredis in both; only the worker's parser and packer differ. Worker CPU = user + "
        "system time of the worker process. Redis and the client share the machine's 2 cores with it.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
