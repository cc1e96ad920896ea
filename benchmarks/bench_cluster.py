"""dflow on a Redis Cluster: what the cluster path costs per step, and what one shard can carry.

    python benchmarks/bench_cluster.py           # full run (< 8 min), writes benchmarks/results/cluster.{json,md}
    python benchmarks/bench_cluster.py --quick   # < 2 min, prints only

Starts its own ``redis-server`` processes on free loopback ports (clusters through
``tests/support/redis_cluster.py``; the one-server reference with the same settings, db 15),
so that no one else's traffic is in the counts; needs ``redis-server`` and ``redis-cli``.
Worker processes (``dflow worker benchmarks._bench_flows``, concurrency 64, the default) log
to the system temp folder (``dflow-bench/logs``). Every process started here is stopped on exit.

1. throughput: 5-step chains of trivial steps, all started at once, on 2 worker processes,
   with the store and the transport on one server (``redis://``, streams=1) and on a cluster
   of 1, 2 and 3 masters (streams=16); every target up at once, each with its own workers,
   measured in rounds (one after the other, again and again). The end is when every stream is
   empty (a fused store deletes a message once its step commits, and adds the next one in the
   same script), then every run is checked to be done.
2. Redis work per step: INFO commandstats, stats and cpu of every node before and after,
   read on connections of their own, less this script's reads (its XLEN polls and INFO).
3. ``wait=1`` on 3 masters with a replica each, against ``wait=0`` on the same cluster.
4. idle: commands/s of 1 and 20 idle workers on 3 masters (INFO deltas of every master,
   and MONITOR for what they send vs. what their scripts run).
5. a projection of steps/s per shard and for 10 shards from the Redis CPU time per step.

The servers, counters and worker processes are in ``_cluster_rig.py``; the tables and the
projection in ``_cluster_report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis

import dflow
from benchmarks._cluster_report import page, projection, shard_cpu
from benchmarks._cluster_rig import (
    CONCURRENCY,
    HOST,
    SECRET,
    StreamPoll,
    Target,
    cluster_of,
    cluster_target,
    delta,
    info_all,
    log_problems,
    monitored,
    monitors,
    one_server,
    proc_cpu,
    workers,
)
from benchmarks._results import report

WORKERS = 2
STEPS_PER_RUN = 5
STRAGGLER_KEYS = ("stragglers", "statuses", "first", "first_lease_left_s", "finished_after_s")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the client ------------------------------------------------------------------------


@contextlib.contextmanager
def client(t: Target) -> Iterator[None]:
    dflow.configure(t.transport, t.store, secret=SECRET, consume=False)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            dflow.shutdown()


def start_many(entry: Any, params: list[Any], at_once: int = 32) -> list[dflow.Run]:
    """Start runs concurrently (``acall`` on the client's runtime loop), ``at_once`` at a
    time (as a web app's handlers would)."""

    async def go() -> list[dflow.Run]:
        gate = asyncio.Semaphore(at_once)

        async def one(p: Any) -> dflow.Run:
            async with gate:
                run: dflow.Run = await entry.acall(p)
                return run

        return list(await asyncio.gather(*(one(p) for p in params)))

    return asyncio.run(go())


# -- throughput ------------------------------------------------------------------------


def drain(poll: StreamPoll, timeout: float, pause: float = 0.005) -> float:
    """Wait until every stream is empty; the time it was seen empty."""
    deadline = time.monotonic() + timeout
    while poll.left():
        if time.monotonic() > deadline:
            raise TimeoutError(f"streams not empty after {timeout}s")
        time.sleep(pause)
    return time.perf_counter()


def not_done(t: Target, traces: list[str]) -> dict[str, dict[bytes, bytes]]:
    """The runs among ``traces`` that are not done, with their records."""
    nodes = {p: redis.Redis(host=HOST, port=p, db=t.db) for p in t.masters}
    try:
        pipes = {p: r.pipeline(transaction=False) for p, r in nodes.items()}
        order: dict[int, list[str]] = {p: [] for p in nodes}
        for trace in traces:
            port, key = t.run_key(trace)
            pipes[port].hgetall(key)
            order[port].append(trace)
        found = {tr: h for p, pipe in pipes.items() for tr, h in zip(order[p], pipe.execute())}
    finally:
        for r in nodes.values():
            r.close()
    return {tr: h for tr, h in found.items() if h.get(b"status") != b"done"}


def stragglers(t: Target, traces: list[str], timeout: float = 120.0) -> dict[str, Any]:
    """Runs left unfinished when every stream was empty (none, unless a step message was
    lost): how many, what their records said, and how long until they finished."""
    left = not_done(t, traces)
    if not left:
        return {"stragglers": 0}
    first = next(iter(left.values()))
    now = time.time()
    out: dict[str, Any] = {
        "stragglers": len(left),
        "statuses": dict(Counter(h.get(b"status", b"?").decode() for h in left.values())),
        "first": {
            k.decode(): v.decode(errors="replace")[:60]
            for k, v in first.items()
            if k in (b"status", b"seq", b"lease_until", b"updated")
        },
        "first_lease_left_s": float(first.get(b"lease_until", now)) - now,
    }
    log(
        f"{t.name}: {len(left)} runs not done with every stream empty: {out['statuses']}, e.g. {out['first']}"
    )
    t0 = time.monotonic()
    while (left := not_done(t, list(left))) and time.monotonic() - t0 < timeout:
        time.sleep(0.5)
    out["finished_after_s"] = None if left else time.monotonic() - t0
    return out


def warm(t: Target, flows: Any, poll: StreamPoll) -> None:
    """Every worker connected to every node, every script loaded."""
    for _ in range(10):
        assert flows.chain5.call(0).result(30) == STEPS_PER_RUN
    runs = start_many(flows.chain5.entry("start"), list(range(300)))
    dflow.gather(runs, timeout=60)
    drain(poll, 30)


def throughput(
    t: Target, flows: Any, procs: list[subprocess.Popen[bytes]], poll: StreamPoll, runs: int
) -> dict[str, Any]:
    """``runs`` 5-step chains started at once; steps/s and what each master did for them."""
    drain(poll, 30)
    nodes = t.masters + t.replicas
    pids = [p.pid for p in procs]
    poll.reset()
    before, w0, c0 = info_all(nodes), proc_cpu(pids), time.process_time()
    p0 = time.perf_counter()
    handles = start_many(flows.chain5.entry("start"), list(range(runs)))
    submitted = time.perf_counter() - p0
    end = drain(poll, 300)
    after, w1, c1 = info_all(nodes), proc_cpu(pids), time.process_time()
    traces = [h.trace_id for h in handles]
    late = stragglers(t, traces)
    for i in (0, runs // 2, runs - 1):
        assert handles[i].result(5) == i + STEPS_PER_RUN
    steps = runs * STEPS_PER_RUN
    on_node = Counter(t.run_key(tr)[0] for tr in traces)
    shards: dict[str, dict[str, Any]] = {}
    for port in nodes:
        d = delta(before[port], after[port])
        d["calls"]["xlen"] -= poll.calls[port]
        d["calls"] = +d["calls"]
        d["net_in"] -= poll.sent[port]
        d["net_out"] -= poll.got[port]
        d["steps"] = on_node[port] * STEPS_PER_RUN
        d["buckets"] = t.owners.count(port)
        d["role"] = "master" if port in t.masters else "replica"
        shards[str(port)] = d
    masters = [shards[str(p)] for p in t.masters]
    calls: Counter[str] = sum((Counter(m["calls"]) for m in masters), Counter())
    wall = end - p0
    return {
        "runs": runs,
        "steps": steps,
        "submit_s": submitted,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "worker_cpu_per_step_s": (w1 - w0) / steps,
        "client_cpu_per_step_s": (c1 - c0) / steps,
        "redis_cpu_per_step_s": sum(m["cpu_s"] for m in masters) / steps,
        "replica_cpu_per_step_s": sum(shards[str(p)]["cpu_s"] for p in t.replicas) / steps,
        "commands_per_step": sum(calls.values()) / steps,
        "net_in_per_step": sum(m["net_in"] for m in masters) / steps,
        "net_out_per_step": sum(m["net_out"] for m in masters) / steps,
        "repl_out_per_step": sum(m["repl_out"] for m in masters) / steps,
        "error_replies": sum(m["error_replies"] for m in masters),
        "new_connections": sum(m["connections"] for m in masters),
        "evalsha_per_step": calls["evalsha"] / steps,
        "evalsha_usec_per_call": sum(m["usec"].get("evalsha", 0) for m in masters) / max(1, calls["evalsha"]),
        "by_name_per_step": {k: v / steps for k, v in calls.most_common()},
        "poll_commands": sum(poll.calls.values()),
        **late,
        "shards": shards,
    }


MEDIANS = (
    "redis_cpu_per_step_s",
    "worker_cpu_per_step_s",
    "client_cpu_per_step_s",
    "replica_cpu_per_step_s",
    "commands_per_step",
    "net_in_per_step",
    "net_out_per_step",
)


def summary(t: Target, results: list[dict[str, Any]], problems: list[str]) -> dict[str, Any]:
    """The round of median steps/s, with every round's steps/s, the medians over the rounds
    of the costs per step (``MEDIANS``) and of each master's CPU per step."""
    rates = [r["steps_per_s"] for r in results]
    per_master = [shard_cpu(r) for r in results]
    mid = sorted(results, key=lambda r: r["steps_per_s"])[len(results) // 2]
    log(f"{t.name}, wait={t.wait}: steps/s {', '.join(f'{x:,.0f}' for x in rates)}")
    if problems:
        log(f"{t.name}: the workers logged {len(problems)} warnings/errors, e.g. {problems[0]}")
    return {
        **mid,
        "name": t.name,
        "masters": len(t.masters),
        "replicas": len(t.replicas),
        "streams": t.streams,
        "wait": t.wait,
        "steps_per_s_reps": rates,
        "steps_per_s_median": statistics.median(rates),
        "worker_log_problems": len(problems),
        "worker_log_problems_first": problems[:3],
        "all_stragglers": [{k: v for k, v in r.items() if k in STRAGGLER_KEYS} for r in results],
        **{k: statistics.median(r[k] for r in results) for k in MEDIANS},
        "shard_cpu_per_step_s": {p: statistics.median(m[p] for m in per_master) for p in per_master[0]},
    }


def compare(targets: list[Target], flows: Any, runs: int, reps: int) -> list[dict[str, Any]]:
    """Throughput on each target, ``reps`` rounds over all of them (so that a change in
    this machine's load falls on every target alike); each target its own 2 workers."""
    results: dict[str, list[dict[str, Any]]] = {t.tag: [] for t in targets}
    polls = {t.tag: StreamPoll(t) for t in targets}
    crews: dict[str, list[subprocess.Popen[bytes]]] = {}
    try:
        with contextlib.ExitStack() as stack:
            for t in targets:
                crews[t.tag] = stack.enter_context(workers(WORKERS, t, t.tag))
            for t in targets:
                with client(t):
                    warm(t, flows, polls[t.tag])
            for i in range(reps):
                for t in targets:
                    log(f"round {i + 1}/{reps}: {t.name}, wait={t.wait}: {runs} runs")
                    with client(t):
                        for _ in range(5):  # a fresh client: its first calls find the slots
                            assert flows.chain5.call(0).result(30) == STEPS_PER_RUN
                        results[t.tag].append(throughput(t, flows, crews[t.tag], polls[t.tag], runs))
    finally:
        for poll in polls.values():
            poll.close()
    return [summary(t, results[t.tag], log_problems([p.pid for p in crews[t.tag]])) for t in targets]


# -- idle ------------------------------------------------------------------------------


def idle(t: Target, n: int, window: float, settle: float = 3.0) -> dict[str, Any]:
    log(f"idle: {n} worker(s) on {t.name}, {window:g} s")
    with workers(n, t, f"idle{n}") as procs:
        time.sleep(settle)  # past start-up
        pids = [p.pid for p in procs]
        with monitors(t.masters) as paths:
            before, w0, t0 = info_all(t.masters), proc_cpu(pids), time.perf_counter()
            time.sleep(window)
            after, w1, t1 = info_all(t.masters), proc_cpu(pids), time.perf_counter()
        sent, inner = monitored(paths)
    secs = t1 - t0
    deltas = [delta(before[p], after[p]) for p in t.masters]
    calls: Counter[str] = sum((Counter(d["calls"]) for d in deltas), Counter())
    return {
        "workers": n,
        "window_s": secs,
        "commands_per_s": sum(calls.values()) / secs,
        "commands_per_worker_s": sum(calls.values()) / secs / n,
        "sent_per_worker_s": sum(sent.values()) / secs / n,
        "inner_per_worker_s": sum(inner.values()) / secs / n,
        "redis_cpu_per_s": sum(d["cpu_s"] for d in deltas) / secs,
        "worker_cpu_per_s": (w1 - w0) / secs / n,
        "by_name_per_s": {k: v / secs for k, v in calls.most_common()},
        "sent_by_name_per_s": {k: v / secs for k, v in sent.most_common()},
    }


# -- main ------------------------------------------------------------------------------


def measure(quick: bool) -> dict[str, Any]:
    from benchmarks import _bench_flows as flows

    runs, reps = (500, 1) if quick else (2000, 5)
    window = 4.0 if quick else 10.0
    res: dict[str, Any] = {
        "params": {
            "runs": runs,
            "reps": reps,
            "workers": WORKERS,
            "concurrency": CONCURRENCY,
            "idle_window_s": window,
        }
    }
    with contextlib.ExitStack() as stack:
        log("starting the servers")
        targets = [stack.enter_context(one_server())]
        for m in (1, 2, 3):
            c = stack.enter_context(cluster_of(m))
            targets.append(cluster_target(f"Redis Cluster, {m} master{'s' if m > 1 else ''}", c, f"m{m}"))
        three = targets[-1]
        c = stack.enter_context(cluster_of(3, replicas=1))
        targets += [
            cluster_target("Redis Cluster, 3 masters + 1 replica each", c, f"r3w{w}", wait=w) for w in (0, 1)
        ]
        res["throughput"] = compare(targets, flows, runs, reps)
        res["idle"] = [{**idle(three, n, window), "masters": len(three.masters)} for n in (1, 20)]
    res["projection"] = projection(res["throughput"])
    return res


def _on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="under 2 minutes; print only, keep no results")
    args = ap.parse_args()
    for name in ("redis-server", "redis-cli"):
        if shutil.which(name) is None:
            raise SystemExit(f"{name} is not on PATH")
    os.environ["DFLOW_SECRET"] = SECRET
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    started, load0 = time.time(), os.getloadavg()
    try:
        res = measure(args.quick)
    finally:
        with contextlib.suppress(Exception):
            dflow.shutdown()
    load1, runtime = os.getloadavg(), time.time() - started
    version = subprocess.run(
        ["redis-server", "--version"], check=False, capture_output=True, text=True
    ).stdout.split()
    server = next((v.split("=")[1] for v in version if v.startswith("v=")), "?")
    res["run"] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "redis_server": server,
        "redis_py": redis.__version__,
        "dflow": dflow.__version__,
        "loadavg_before": load0,
        "loadavg_after": load1,
        "runtime_s": runtime,
        "quick": args.quick,
        "command": "python benchmarks/bench_cluster.py" + (" --quick" if args.quick else ""),
    }
    report("cluster", res, page(res), keep=not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
