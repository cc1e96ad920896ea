"""What an idle dflow worker costs Redis, and how late timers and lease take-overs are.

    python benchmarks/bench_idle.py                  # full run (~3 min), keeps benchmarks/results/idle.{json,md}
    python benchmarks/bench_idle.py --quick          # shorter windows, prints only
    python benchmarks/bench_idle.py --label before   # the name of this code's row in the kept results

Needs Redis at 127.0.0.1:6379 (``--redis`` to change); uses its db 14 under fresh key
prefixes, deleted afterwards. Worker processes run this module (``dflow worker
benchmarks.bench_idle``, Redis Streams, the fused store); their logs go to the system temp
folder (``dflow-bench/logs``).

1. idle cost: N idle workers (1 and 20); every command of their db and key prefix is
   counted from MONITOR over a window: the commands the workers send, and those their
   scripts run inside Redis. Per worker and second.
2. timer lateness: a step, then ``delay(0.2)``, then a step, on 2 idle workers (one run at a
   time, each after a pause): how much later than 0.2 s after the first step the second
   starts.
3. recovery after kill -9: 2 workers with a 2 s lease; a step blocks, its worker is killed
   with SIGKILL; the time from the lease running out (its ``lease_until`` as the kill
   leaves it) to the step's next start on the other worker.

The kept results hold a row for each ``--label`` run (the last run of each label wins).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgpack
import redis

import dflow
from dflow import ContextStack, DFlow

SECRET = "bench-secret-of-at-least-32-bytes-000"
DB = 14
DELAY = 0.2

# -- the flows the worker processes run ------------------------------------------------

_r = redis.Redis.from_url(os.environ.get("BENCH_IDLE_REDIS", f"redis://127.0.0.1:6379/{DB}"))
_PREFIX = os.environ.get("BENCH_IDLE_PREFIX", "idle")


def _stamp(x: Any) -> float:
    return time.time()


def _late(t0: float) -> float:
    """How much later than ``DELAY`` after ``t0`` this step starts."""
    return time.time() - t0 - DELAY


def _delayed(t0: float) -> DFlow[float]:
    return DFlow.delay(t0, DELAY)


def _stall(ctx: ContextStack, x: Any) -> int:
    """Record this start; the first blocks until its worker is killed."""
    t, first = time.time(), _r.incr(f"{_PREFIX}:n:{ctx.trace_id}") == 1  # (counted before it is seen)
    _r.rpush(f"{_PREFIX}:starts", f"{t} {ctx.attempt} {os.getpid()}")
    if first:
        time.sleep(600)
    return ctx.attempt


delayed = (
    DFlow.from_call("idle-delay")
    .map(_stamp)
    .id("stamp")
    .flat_map(_delayed)
    .id("delay")
    .map(_late)
    .id("late")
    .init("bench-idle-delay")
)
stalled = DFlow.from_call("idle-stall").map(_stall).id("stall").init("bench-idle-stall")

# -- measuring -------------------------------------------------------------------------

_MON = re.compile(r"^\d+\.\d+ \[(\d+) ([^\]]+)\] (.*)$")


class Bench:
    def __init__(self, url: str) -> None:
        self.url = url
        m = re.match(r"redis://([^:/]+):(\d+)", url)
        if m is None:
            raise SystemExit(f"--redis must look like redis://HOST:PORT, got {url!r}")
        self.host, self.port = m.group(1), int(m.group(2))
        self.db_url = f"redis://{self.host}:{self.port}/{DB}"
        self.r = redis.Redis.from_url(self.db_url)
        self.procs: list[subprocess.Popen[bytes]] = []

    @contextlib.contextmanager
    def workers(
        self, n: int, prefix: str, lease: float = 60.0, redeliver: float = 30.0
    ) -> Iterator[list[subprocess.Popen[bytes]]]:
        """``n`` workers on a fresh prefix (its keys deleted afterwards), with the defaults
        of ``dflow worker`` but ``lease`` and the transport's ``redeliver_after``."""
        from benchmarks import _procs

        transport = f"{self.db_url}?stream={prefix}:steps&redeliver_after={redeliver:g}"
        store = f"{self.db_url}?prefix={prefix}"
        env = {"DFLOW_SECRET": SECRET, "BENCH_IDLE_REDIS": self.db_url, "BENCH_IDLE_PREFIX": prefix}
        cmd = [
            sys.executable,
            "-m",
            "dflow.cli",
            "worker",
            "benchmarks.bench_idle",
            "--transport",
            transport,
            "--store",
            store,
            "--lease",
            str(lease),
            "--grace",
            "2",
        ]
        mine: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(n):
                proc, _ = _procs.start(cmd, _procs.log_path(f"idle-{n}-{i}"), env, "serving")
                mine.append(proc)
                self.procs.append(proc)
            yield mine
        finally:
            for proc in mine:
                if proc.poll() is None:
                    proc.terminate()
            for proc in mine:
                _procs.stop(proc)
                self.procs.remove(proc)
            keys = list(self.r.scan_iter(f"{prefix}:*", count=1000))
            if keys:
                self.r.delete(*keys)

    def count(self, prefix: str, window: float) -> tuple[Counter[str], Counter[str]]:
        """The commands on db ``DB`` naming ``prefix`` over ``window`` seconds, from MONITOR:
        those clients sent, and those scripts ran."""
        from benchmarks import _procs

        path = _procs.log_path("idle-monitor")
        with open(path, "wb") as out:
            mon = subprocess.Popen(
                ["redis-cli", "-h", self.host, "-p", str(self.port), "monitor"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 10
            while b"OK" not in path.read_bytes()[:10]:
                if time.monotonic() > deadline or mon.poll() is not None:
                    raise RuntimeError("redis-cli monitor did not start")
                time.sleep(0.02)
            time.sleep(window)
        finally:
            mon.terminate()
            mon.wait(5)
        sent: Counter[str] = Counter()
        inner: Counter[str] = Counter()
        for line in path.read_text(errors="replace").splitlines():
            m = _MON.match(line)
            if not m or int(m.group(1)) != DB or prefix not in m.group(3):
                continue
            name = m.group(3).split(" ", 1)[0].strip('"').upper()
            (inner if m.group(2) == "lua" else sent)[name] += 1
        path.unlink()
        return sent, inner

    def idle_cost(self, n: int, window: float) -> dict[str, Any]:
        prefix = f"bi{uuid.uuid4().hex[:8]}"
        with self.workers(n, prefix):
            time.sleep(3.0)  # past start-up
            sent, inner = self.count(prefix, window)
        per = n * window
        return {
            "workers": n,
            "window_s": window,
            "sent_per_worker_s": round(sum(sent.values()) / per, 2),
            "inner_per_worker_s": round(sum(inner.values()) / per, 2),
            "sent": dict(sent.most_common()),
            "inner": dict(inner.most_common()),
        }

    def client(self, prefix: str) -> None:
        dflow.configure(
            f"{self.db_url}?stream={prefix}:steps",
            f"{self.db_url}?prefix={prefix}",
            secret=SECRET,
            consume=False,
        )

    def timer_lateness(self, runs: int, pause: float) -> dict[str, Any]:
        prefix = f"bi{uuid.uuid4().hex[:8]}"
        with self.workers(2, prefix, redeliver=2):
            self.client(prefix)
            try:
                late = []
                for _ in range(runs):
                    time.sleep(pause)  # the workers go idle
                    late.append(delayed.call(None).result(30))
            finally:
                dflow.shutdown()
        return summary(late, runs=runs, pause_s=pause)

    def orphan_timer(self, runs: int) -> dict[str, Any]:
        """The worker that set the timer is killed at once: the other one fires it."""
        late = []
        for _ in range(runs):
            prefix = f"bi{uuid.uuid4().hex[:8]}"
            with self.workers(2, prefix, redeliver=2) as procs:
                self.client(prefix)
                try:
                    time.sleep(2.0)  # idle
                    run = delayed.call(None)
                    deadline = time.monotonic() + 30
                    while self.r.hget(f"{prefix}:r:{run.trace_id}", "status") != b"sleeping":
                        if time.monotonic() > deadline:
                            raise RuntimeError("the run did not reach its delay")
                        time.sleep(0.002)
                    # the worker that committed the delay, from the run's last step record
                    last = msgpack.unpackb(
                        cast(bytes, self.r.lindex(f"{prefix}:s:{run.trace_id}", -1)), raw=False
                    )
                    pid = int(last[4].split(":")[-2])
                    os.kill(pid, signal.SIGKILL)
                    next(p for p in procs if p.pid == pid).wait()
                    late.append(run.result(30))
                finally:
                    dflow.shutdown()
        return summary(late, runs=runs)

    def recovery(self, runs: int, lease: float) -> dict[str, Any]:
        out = []
        for _ in range(runs):
            prefix = f"bi{uuid.uuid4().hex[:8]}"
            with self.workers(2, prefix, lease=lease, redeliver=2) as procs:
                self.client(prefix)
                try:
                    time.sleep(2.0)  # idle
                    run = stalled.call(None)
                    deadline = time.monotonic() + 30
                    while not (starts := self.r.lrange(f"{prefix}:starts", 0, -1)):
                        if time.monotonic() > deadline:
                            raise RuntimeError("the blocking step did not start")
                        time.sleep(0.01)
                    pid = int(starts[0].split()[2])
                    victim = next(p for p in procs if p.pid == pid)
                    os.kill(pid, signal.SIGKILL)
                    victim.wait()
                    until = float(self.r.hget(f"{prefix}:r:{run.trace_id}", "lease_until") or 0)
                    try:
                        run.result(lease + 30)
                    except dflow.RunTimeoutError:
                        starts = self.r.lrange(f"{prefix}:starts", 0, -1)
                        raise RuntimeError(
                            f"the step was not taken over: starts {starts}, killed {pid}, "
                            f"alive {[p.pid for p in procs if p.poll() is None]}"
                        ) from None
                    again = float(self.r.lrange(f"{prefix}:starts", 1, 1)[0].split()[0])
                    out.append(again - until)
                finally:
                    dflow.shutdown()
        return summary(out, runs=runs, lease_s=lease)


def summary(seconds: list[float], **about: Any) -> dict[str, Any]:
    return {
        **about,
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "all_ms": [round(x * 1000, 1) for x in seconds],
    }


MEASURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "1 idle worker: commands/s it sends (+ run inside its scripts)": lambda r: _idle(r["idle"]["1"]),
    "20 idle workers: commands/s each sends (+ inside scripts)": lambda r: _idle(r["idle"]["20"]),
    "delay(0.2): how late the next step starts, median / max": lambda r: _ms(r["timer"]),
    "delay(0.2), the worker that set it killed at once: median / max": lambda r: _ms(r["orphan"]),
    "kill -9 mid-step: taken over after the lease ran out, median / max": lambda r: _ms(r["recovery"]),
}


def _idle(r: dict[str, Any]) -> str:
    return f"{r['sent_per_worker_s']} (+{r['inner_per_worker_s']})"


def _ms(r: dict[str, Any]) -> str:
    return f"{r['median_ms']} / {r['max_ms']} ms"


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for name, cell in MEASURES.items():
        lines.append(f"| {name} | " + " | ".join(cell(r) if _has(r) else "" for r in rows.values()) + " |")
    lines += ["", SETUP, ""] + [f"- {label}: {r['note']}" for label, r in rows.items() if r.get("note")]
    return "\n".join(lines)


SETUP = (
    "Commands counted from MONITOR over 10 s on the workers' db and key prefix, with the defaults of "
    "`dflow worker` (lease 60 s, the stream's redeliver_after 30 s); the other rows on 2 workers with a "
    "2 s lease and redeliver_after 2 s, a client process scanning too (20 delays one at a time after "
    "1 s idle; 5 runs of each kill). Times past the due time / the lease's end."
)


def _has(r: dict[str, Any]) -> bool:
    return all(k in r for k in ("idle", "timer", "orphan", "recovery"))


def main() -> None:
    from benchmarks._results import RESULTS, report

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter windows, fewer runs; print only")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379", help="the Redis server (db 14 is used)")
    ap.add_argument("--label", default="now", help="the name of this run's row in the kept results")
    ap.add_argument("--note", default="", help="what the row's code is, shown under the table")
    args = ap.parse_args()
    b = Bench(args.redis)
    window = 4.0 if args.quick else 10.0
    try:
        row: dict[str, Any] = {"note": args.note, "idle": {}}
        for n in (1, 20):
            row["idle"][str(n)] = r = b.idle_cost(n, window)
            print(
                f"{n} idle workers: {r['sent_per_worker_s']} commands/s sent per worker "
                f"(+{r['inner_per_worker_s']} in scripts): {r['sent']}",
                flush=True,
            )
        row["timer"] = b.timer_lateness(5 if args.quick else 20, 1.0)
        print(f"timer lateness: {row['timer']}", flush=True)
        row["orphan"] = b.orphan_timer(2 if args.quick else 5)
        print(f"timer of a killed worker: {row['orphan']}", flush=True)
        row["recovery"] = b.recovery(2 if args.quick else 5, 2.0)
        print(f"recovery: {row['recovery']}", flush=True)
    finally:
        for proc in list(b.procs):
            proc.kill()
    kept = RESULTS / "idle.json"
    rows = {}
    if not args.quick and kept.exists():
        rows = json.loads(kept.read_text()).get("rows", {})
    rows[args.label] = row
    report("idle", {"rows": rows}, table(rows), keep=not args.quick)


if __name__ == "__main__":
    main()
