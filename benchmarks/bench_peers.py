"""dflow against Celery and Dramatiq on like-for-like work, side by side in one run: 5-step
chains against chains of 5 tasks, single steps against single tasks; latency one at a time
and throughput with one worker process.

    python benchmarks/bench_peers.py           # writes benchmarks/results/peers.{json,md}
    python benchmarks/bench_peers.py --quick   # fewer rounds, prints only

Every system runs on a Redis server of the benchmark's own (``redis-server`` on PATH), each
on a db of its own, with its worker started once; rounds take the systems in turn and every
ratio is the median of per-round ratios. Dramatiq is measured twice: with its default
empty-queue poll and with ``dramatiq_worker_timeout=1`` (a poll of at most 1 ms). The peers
come from ``benchmarks/requirements.txt``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks import _procs
from benchmarks._fair import NOISE, Load, group_cpu, ms, own_redis, ratio, rounds, spread, table
from benchmarks._results import quick, report

SECRET = "bench-peers-secret-0123456789abcdef"
CHAIN = 5
# Dramatiq's Redis consumer sleeps when its queue is empty: 5 ms doubling with each empty fetch
# (times a jitter of 1 to 2), at most the worker timeout (1000 ms by default), back to 5 ms after a message.
FAST_POLL_MS = 2  # its sleep is then int(2 × a number from 0.5 to 1) ms: 1 ms (with 1, 0 ms: a spin)


def commands(server: str) -> dict[str, tuple[list[str], dict[str, str], str]]:
    """Each system's worker: command, environment and the line that says it is ready. dflow on
    db 0, Celery's broker and results on dbs 1 and 2, Dramatiq's on 3 and 4 (one worker with the
    default poll, one with ``FAST_POLL_MS``)."""
    env = {
        "DFLOW_SECRET": SECRET,
        "BENCH_CELERY_BROKER": f"{server}/1",
        "BENCH_CELERY_BACKEND": f"{server}/2",
        "BENCH_DRAMATIQ_BROKER": f"{server}/3",
        "BENCH_DRAMATIQ_RESULTS": f"{server}/4",
    }
    os.environ.update(env)  # this process is every system's client
    py, flows = sys.executable, "benchmarks._bench_flows"
    celery = [py, "-m", "celery", "-A", flows, "worker", "--pool=solo", "-Q", "bench", "-l", "info"]
    celery += ["--without-heartbeat", "--without-gossip", "--without-mingle"]
    dramatiq = [py, "-m", "dramatiq", flows, "-p", "1", "-t", "8", "-Q"]
    dflow_worker = _procs.worker_cmd(flows, f"{server}/0?stream=peers", f"{server}/0?prefix=peers", 64)
    fast = {**env, "dramatiq_worker_timeout": str(FAST_POLL_MS)}
    return {
        "dflow": (dflow_worker, env, "serving"),
        "celery": (celery, env, " ready."),
        "dramatiq": ([*dramatiq, "bench"], env, "is ready for action"),
        "dramatiq_fast": ([*dramatiq, "bench-fast"], fast, "is ready for action"),
    }


@contextlib.contextmanager
def running(server: str, names: list[str]) -> Iterator[dict[str, int]]:
    """The workers ``names`` of :func:`commands` started (dflow's with this process as its
    client); yields their process group ids by name."""
    procs = []
    try:
        for name, (cmd, env, ready) in commands(server).items():
            if name in names:
                procs.append(_procs.start(cmd, _procs.log_path(f"peers-{name}"), env, ready)[0])
        if "dflow" in names:
            dflow.configure(
                f"{server}/0?stream=peers", f"{server}/0?prefix=peers", secret=SECRET, consume=False
            )
        yield {name: p.pid for name, p in zip(names, procs, strict=True)}
    finally:
        if "dflow" in names:
            with contextlib.suppress(Exception):
                dflow.shutdown()
        for p in procs:
            _procs.stop(p)


def chain_starters(f: Any) -> dict[str, Callable[[], Callable[[], Any]]]:
    """For each system, a function that starts one chain of ``CHAIN`` increments from 0 and
    returns a function that waits for its result."""
    import celery
    import dramatiq

    def pipe(actor: Any) -> Callable[[], Any]:
        p = dramatiq.pipeline([actor.message(0), *(actor.message() for _ in range(CHAIN - 1))]).run()
        return lambda: p.get_result(block=True, timeout=60_000)

    def celery_chain() -> Callable[[], Any]:
        r = celery.chain(f.c_inc.s(0), *(f.c_inc.s() for _ in range(CHAIN - 1))).apply_async()
        return lambda: r.get(timeout=60)

    def dflow_chain() -> Callable[[], Any]:
        r = f.chain5.call(0)
        return lambda: r.result(60)

    return {
        "dflow": dflow_chain,
        "celery": celery_chain,
        "dramatiq": lambda: pipe(f.d_inc),
        "dramatiq_fast": lambda: pipe(f.d_inc_fast),
    }


def single_starters(f: Any) -> dict[str, Callable[[], Callable[[], Any]]]:
    """The same for one increment (a one-step flow, one task)."""

    def dramatiq_one(actor: Any) -> Callable[[], Any]:
        m = actor.send(0)
        return lambda: m.get_result(block=True, timeout=60_000)

    def dflow_one() -> Callable[[], Any]:
        r = f.single.call(0)
        return lambda: r.result(60)

    def celery_one() -> Callable[[], Any]:
        r = f.c_inc.delay(0)
        return lambda: r.get(timeout=60)

    return {
        "dflow": dflow_one,
        "celery": celery_one,
        "dramatiq": lambda: dramatiq_one(f.d_inc),
        "dramatiq_fast": lambda: dramatiq_one(f.d_inc_fast),
    }


def latency(
    start: Callable[[], Callable[[], Any]], steps: int, runs: int, expect: int
) -> Callable[[], float]:
    """A round's figure: the median time per step, end to end, of ``runs`` runs one at a time."""

    def measure() -> float:
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            assert start()() == expect
            walls.append((time.perf_counter() - t0) / steps)
        return statistics.median(walls)

    return measure


