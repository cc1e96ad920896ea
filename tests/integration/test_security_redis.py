"""Attacks on a Redis deployment by someone who can write to the stream or the store but
does not hold DFLOW_SECRET: each one fails cleanly, and changes nothing it should not; and
what a web page in the user's browser can make an open ``dflow serve`` on loopback do (a
cross-site form post, DNS rebinding), next to what its legitimate local client still can."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import redis

import dflow
from dflow import ContextStack, DFlow
from dflow.wire.values import CONTINUE, Message
from tests.support.workers import Serve

from .conftest import SECRET

called: dict[str, int] = {}


def waiting_flow(ctx: ContextStack, who: str) -> DFlow[Any]:
    """A flow built at run time, different for each run (it captures ``who``)."""
    return DFlow.from_call("go").map(lambda v: f"{who} ran with {v}").id("after")


# a pipeline anyone could try to point a run at
admin_pipeline = DFlow.from_call("admin").map(lambda v: "admin step ran").id("grant").init("admin")


@pytest.fixture
def local_redis(redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    store = f"{redis_url}?prefix={prefix}"
    dflow.configure(
        f"{redis_url}?stream={prefix}:steps&dead_letters_max=5",
        store,
        secret=SECRET,
        concurrency=8,
        poll_interval=0.02,
    )
    r = redis.Redis.from_url(redis_url)
    yield r
    dflow.shutdown()
    r.close()


def _wait_waiting(run: dflow.Run) -> None:
    deadline = time.monotonic() + 10
    while run.status() is not dflow.RunStatus.WAITING:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_run_cannot_be_pointed_at_another_runs_code(local_redis: redis.Redis, prefix: str) -> None:
    r = local_redis
    a = DFlow.direct_run("alice", waiting_flow)
    b = DFlow.direct_run("bob", waiting_flow)
    _wait_waiting(a)
    _wait_waiting(b)
    r.hset(f"{prefix}:r:{a.trace_id}", "frames", r.hget(f"{prefix}:r:{b.trace_id}", "frames"))
    DFlow.call("go", 1, a.trace_id)
    with pytest.raises(dflow.RunFailedError, match="PayloadRejectedError.*frames record of run"):
        a.result(10)
    DFlow.call("go", 2, b.trace_id)
    assert b.result(10) == "bob ran with 2", "the run whose frames were copied is untouched"


def test_an_unsigned_frames_record_pointing_at_a_pipeline_is_refused(
    local_redis: redis.Redis, prefix: str
) -> None:
    r = local_redis
    a = DFlow.direct_run("alice", waiting_flow)
    _wait_waiting(a)
    forged = msgpack.packb([["p:admin>grant", 1, "", False]], use_bin_type=True)
    r.hset(f"{prefix}:r:{a.trace_id}", "frames", forged)
    DFlow.call("go", 1, a.trace_id)
    with pytest.raises(dflow.RunFailedError, match="PayloadRejectedError.*frames record"):
        a.result(10)


def test_forged_continue_on_the_stream_does_not_skip_a_step(local_redis: redis.Redis, prefix: str) -> None:
    r = local_redis
    run = DFlow.direct_run(3, lambda x: DFlow.delay(x, 0.6).map(lambda v: v * 2).id("double"))
    deadline = time.monotonic() + 5
    while run.status() is not dflow.RunStatus.SLEEPING:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    info = run.info()
    early = Message(run.trace_id, info.seq, "delay>double", 0, CONTINUE)
    r.xadd(f"{prefix}:steps", {b"m": early.encode()})
    t0 = time.monotonic()
    assert run.result(10) == 6
    assert time.monotonic() - t0 > 0.3, "the delay was not cut short"
    reasons = [f[b"reason"].decode() for _, f in r.xrange(f"{prefix}:steps:dead")]
    assert any("before its due time" in why for why in reasons)


def test_garbage_in_the_store_indexes_does_not_stall_timers(local_redis: redis.Redis, prefix: str) -> None:
    r = local_redis
    r.zadd(f"{prefix}:outbox", {b"\xc1 not msgpack": 0, msgpack.packb({"a": 1}): 0})
    r.zadd(f"{prefix}:leases", {"no-such-run": 0})
    r.hset(f"{prefix}:r:lease-victim", mapping={"lease_until": 0, "lease_msg": b"\xc1", "attempt": 0})
    r.zadd(f"{prefix}:leases", {"lease-victim": 0})
    run = DFlow.direct_run(1, lambda x: DFlow.delay(x, 0.2).map(lambda v: v + 1).id("inc"))
    assert run.result(10) == 2
    assert r.zcard(f"{prefix}:outbox") == 0, "the unreadable entries were dropped"


def test_the_dead_letter_stream_is_bounded(local_redis: redis.Redis, prefix: str) -> None:
    r = local_redis
    for i in range(30):
        r.xadd(f"{prefix}:steps", {b"m": f"garbage {i}".encode()})
    deadline = time.monotonic() + 10
    while r.xlen(f"{prefix}:steps") or r.xinfo_groups(f"{prefix}:steps")[0]["pending"]:
        assert time.monotonic() < deadline, "every message was handled"
        time.sleep(0.05)
    dead = [f[b"m"] for _, f in r.xrange(f"{prefix}:steps:dead")]
    assert len(dead) == 5 and all(m.startswith(b"garbage ") for m in dead), "only the newest few are kept"


# -- what a web page in the user's browser can make an open dflow serve do ----------------


@pytest.fixture(scope="module")
def open_serve(redis_url: str, module_prefix: str) -> Iterator[str]:
    """``dflow serve`` of ``apps.serve_app`` on 127.0.0.1 without DFLOW_SERVER_TOKEN (an open server,
    as the README runs it locally); its URL. No worker: runs are only created. One for the
    module: what its tests send either is refused or starts a run of its own."""
    prefix = module_prefix
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_SERVER_TOKEN": "",
        "DFLOW_SERVER_SECRET": "server-secret-of-the-review-redis-tests-0123456789",
    }
    serve = Serve(
        "tests.integration.apps.serve_app",
        f"{redis_url}?stream={prefix}:steps",
        f"{redis_url}?prefix={prefix}",
        env,
        "--host",
        "127.0.0.1",
        grace=1,
    )
    try:
        yield serve.url
    finally:
        serve.stop()
        serve.log.unlink(missing_ok=True)


def test_an_open_dflow_serve_starts_runs_for_a_same_origin_json_client(open_serve: str) -> None:
    """What the two tests below refuse must stay possible for the legitimate local client."""
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post("/runs", json={"pipeline": "rv-serve-echo", "param": 1})
        assert r.status_code == 201, r.text
        assert (
            api.get(
                f"/runs/{r.json()['trace_id']}", headers={"Authorization": f"Bearer {r.json()['token']}"}
            ).status_code
            == 200
        )


def test_an_open_dflow_serve_refuses_a_cross_site_form_post(open_serve: str) -> None:
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post(
            "/runs",
            content=b'{"pipeline": "rv-serve-echo", "param": "drive-by"}',
            headers={
                "Content-Type": "text/plain;charset=UTF-8",
                "Origin": "http://evil.example",
                "Sec-Fetch-Site": "cross-site",
                "Sec-Fetch-Mode": "no-cors",
            },
        )
        assert r.status_code in (400, 403, 415), (r.status_code, r.text[:200])


def test_an_open_dflow_serve_refuses_foreign_host_names(open_serve: str) -> None:
    with httpx.Client(base_url=open_serve, timeout=20) as api:
        r = api.post(
            "/runs",
            json={"pipeline": "rv-serve-echo", "param": "rebound"},
            headers={"Host": "rebind.evil.example"},
        )
        assert r.status_code in (400, 403, 421), (r.status_code, r.text[:200])
