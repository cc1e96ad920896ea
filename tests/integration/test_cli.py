"""The dflow command: clear failures, inspect and ls."""

from __future__ import annotations

import subprocess
import sys

import dflow
from dflow import DFlow

from .conftest import SECRET


def dflow_cmd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "dflow.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DFLOW_SECRET": SECRET, **(env or {})})


def test_worker_exits_non_zero_when_redis_is_unreachable() -> None:
    out = dflow_cmd("worker", "tests.integration.flows", "--transport", "redis://127.0.0.1:1/0",
                    "--store", "redis://127.0.0.1:1/0")
    assert out.returncode == 2
    assert "cannot reach the store redis://127.0.0.1:1/0" in out.stderr


def test_worker_exits_non_zero_when_the_broker_is_unreachable(redis_url: str, prefix: str) -> None:
    out = dflow_cmd("worker", "tests.integration.flows", "--transport", "kafka://127.0.0.1:1?topic=x",
                    "--store", f"{redis_url}?prefix={prefix}")
    assert out.returncode == 2
    assert "cannot reach the transport kafka://127.0.0.1:1" in out.stderr


def test_worker_needs_urls_and_a_secret() -> None:
    out = dflow_cmd("worker", "tests.integration.flows", "--store", "redis://127.0.0.1:6379/0")
    assert out.returncode == 2 and "--transport is required" in out.stderr
    out = dflow_cmd("worker", "tests.integration.flows", "--store", "redis://127.0.0.1:6379/0",
                    "--transport", "redis://127.0.0.1:6379/0", env={"DFLOW_SECRET": ""})
    assert out.returncode == 2 and "DFLOW_SECRET" in out.stderr


def test_inspect_and_ls(redis_url: str, prefix: str) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    transport_url = f"{redis_url}?stream={prefix}:steps"
    dflow.configure(transport_url, store_url, secret=SECRET)
    try:
        run = DFlow.direct_run(3, lambda x: DFlow.just(x).map(lambda v: v * 7).id("times-seven"))
        assert run.result(10) == 21
    finally:
        dflow.shutdown()
    out = dflow_cmd("inspect", run.trace_id, "--store", store_url)
    assert out.returncode == 0, out.stderr
    assert f"run {run.trace_id}  done" in out.stdout and "times-seven" in out.stdout and "3 → 21" in out.stdout
    missing = dflow_cmd("inspect", "no-such-run", "--store", store_url)
    assert missing.returncode == 1 and "not found" in missing.stdout
    listing = dflow_cmd("ls", "--store", store_url)
    assert listing.returncode == 0 and run.trace_id in listing.stdout and "done" in listing.stdout


def test_urls_in_errors_never_show_their_password() -> None:
    out = dflow_cmd("worker", "tests.integration.flows", "--transport", "redis://ann:hunter2@127.0.0.1:1/0",
                    "--store", "redis://ann:hunter2@127.0.0.1:1/0?ssl_password=alsosecret")
    assert out.returncode == 2
    assert "hunter2" not in out.stderr + out.stdout and "alsosecret" not in out.stderr + out.stdout
    assert "redis://ann:***@127.0.0.1:1/0" in out.stderr


def test_inspect_shows_what_it_cannot_decode_and_escapes_what_it_prints(redis_url: str, prefix: str) -> None:
    import msgpack
    import redis

    store_url = f"{redis_url}?prefix={prefix}"
    r = redis.Redis.from_url(redis_url)
    trace = "forged-run"
    evil_result = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["nowhere:Nothing", {}])))
    r.hset(f"{prefix}:r:{trace}", mapping={"status": "done", "seq": 1, "created": 0, "updated": 0,
                                           "result": evil_result})
    r.rpush(f"{prefix}:s:{trace}", msgpack.packb(["evil\x1b[31m", 1, "done", 0, "w\x1b]0;x\x07", 0.0, 0.0, None,
                                                  evil_result, None, None]))
    r.zadd(f"{prefix}:runs", {trace: 0})
    r.zadd(f"{prefix}:ix", {trace: 4 * 10**13})  # listed as a done run (lua/listed.lua) created at 0
    out = dflow_cmd("inspect", trace, "--store", store_url)
    assert out.returncode == 0, out.stderr
    assert "undecodable" in out.stdout and "\x1b" not in out.stdout and "\x07" not in out.stdout
    listing = dflow_cmd("ls", "--store", store_url)
    assert listing.returncode == 0 and trace in listing.stdout
    bad = dflow_cmd("inspect", "run\x1b[2J", "--store", store_url)
    assert bad.returncode == 2 and "may only contain" in bad.stderr and "\x1b" not in bad.stderr
    r.close()
