"""The dflow command: clear failures (a short admin token refused without being shown), inspect
and ls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import dflow
from dflow import DFlow, InitParam

from .conftest import SECRET


def dflow_cmd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "dflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DFLOW_SECRET": SECRET, **(env or {})},
    )


def test_worker_exits_non_zero_when_redis_is_unreachable() -> None:
    out = dflow_cmd(
        "worker",
        "tests.integration.apps.flows",
        "--transport",
        "redis://127.0.0.1:1/0",
        "--store",
        "redis://127.0.0.1:1/0",
    )
    assert out.returncode == 2
    assert "cannot reach the store redis://127.0.0.1:1/0" in out.stderr


def test_worker_exits_non_zero_when_the_broker_is_unreachable(redis_url: str, prefix: str) -> None:
    out = dflow_cmd(
        "worker",
        "tests.integration.apps.flows",
        "--transport",
        "kafka://127.0.0.1:1?topic=x",
        "--store",
        f"{redis_url}?prefix={prefix}",
    )
    assert out.returncode == 2
    assert "cannot reach the transport kafka://127.0.0.1:1" in out.stderr


def test_worker_needs_urls_and_a_secret() -> None:
    out = dflow_cmd("worker", "tests.integration.apps.flows", "--store", "redis://127.0.0.1:6379/0")
    assert out.returncode == 2 and "--transport is required" in out.stderr
    out = dflow_cmd(
        "worker",
        "tests.integration.apps.flows",
        "--store",
        "redis://127.0.0.1:6379/0",
        "--transport",
        "redis://127.0.0.1:6379/0",
        env={"DFLOW_SECRET": ""},
    )
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
    assert (
        f"run {run.trace_id}  done" in out.stdout and "times-seven" in out.stdout and "3 → 21" in out.stdout
    )
    missing = dflow_cmd("inspect", "no-such-run", "--store", store_url)
    assert missing.returncode == 1 and "not found" in missing.stdout
    listing = dflow_cmd("ls", "--store", store_url)
    assert listing.returncode == 0 and run.trace_id in listing.stdout and "done" in listing.stdout


def test_urls_in_errors_never_show_their_password() -> None:
    out = dflow_cmd(
        "worker",
        "tests.integration.apps.flows",
        "--transport",
        "redis://ann:hunter2@127.0.0.1:1/0",
        "--store",
        "redis://ann:hunter2@127.0.0.1:1/0?ssl_password=alsosecret",
    )
    assert out.returncode == 2
    assert "hunter2" not in out.stderr + out.stdout and "alsosecret" not in out.stderr + out.stdout
    assert "redis://ann:***@127.0.0.1:1/0" in out.stderr


def test_inspect_shows_what_it_cannot_decode_and_escapes_what_it_prints(redis_url: str, prefix: str) -> None:
    import msgpack
    import redis

    store_url = f"{redis_url}?prefix={prefix}"
    r = redis.Redis.from_url(redis_url)
    trace = "forged-run"
    evil_result = msgpack.packb(msgpack.ExtType(1, msgpack.packb(["nowhere:Nothing", {"x\x1b[2J": 1}])))
    garbage = msgpack.packb(msgpack.ExtType(7, b"?"))  # no value of dflow's
    r.hset(
        f"{prefix}:r:{trace}",
        mapping={"status": "done", "seq": 1, "created": 0, "updated": 0, "result": garbage},
    )
    r.rpush(
        f"{prefix}:s:{trace}",
        msgpack.packb(
            ["evil\x1b[31m", 1, "done", 0, "w\x1b]0;x\x07", 0.0, 0.0, None, evil_result, None, None]
        ),
    )
    r.zadd(f"{prefix}:runs", {trace: 0})
    r.zadd(f"{prefix}:ix", {trace: 4 * 10**13})  # listed as a done run (lua/listed.lua) created at 0
    out = dflow_cmd("inspect", trace, "--store", store_url)
    assert out.returncode == 0, out.stderr
    assert "undecodable" in out.stdout and "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "Nothing({'x\\x1b[2J': 1})" in out.stdout  # a model this process lacks: its fields
    listing = dflow_cmd("ls", "--store", store_url)
    assert listing.returncode == 0 and trace in listing.stdout
    bad = dflow_cmd("inspect", "run\x1b[2J", "--store", store_url)
    assert bad.returncode == 2 and "may only contain" in bad.stderr and "\x1b" not in bad.stderr
    r.close()


def test_dflow_serve_refuses_a_short_admin_token_without_showing_it(redis_url: str) -> None:
    short = "shortadmintoken-QWERTY"
    env = {
        **os.environ,
        "DFLOW_SECRET": SECRET,
        "DFLOW_SERVER_TOKEN": short,
        "DFLOW_SERVER_SECRET": "server-secret-of-the-review-redis-tests-0123456789",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflow.cli",
            "serve",
            "json",
            "--store",
            redis_url,
            "--transport",
            redis_url,
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "at least 32" in out.stderr and "DFLOW_SERVER_TOKEN" in out.stderr
    assert short not in out.stderr and short not in out.stdout
    assert "listening" not in out.stderr


APPROVAL = (
    DFlow.just(0)
    .flat_map(lambda _: DFlow.from_call("cli-approve"))
    .id("wait-approval")
    .map(lambda answer: {"approved": answer})
    .id("approved")
    .init("cli-approval")
)


def _wait_status(trace_id: str, status: dflow.RunStatus) -> None:
    deadline = time.monotonic() + 10
    while dflow.Run(trace_id).status() is not status:
        assert time.monotonic() < deadline, f"run {trace_id} never got {status}"
        time.sleep(0.02)


def test_ls_and_inspect_print_json_for_scripts(redis_url: str, prefix: str) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        run = DFlow.direct_run(3, lambda x: DFlow.just(x).map(lambda v: v * 7).id("times-seven"))
        assert run.result(10) == 21
    finally:
        dflow.shutdown()
    listing = dflow_cmd("ls", "--store", store_url, "--json")
    assert listing.returncode == 0, listing.stderr
    [row] = [r for r in json.loads(listing.stdout) if r["trace_id"] == run.trace_id]
    assert row["status"] == "done" and row["result"] == 21 and row["finished"] is True
    shown = dflow_cmd("inspect", run.trace_id, "--store", store_url, "--json")
    assert shown.returncode == 0, shown.stderr
    tree = json.loads(shown.stdout)
    assert tree["trace_id"] == run.trace_id and tree["result"] == 21
    step = next(s for s in tree["steps"] if s["key"].startswith("times-seven"))
    assert (step["input"], step["output"], step["status"]) == (3, 21, "done")
    assert [s["seq"] for s in tree["steps"]] == sorted(s["seq"] for s in tree["steps"])
    missing = dflow_cmd("inspect", "no-such-run", "--store", store_url, "--json")
    assert missing.returncode == 1 and json.loads(missing.stdout) is None


def test_dflow_call_answers_a_waiting_run_keeps_an_early_call_and_cancel_says_when_a_run_has_ended(
    redis_url: str, prefix: str
) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    transport_url = f"{redis_url}?stream={prefix}:steps"
    urls = ("--store", store_url, "--transport", transport_url)
    dflow.configure(transport_url, store_url, secret=SECRET)
    try:
        run = APPROVAL.call()
        _wait_status(run.trace_id, dflow.RunStatus.WAITING)
        bad = dflow_cmd("call", run.trace_id, "cli-approve", "{not json", *urls)
        assert bad.returncode == 2 and "PAYLOAD is not JSON" in bad.stderr, bad.stderr
        wrong = dflow_cmd("call", run.trace_id, "another-call", "1", "--if-waiting", *urls)
        assert wrong.returncode == 1 and "another-call" in wrong.stderr, wrong.stderr
        early = dflow_cmd("call", run.trace_id, "another-call", "1", *urls)
        assert early.returncode == 0, early.stderr
        assert "kept another-call until the run waits for it" in early.stdout
        out = dflow_cmd("call", run.trace_id, "cli-approve", '{"by": "ann"}', *urls)
        assert out.returncode == 0, out.stderr
        assert run.result(10) == {"approved": {"by": "ann"}}
    finally:
        dflow.shutdown()
    again = dflow_cmd("cancel", run.trace_id, "--store", store_url)
    assert again.returncode == 1 and f"run {run.trace_id} has already ended done" in again.stderr


def test_each_command_on_an_unreachable_store_says_so_in_one_line() -> None:
    down = ("--store", "redis://ann:hunter2@127.0.0.1:1/0")
    trace = "a" * 32
    for args in (
        ("ls",),
        ("inspect", trace),
        ("cancel", trace),
        ("rerun", trace, "--from", "1"),
        ("call", trace, "approve", "true"),
        ("circuits",),
    ):
        out = dflow_cmd(*args, *down)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, (args, out.stderr)
        assert "redis://ann:***@127.0.0.1:1/0" in lines[0] and "hunter2" not in out.stderr, (args, lines)


def test_ls_lists_the_runs_started_in_a_window_and_refuses_a_time_it_cannot_read(
    redis_url: str, prefix: str
) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        older = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: v + 1).id("plus-one"))
        assert older.result(10) == 2
        while time.time() < older.info().created + 0.01:  # the newer run in a later millisecond
            time.sleep(0.001)
        newer = DFlow.direct_run(2, lambda x: DFlow.just(x).map(lambda v: v + 1).id("plus-one"))
        assert newer.result(10) == 3
        split = datetime.fromtimestamp(newer.info().created, timezone.utc).isoformat()
    finally:
        dflow.shutdown()
    after = dflow_cmd("ls", "--store", store_url, "--json", "--after", split)
    assert after.returncode == 0, after.stderr
    assert [r["trace_id"] for r in json.loads(after.stdout)] == [newer.trace_id]
    before = dflow_cmd("ls", "--store", store_url, "--json", "--before", split)
    assert before.returncode == 0, before.stderr
    assert [r["trace_id"] for r in json.loads(before.stdout)] == [older.trace_id]
    bad = dflow_cmd("ls", "--store", store_url, "--after", "last tuesday")
    assert bad.returncode == 2 and "--after 'last tuesday' is not a time" in bad.stderr, bad.stderr
    empty = dflow_cmd("ls", "--store", store_url, "--after", split, "--before", split)
    assert empty.returncode == 2 and len(empty.stderr.splitlines()) == 1, empty.stderr
    assert "the start of the window must come before its end" in empty.stderr


def test_ls_finds_the_runs_whose_id_starts_so(redis_url: str, prefix: str) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        for i, name in enumerate(["order-7", "order-12", "invoice-7"]):
            run = DFlow.direct_run(
                InitParam(i, name), lambda x: DFlow.just(x).map(lambda v: v + 1).id("plus-one")
            )
            assert run.result(10) == i + 1
    finally:
        dflow.shutdown()
    orders = dflow_cmd("ls", "--store", store_url, "--json", "--id", "order-")
    assert orders.returncode == 0, orders.stderr
    assert [r["trace_id"] for r in json.loads(orders.stdout)] == ["order-12", "order-7"]
    text = dflow_cmd("ls", "--store", store_url, "--id", "invoice")
    assert text.returncode == 0 and "invoice-7" in text.stdout and "order-" not in text.stdout
    none = dflow_cmd("ls", "--store", store_url, "--json", "--id", "order-", "--status", "failed")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    bad = dflow_cmd("ls", "--store", store_url, "--id", "order 7")
    assert bad.returncode == 2 and "'order 7' does not start a run id" in bad.stderr, bad.stderr


def _keyed(order: dict[str, str]) -> str:
    dflow.set_business_key(order["key"])
    return order["key"]


def test_ls_finds_the_runs_a_step_gave_a_business_key_newest_first_or_as_asked(
    redis_url: str, prefix: str
) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        runs = []
        for key in ("order-1042", "order-7", "order-1042"):
            run = DFlow.direct_run({"key": key}, lambda x: DFlow.just(x).map(_keyed).id("keyed"))
            assert run.result(10) == key
            runs.append(run)
            while time.time() < run.info().created + 0.01:  # the next run in a later millisecond
                time.sleep(0.001)
    finally:
        dflow.shutdown()
    found = dflow_cmd("ls", "--store", store_url, "--json", "--key", "order-1042")
    assert found.returncode == 0, found.stderr
    listed = json.loads(found.stdout)
    assert [r["trace_id"] for r in listed] == [runs[2].trace_id, runs[0].trace_id]
    assert {r["business_key"] for r in listed} == {"order-1042"}
    text = dflow_cmd("ls", "--store", store_url, "--key", "order-7")
    assert text.returncode == 0 and runs[1].trace_id in text.stdout and runs[0].trace_id not in text.stdout
    shown = dflow_cmd("inspect", runs[1].trace_id, "--store", store_url)
    assert "business key order-7" in shown.stdout, shown.stdout + shown.stderr
    none = dflow_cmd("ls", "--store", store_url, "--json", "--key", "order-1042", "--status", "failed")
    assert none.returncode == 0 and json.loads(none.stdout) == []
    first = dflow_cmd("ls", "--store", store_url, "--json", "--key", "order-1042", "--oldest", "--limit", "1")
    assert [r["trace_id"] for r in json.loads(first.stdout)] == [runs[0].trace_id], first.stderr
    start = runs[0].trace_id[:12]  # (past a newer run with the key whose id does not start so)
    by_id = dflow_cmd(
        "ls", "--store", store_url, "--json", "--key", "order-1042", "--id", start, "--limit", "1"
    )
    assert [r["trace_id"] for r in json.loads(by_id.stdout)] == [runs[0].trace_id], by_id.stderr
    bad = dflow_cmd("ls", "--store", store_url, "--key", "x" * 201)
    assert bad.returncode == 2 and "1 to 200 characters" in bad.stderr, bad.stderr
