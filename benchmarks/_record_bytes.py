"""The driver of ``bench_record_bytes.py``: one 10-step chain passing a 100 KB value on Redis,
with the dflow first on ``PYTHONPATH`` (any checkout), and what the run's keys hold after,
printed as one JSON object.

    PYTHONPATH=CHECKOUT python benchmarks/_record_bytes.py --checkout CHECKOUT --redis redis://127.0.0.1:PORT/0 --name NAME

Its worker runs in this process. It uses only the public API both sides of a comparison
have (``DFlow``, ``Pipeline.call``, ``Run.result``/``context``) and reads the run's keys
(``<NAME>:*:<trace>``) with redis-py: ``MEMORY USAGE`` of each, and the summed sizes of its
step records as the server holds them.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import redis

import dflow
from dflow import DFlow

SECRET = "bench-record-bytes-secret-0123456789abcdef"
VALUE_BYTES = 100_000
STEPS = 10


def turn(x: bytes) -> bytes:
    """A new 100 KB value from the one before: its bytes turned by one."""
    return x[1:] + x[:1]


def _chain() -> Any:
    flow = DFlow.from_call("start")
    for i in range(STEPS):
        flow = flow.map(turn).id(f"s{i}")
    return flow.init("bench-record-bytes")


chain = _chain()


def run_keys(r: redis.Redis, name: str, trace: str) -> list[bytes]:
    return [k for k in r.scan_iter(f"{name}*", count=1000) if k.endswith(f":{trace}".encode())]


def measure(url: str, name: str) -> dict[str, Any]:
    dflow.configure(f"{url}?stream={name}", f"{url}?prefix={name}", secret=SECRET)
    try:
        value = os.urandom(VALUE_BYTES)
        run = chain.call(value)
        out = run.result(60)
        expected = value
        for _ in range(STEPS):
            expected = turn(expected)
        assert out == expected
        steps = run.context().steps
        read_ok = all(s.input == turn_back(s.output) for s in steps[1:] if s.input is not None)
        r = redis.Redis.from_url(url)
        keys = run_keys(r, name, run.trace_id)
        usage = {k.decode(): int(r.memory_usage(k, samples=0) or 0) for k in keys}
        lists = [k for k in keys if b":s:" in k]
        records = [len(x) for k in lists for x in r.lrange(k, 0, -1)]
        r.close()
        return {
            "dflow": dflow.__file__,
            "records": len(records),
            "record_bytes": sum(records),
            "memory_usage_bytes": sum(usage.values()),
            "memory_usage_of_records_bytes": sum(v for k, v in usage.items() if ":s:" in k),
            "inputs_read_back": read_ok,
        }
    finally:
        dflow.shutdown()


def turn_back(x: bytes) -> bytes:
    return x[-1:] + x[:-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--redis", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--checkout", type=Path, required=True, help="the checkout whose dflow is measured")
    args = ap.parse_args()
    if not dflow.__file__ or not Path(dflow.__file__).resolve().is_relative_to(args.checkout.resolve()):
        raise SystemExit(
            f"dflow comes from {dflow.__file__}, not from {args.checkout}: put it first on PYTHONPATH"
        )
    print(json.dumps(measure(args.redis, args.name)))


if __name__ == "__main__":
    main()
