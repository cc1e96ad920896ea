"""Run listings on Redis beyond the contract: what the scripts write for them (one ZADD per
listing a root run is in when its status changes, nothing for a step that keeps it), an id
used again before DUE saw its old run expire, pages through runs of one millisecond, and
``dflow ls`` with its filters."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

import dflow
from dflow import DFlow, RunStatus
from dflow.adapters.redis import RedisStore
from dflow.store import Finish, Fork, NewRun, Parent, Wait
from dflow.testing.cases import KEYS, advance, frames_of, new_run
from dflow.wire.values import JOIN, NONE, Message, encode

from .conftest import SECRET


@contextmanager
def listing_writes(redis_url: str, prefix: str) -> Iterator[Callable[[], list[str]]]:
    """Watch the server (MONITOR) for the commands that write the listings under ``prefix``;
    the function given takes those seen since it was last called."""
    r = redis.Redis.from_url(redis_url)
    seen: list[str] = []
    stop = f"{prefix}:monitor-stop"
    keys = f"{prefix}:ix"
    ready = threading.Event()

    def watch() -> None:
        with r.monitor() as m:
            r2 = redis.Redis.from_url(redis_url)
            r2.echo(f"{prefix}:monitor-ready")
            r2.close()
            for c in m.listen():
                words = c["command"].split(" ")
                if len(words) > 1 and words[1] == f"{prefix}:monitor-ready":
                    ready.set()
                elif len(words) > 1 and words[1] == stop:
                    return
                elif (
                    len(words) > 1
                    and words[0] in ("ZADD", "ZREM", "HSET", "HDEL")
                    and words[1].startswith(keys)
                ):
                    seen.append(f"{words[0]} {words[1].removeprefix(prefix + ':')}")

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(5), "MONITOR did not start"
    marks: list[int] = [0]

    def since() -> list[str]:
        time.sleep(0.05)  # the monitor's reader is behind the server by a moment
        got = seen[marks[0] :]
        marks[0] = len(seen)
        return got

    try:
        yield since
    finally:
        r.echo(stop)
        thread.join(5)
        r.close()


def test_a_status_change_is_one_zadd_per_listing_and_a_step_that_keeps_it_writes_none(
    redis_url: str, prefix: str
) -> None:
    async def body(since: Callable[[], list[str]]) -> None:
        store = RedisStore(redis_url, prefix=prefix)
        run = new_run(pipeline="listing-writes")
        await store.create_run(run)
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"]
        assert run.message is not None
        claim = await store.claim(run.message, "w", 30)
        assert claim is not None
        (nxt,) = (await store.commit(claim, [], {"k": encode(1)}, advance(claim, 1))).publish
        assert since() == [], "running -> running: nothing"
        claim = await store.claim(nxt, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {}, Wait("listing-go"))
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"]
        (resumed,) = await store.resume(run.trace_id, "listing-go", NONE)
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"]
        claim = await store.claim(resumed, "w", 30)
        assert claim is not None
        step = advance(claim, 2, at=time.time() + 0.05)
        await store.commit(claim, [], {}, step)
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"], "-> sleeping"
        await asyncio.sleep(0.1)
        claim = await store.claim(step.message, "w", 30)
        assert claim is not None
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"], "a claimed timer: -> running"
        join = Message(run.trace_id, claim.message.seq + 1, KEYS[2], 0, JOIN)
        children = [
            NewRun(
                f"{run.trace_id}/{join.seq}-{i}",
                frames_of("b"),
                encode(i),
                Message(f"{run.trace_id}/{join.seq}-{i}", 0, "branch"),
                parent=Parent(run.trace_id, join.seq, i),
            )
            for i in range(3)
        ]
        await store.commit(claim, [], {}, Fork("zip", children, join))
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"], "-> waiting; the branches are not listed"
        for child in children:
            assert child.message is not None
            c = await store.claim(child.message, "w", 30)
            assert c is not None
            await store.commit(c, [], {}, Finish(encode(1)))
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"], "the join sent the run on"
        claim = await store.claim(join, "w", 30)
        assert claim is not None
        await store.commit(claim, [], {}, Finish(encode(3)))
        assert since() == ["ZADD ix", "ZADD ixp:listing-writes"]
        plain = new_run()
        await store.create_run(plain)
        assert since() == ["ZADD ix"]
        await store.cancel(plain.trace_id, "stop")
        assert since() == ["ZADD ix"], "a run without a pipeline is in one listing"
        await store.close()

    with listing_writes(redis_url, prefix) as since:
        asyncio.run(body(since))


def test_an_id_used_again_before_due_saw_its_run_expire_leaves_no_stale_entry(
    redis_url: str, prefix: str
) -> None:
    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix, ttl=0.2)
        trace = uuid.uuid4().hex
        await store.create_run(NewRun(trace, None, encode(1), None, result=encode(1), pipeline="listing-old"))
        assert [r.trace_id for r in (await store.page_runs(pipeline="listing-old")).runs] == [trace]
        await asyncio.sleep(0.4)  # its keys expire; no DUE runs meanwhile
        assert await store.get_run(trace) is None
        await store.create_run(new_run(trace, pipeline="listing-new"))
        for due in (False, True):  # and DUE, when it comes, takes the old run out, the new one stays
            assert (await store.page_runs(pipeline="listing-old")).runs == []
            assert sum((await store.count_runs(pipeline="listing-old")).values()) == (0 if due else 1), (
                "counted until DUE takes it out"
            )
            (listed,) = (await store.page_runs()).runs
            assert (listed.trace_id, listed.pipeline, listed.status) == (
                trace,
                "listing-new",
                RunStatus.RUNNING,
            )
            assert (await store.count_runs(pipeline="listing-new"))[RunStatus.RUNNING] == 1
            assert sum((await store.count_runs()).values()) == 1
            if not due:
                await store.due(time.time())
        await store.close()

    asyncio.run(body())


@pytest.mark.parametrize("oldest_first", [False, True], ids=["newest-first", "oldest-first"])
def test_pages_through_many_runs_of_one_millisecond(redis_url: str, prefix: str, oldest_first: bool) -> None:
    async def body() -> None:
        store = RedisStore(redis_url, prefix=prefix, max_connections=64)
        made = [new_run() for _ in range(300)]
        await asyncio.gather(*(store.create_run(r) for r in made))
        infos = [i for i in [await store.get_run(r.trace_id) for r in made] if i is not None]
        per_ms = Counter(int(i.created * 1000) for i in infos)
        assert max(per_ms.values()) >= 5, "the runs share milliseconds (else this tests nothing)"
        expected = [
            i.trace_id
            for i in sorted(
                infos, key=lambda i: (int(i.created * 1000), i.trace_id), reverse=not oldest_first
            )
        ]
        got: list[str] = []
        cursor = None
        while True:
            page = await store.page_runs(
                7, status=RunStatus.RUNNING, cursor=cursor, oldest_first=oldest_first
            )
            got += [r.trace_id for r in page.runs]
            if page.cursor is None:
                break
            cursor = page.cursor
            if len(got) in (70, 140):  # the run the cursor names moves on: read on from its millisecond
                await store.cancel(got[-1], "moved on")
        assert got == expected
        await store.close()

    asyncio.run(body())


def _dflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DFLOW_SECRET": SECRET},
        check=False,
    )


def test_dflow_ls_filters_by_status_and_pipeline_and_shows_the_pipeline(redis_url: str, prefix: str) -> None:
    store_url = f"{redis_url}?prefix={prefix}"
    name = f"listing-cli-{uuid.uuid4().hex[:6]}"
    dflow.configure(f"{redis_url}?stream={prefix}:steps", store_url, secret=SECRET)
    try:
        doubled = DFlow.from_call(f"{name}-go").map(lambda x: x * 2).id(f"{name}-double").init(name)
        waits = (
            DFlow.from_call(f"{name}-ask")
            .flat_map(lambda x: DFlow.from_call(f"{name}-answer").map(lambda a: [x, a]).id(f"{name}-both"))
            .id(f"{name}-wait")
            .init(f"{name}-waits")
        )
        done = [doubled.call(i) for i in range(3)]
        assert [r.result(10) for r in done] == [0, 2, 4]
        fanned = DFlow.direct_run(
            2,
            lambda x: DFlow.zip(
                [
                    DFlow.just(x).map(lambda v: v + 1).id("listing-inc"),
                    DFlow.just(x).map(lambda v: v * 3).id("listing-tri"),
                ]
            ),
        )
        assert fanned.result(10) == [3, 6]
        waiting = waits.call("q")
        deadline = time.monotonic() + 10
        while waiting.status() is not RunStatus.WAITING:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        dflow.shutdown()

    def lines(*args: str) -> list[str]:
        out = _dflow("ls", "--store", store_url, *args)
        assert out.returncode == 0, out.stderr
        header, *rows = out.stdout.splitlines()
        assert header.split()[:3] == ["TRACE", "ID", "STATUS"] and "PIPELINE" in header
        return rows

    every = lines()
    assert len(every) == 5, "the zip's branches are not listed"
    assert [row.split()[0] for row in every[:1]] == [waiting.trace_id]
    assert {row.split()[0] for row in every} == {
        waiting.trace_id,
        fanned.trace_id,
        *(r.trace_id for r in done),
    }
    (row,) = lines("--status", "waiting")
    assert row.split()[:3] == [waiting.trace_id, "waiting", f"{name}-waits"]
    assert {r.split()[0] for r in lines("--pipeline", name)} == {r.trace_id for r in done}
    assert {r.split()[1] for r in lines("--pipeline", name, "--status", "done")} == {"done"}
    assert lines("--pipeline", name, "--status", "failed") == []
    (direct,) = [r for r in every if r.startswith(fanned.trace_id)]
    assert direct.split()[1:3] == ["done", "-"], "a run no pipeline started"
    assert len(lines("--limit", "2")) == 2
    ids = [row.split()[0] for row in every]

    def ids_of(*args: str) -> list[str]:
        return [row.split()[0] for row in lines(*args)]

    assert ids_of("--oldest") == ids[::-1] == ids_of("--sort", "oldest")
    assert ids_of("--oldest", "--limit", "2") == ids[::-1][:2]
    assert ids_of("--sort", "newest") == ids
    assert ids_of("--pipeline", name, "--oldest") == [r.trace_id for r in done]
    bad = _dflow("ls", "--store", store_url, "--sort", "sideways")
    assert bad.returncode == 2 and "invalid choice: 'sideways'" in bad.stderr
    assert "'newest'" in bad.stderr and "'oldest'" in bad.stderr
    bad = _dflow("ls", "--store", store_url, "--status", "finished")
    assert bad.returncode == 2 and "invalid choice: 'finished'" in bad.stderr
    bad = _dflow("ls", "--store", store_url, "--limit", "0")
    assert bad.returncode == 2 and "1 or more" in bad.stderr