def throughput(
    start: Callable[[], Callable[[], Any]],
    steps: int,
    count: int,
    pgid: int,
    cpu: dict[str, list[float]],
    key: str,
) -> Callable[[], float]:
    """A round's figure: steps/s of ``count`` runs started at once (first start to last result
    read); the worker's CPU per step goes into ``cpu[key]``."""

    def measure() -> float:
        c0, t0 = group_cpu(pgid), time.perf_counter()
        waits = [start() for _ in range(count)]
        for wait in waits:
            wait()
        wall = time.perf_counter() - t0
        cpu.setdefault(key, []).append((group_cpu(pgid) - c0) / (count * steps))
        return count * steps / wall

    return measure


def systems(
    f: Any, pgids: dict[str, int], q: bool, cpu: dict[str, list[float]]
) -> dict[str, Callable[[], float]]:
    """Every measurement of a round of dflow, Celery and Dramatiq, keyed ``benchmark/system``."""
    runs, chains, singles = (5, 40, 200) if q else (15, 200, 1000)
    out: dict[str, Callable[[], float]] = {}
    for bench, starters, steps in (("chain", chain_starters(f), CHAIN), ("single", single_starters(f), 1)):
        for name in ("dflow", "celery", "dramatiq"):
            out[f"latency_{bench}/{name}"] = latency(starters[name], steps, runs, steps)
            out[f"throughput_{bench}/{name}"] = throughput(
                starters[name],
                steps,
                chains if bench == "chain" else singles,
                pgids[name],
                cpu,
                f"{bench}/{name}",
            )
    return out


def poll_systems(f: Any, q: bool) -> dict[str, Callable[[], float]]:
    """The latencies of dflow and of Dramatiq with its default and its shorter poll."""
    runs = 5 if q else 15
    out: dict[str, Callable[[], float]] = {}
    for bench, starters, steps in (("chain", chain_starters(f), CHAIN), ("single", single_starters(f), 1)):
        for name in ("dflow", "dramatiq", "dramatiq_fast"):
            out[f"latency_{bench}/{name}"] = latency(starters[name], steps, runs, steps)
    return out


def measure(
    measures: dict[str, Callable[[], float]], count: int, cpu: dict[str, list[float]], load: Load
) -> dict[str, list[float]]:
    """Every measure once to warm up (its CPU figures dropped), then ``count`` rounds."""
    for m in measures.values():
        m()
    cpu.clear()
    return rounds(measures, count, load=load)


