"""The pulled-job round trip on Redis, beside the bare HTTP round trip of the same server.

    python benchmarks/bench_pulling.py           # writes benchmarks/results/pulling.{json,md}
    python benchmarks/bench_pulling.py --quick   # fewer runs, prints only

``dflow serve`` and one ``dflow worker`` (processes, Redis Streams transport, Redis store,
``RedisJobBoard``) serve ``benchmarks/_bench_pulling.py``; this process is the client: one
thread long-polls ``GET /jobs?wait=30`` and reports each job at once (``POST /jobs/{id}``),
as a browser plug-in would; the main thread starts one run at a time (``POST /runs``) and
waits for it. Per run, from the step records and the client's clocks (one machine):

* **round trip**: the tool step starts (it posts the job and parks the run) → the next step
  starts (the report resumed the run, which took the answer through its join);
* its parts: *park* (tool step start → the job is stamped, just before it is written to
  Redis), *deliver* (stamped → the long poll has it), *report* (the report's HTTP round
  trip), *resume* (report sent → next step starts);
* **bare HTTP**: ``GET /health`` round trips on the same server, same client, keep-alive.

Redis needs 127.0.0.1:6379 (db 15; only the benchmark's keys are deleted).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx

import dflow
from benchmarks._procs import log_path, start, stop, worker_cmd
from benchmarks._results import quick, report

SECRET = "bench-pulling-secret-0123456789abcdef"
SERVER_SECRET = "bench-pulling-server-secret-0123456789"
ADMIN = "bench-pulling-admin-token-0123456789abcdef"
REDIS = os.environ.get("BENCH_PULLING_REDIS", "redis://127.0.0.1:6379/15")
PREFIX = f"bench-pulling-{os.getpid()}"


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": p95 * 1e3,
        "min_ms": ordered[0] * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "n": len(ordered),
    }


class Puller(threading.Thread):
    """The client: long-polls the session's jobs and reports each at once."""

    def __init__(self, url: str, token: str) -> None:
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"})
        self.seen: dict[str, dict[str, float]] = {}  # by run: when its job came, was reported, came back
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            jobs = self.http.get("/jobs", params={"wait": 1}).json()["jobs"]
            got = time.time()
            for job in jobs:
                sent = time.time()
                r = self.http.post(f"/jobs/{job['id']}", json={"result": job["arguments"]["n"]})
                back = time.time()
                assert r.status_code == 200, r.text
                self.seen[job["run"]] = {"posted": job["created"], "got": got, "sent": sent, "back": back}


def bench(runs: int) -> dict[str, Any]:
    import redis

    transport = f"{REDIS}?stream={PREFIX}:steps"
    store = f"{REDIS}?prefix={PREFIX}"
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_SERVER_SECRET": SERVER_SECRET,
        "DFLOW_SERVER_TOKEN": ADMIN,
        "BENCH_PULLING_REDIS": REDIS,
        "BENCH_PULLING_PREFIX": PREFIX,
    }
    module = "benchmarks._bench_pulling"
    worker, _ = start(worker_cmd(module, transport, store, 64), log_path("pulling-worker"), env, "serving")
    server = None
    try:
        server, url = start(
            [
                sys.executable,
                "-m",
                "dflow.cli",
                "serve",
                module,
                "--transport",
                transport,
                "--store",
                store,
                "--port",
                "0",
                "--log-level",
                "WARNING",
                "--grace",
                "1",
            ],
            log_path("pulling-serve"),
            {**env, "DFLOW_LOG_LEVEL": "WARNING"},
            r"http://127\.0\.0\.1:[0-9]+",
        )
        dflow.configure(transport, store, secret=SECRET, consume=False)
        http = httpx.Client(base_url=url, timeout=60)
        session = http.post("/sessions", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        me = {"Authorization": f"Bearer {session['token']}"}
        puller = Puller(url, session["token"])
        puller.start()
        rows: list[dict[str, float]] = []
        for i in range(runs + 20):
            trace = http.post("/runs", headers=me, json={"pipeline": "bench-pull", "param": i}).json()[
                "trace_id"
            ]
            run = dflow.Run(trace)
            assert run.result(30) > 0
            steps = {s.key.split(">")[0].split("/")[0]: s for s in run.context().steps}
            while trace not in puller.seen:  # the run may end before the report's response is back
                time.sleep(0.0005)
            seen = puller.seen[trace]
            if i >= 20:  # warm-up done
                t0, t1 = steps["tool"].started, steps["next"].started
                rows.append(
                    {
                        "round_trip": t1 - t0,
                        "park": seen["posted"] - t0,
                        "deliver": seen["got"] - seen["posted"],
                        "report": seen["back"] - seen["sent"],
                        "resume": t1 - seen["sent"],
                    }
                )
        bare = []
        for _ in range(20):
            http.get("/health")
        for _ in range(max(runs, 200)):
            t0 = time.perf_counter()
            http.get("/health")
            bare.append(time.perf_counter() - t0)
        puller.stop = True
        puller.join(5)
        out = {
            key: stats([r[key] for r in rows])
            for key in ("round_trip", "park", "deliver", "report", "resume")
        }
        out["bare_http"] = stats(bare)
        out["over_bare_ms"] = out["round_trip"]["median_ms"] - out["bare_http"]["median_ms"]
        out["over_bare_p95_ms"] = out["round_trip"]["p95_ms"] - out["bare_http"]["p95_ms"]
        return out
    finally:
        with contextlib.suppress(Exception):
            dflow.shutdown()
        if server is not None:
            stop(server)
        stop(worker)
        r = redis.Redis.from_url(REDIS)
        keys = list(r.scan_iter(f"{PREFIX}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def render(results: dict[str, Any]) -> str:
    rt, _bare = results["round_trip"], results["bare_http"]
    lines = [
        f"Pulled-job round trip on Redis Streams (dflow serve + 1 worker process, RedisJobBoard; {rt['n']} runs, "
        "one at a time; the client long-polls and reports at once)",
        "",
        "| | median | p95 | min | mean |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {
        "round_trip": "**round trip**: tool step starts → next step starts",
        "park": "park: tool step starts → job posted",
        "deliver": "deliver: posted → long poll has it",
        "report": "report: POST /jobs/{id} round trip",
        "resume": "resume: report sent → next step starts",
        "bare_http": "bare HTTP round trip (GET /health)",
    }
    for key, name in names.items():
        s = results[key]
        lines.append(
            f"| {name} | {s['median_ms']:.2f} ms | {s['p95_ms']:.2f} ms | {s['min_ms']:.2f} ms | "
            f"{s['mean_ms']:.2f} ms |"
        )
    lines += [
        "",
        f"Round trip over the bare HTTP round trip: **{results['over_bare_ms']:.2f} ms** (median), "
        f"{results['over_bare_p95_ms']:.2f} ms (p95); target ≤ 5 ms.",
    ]
    return "\n".join(lines)


def main() -> None:
    is_quick = quick(__doc__)
    results = bench(30 if is_quick else 300)
    report("pulling", results, render(results), keep=not is_quick)


if __name__ == "__main__":
    main()