def main() -> None:
    is_quick = quick(__doc__ or "")
    count, load, cpu = (2 if is_quick else 7), Load(), {}
    with own_redis() as server, running(server, ["dflow", "celery", "dramatiq"]) as pgids:
        from benchmarks import _bench_flows as f

        seen = measure(systems(f, pgids, is_quick, cpu), count, cpu, load)
        with running(server, ["dramatiq_fast"]):
            polls = measure(poll_systems(f, is_quick), count, {}, load)
    results = {
        "rounds": count,
        "load": load.summary(),
        "per_round": seen,
        "poll_rounds": polls,
        "cpu_per_step_s": cpu,
    }
    report("peers", results, render(results), keep=not is_quick)


NAMES = {
    "dflow": "dflow, Redis Streams, 1 worker process (concurrency 64)",
    "celery": "Celery, solo pool (1 process)",
    "dramatiq": "Dramatiq, 1 process × 8 threads, default poll (5–10 ms after each message, doubling)",
    "dramatiq_fast": f"Dramatiq, same, `dramatiq_worker_timeout={FAST_POLL_MS}` (an empty-queue sleep of 1 ms)",
}


TITLES = {"chain": f"a chain of {CHAIN} trivial steps / tasks", "single": "one trivial step / task"}


def latency_rows(seen: dict[str, list[float]], bench: str, names: list[str]) -> list[list[str]]:
    lat = f"latency_{bench}"
    return [
        [
            NAMES[n],
            ms(statistics.median(seen[f"{lat}/{n}"])),
            spread(seen[f"{lat}/{n}"]),
            f"{ratio(seen, f'{lat}/{n}', f'{lat}/dflow'):.2f}×",
        ]
        for n in names
    ]


def throughput_rows(seen: dict[str, list[float]], cpu: dict[str, list[float]], bench: str) -> list[list[str]]:
    thr = f"throughput_{bench}"
    return [
        [
            NAMES[n],
            f"{statistics.median(seen[f'{thr}/{n}']):,.0f}",
            spread(seen[f"{thr}/{n}"]),
            f"{ratio(seen, f'{thr}/dflow', f'{thr}/{n}'):.2f}×",
            ms(statistics.median(cpu[f"{bench}/{n}"])),
        ]
        for n in ("dflow", "celery", "dramatiq")
    ]


def render(res: dict[str, Any]) -> str:
    seen, polls = res["per_round"], res["poll_rounds"]
    lines = [f"Side by side on one Redis of the benchmark's own, {res['rounds']} interleaved rounds.", ""]
    for bench, title in TITLES.items():
        head = [
            f"latency, {title}, one at a time: per step, end to end",
            "median",
            "spread of rounds",
            "÷ dflow",
        ]
        lines += [*table(head, latency_rows(seen, bench, ["dflow", "celery", "dramatiq"])), ""]
        head = [
            f"throughput, {title}, all started at once",
            "steps/s",
            "spread of rounds",
            "dflow ÷ this",
            "worker CPU / step",
        ]
        lines += [*table(head, throughput_rows(seen, res["cpu_per_step_s"], bench)), ""]
    for bench, title in TITLES.items():
        head = [f"Dramatiq's poll: latency, {title}, per step", "median", "spread of rounds", "÷ dflow"]
        lines += [*table(head, latency_rows(polls, bench, ["dflow", "dramatiq", "dramatiq_fast"])), ""]
    lines += [
        f"- {NOISE} Here: {Load.text(res['load'])}.",
        "- End to end = from the start call to the result read by the client (dflow's `result()`, Celery's `get()`, "
        "Dramatiq's `get_result(block=True)`); per step = that / the chain's length. Throughput = steps / time from "
        "the first start to the last result read, so the client's own cost counts for every system. Worker CPU = "
        "user + system time of the worker's processes.",
        "- Dramatiq's latency is mostly its broker's empty-queue poll: after each message its consumer finds the queue "
        "empty and sleeps 5–10 ms (doubling while it stays empty, up to `dramatiq_worker_timeout`, 1000 ms by "
        f"default). The last two tables run a second Dramatiq worker with `dramatiq_worker_timeout={FAST_POLL_MS}`, "
        "which caps that sleep at about 1 ms (and polls Redis about 1,000 times a second while idle), in rounds of "
        "their own, so that its polling does not weigh on the other tables.",
        "- Celery's solo pool runs one task at a time in one process; dflow's worker runs up to 64 steps at once "
        "in one process; Dramatiq's 8 threads share one process. Redis, the client and every worker share the "
        "machine's 2 cores.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
