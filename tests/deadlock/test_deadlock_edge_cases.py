"""Hostile tests of deadlock detection: a run that is not in a real cycle must never be
broken. Waits answered just as the detector looks (a peer answered from an ``on_init``,
ping-pong declared both ways), declarations that name no run, an ended one or the run
itself, a declaration never followed by a wait, zip branches that sleep or run, a
declaration made before a zip (its branches must not inherit it), 10,000 declared
waits, damaged or hostile declarations in Redis, two runtimes in one process and the
lease holder stopping, declared waits left behind, and the idle cost on Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client as prom
import pytest

import dflow
from dflow import (
    ContextStack,
    DeadlockError,
    DFlow,
    InvalidTraceIdError,
    NotWaitingError,
    Run,
    RunNotFoundError,
    RunStatus,
)
from dflow.context import WAIT_FOR_KEY, RunInfo
from dflow.deadlock import MAX_RUNS, DeadlockDetector, declare
from dflow.memory.state import MemoryStateBackend
from dflow.metrics import Metrics
from dflow.shared_state import backend_for
from dflow.testing import FakeClock

INTERVAL = 0.05
KEY = os.urandom(32)
REDIS_URL = os.environ.get("DFLOW_TEST_REDIS_HOSTILE", "redis://127.0.0.1:6379/9")


@pytest.fixture
def detecting() -> Iterator[dflow.Runtime]:
    runtime = dflow.global_init_for_test(deadlock_interval=INTERVAL)
    yield runtime
    dflow.shutdown()


def _ids(*names: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{n}-{tag}" for n in names]


def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _edges(runtime: dflow.Runtime) -> list[Any]:
    return asyncio.run_coroutine_threadsafe(backend_for(runtime.store).waits_list(), runtime._loop).result(5)  # type: ignore[arg-type]


def _errors(run: Run[Any]) -> list[dict[str, Any]]:
    return [s.error for s in run.context().steps if s.error]


def _passes(seconds: float) -> None:
    """Let the detector look several times."""
    time.sleep(seconds)


def declare_peer(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)
    ctx.put("peer", peer)
    return peer


async def send_when_waiting(ctx: ContextStack, call: str, payload: Any) -> None:
    """Answer the peer's wait for ``call`` once it waits (it may not wait yet)."""
    for _ in range(2000):
        try:
            await DFlow.acall(call, payload, ctx.get("peer"))
            return
        except (NotWaitingError, RunNotFoundError):
            await asyncio.sleep(0.002)
    raise AssertionError("the peer never waited")


# -- a wait answered from an on_init ------------------------------------------------


async def slow_reply(ctx: ContextStack) -> None:
    await asyncio.sleep(INTERVAL * 10)  # the detector looks several times meanwhile
    await DFlow.acall("reply", "hello", ctx.get("peer"))


async def send_ack(ctx: ContextStack, reply: str) -> str:
    await DFlow.acall("ack", "thanks", ctx.get("peer"))
    return reply


ASKER = (
    DFlow.from_call("s")
    .map(declare_peer)
    .id("dlh-ask-decl")
    .flat_map(lambda _: DFlow.from_call("reply"))
    .id("dlh-ask-wait")
    .map(send_ack)
    .id("dlh-ask-ack")
    .init("dlh-asker")
)
REPLIER = (
    DFlow.from_call("s")
    .map(declare_peer)
    .id("dlh-rep-decl")
    .flat_map(lambda _: DFlow.from_call("ack", on_init=slow_reply))
    .id("dlh-rep-wait")
    .init("dlh-replier")
)


def test_a_peer_answered_from_an_on_init_is_not_a_deadlock(detecting: dflow.Runtime) -> None:
    """a waits for b's reply; b, declared to wait for a's ack, sends the reply from its
    wait's on_init (what on_init is for). While that on_init runs, both wait for each
    other as declared, but b is not stuck: breaking a would lose its reply."""
    a_id, b_id = _ids("a", "b")
    a = ASKER.call(b_id, trace_id=a_id)
    _until(lambda: a.status() is RunStatus.WAITING and len(_edges(detecting)) == 1)
    b = REPLIER.call(a_id, trace_id=b_id)
    assert a.result(5) == "hello"
    assert b.result(5) == "thanks"
    assert _errors(a) == [] and _errors(b) == []


# -- ping-pong: waits declared both ways, answered as the detector looks ---------------

ROUNDS = 25


async def send_round(ctx: ContextStack) -> None:
    if ctx.get("declare_in") == "on_init":
        ctx.wait_for(ctx.get("peer"))
    await asyncio.sleep(random.uniform(0, 0.02))  # (the detector looks now and then, at any point)
    await send_when_waiting(ctx, "ping", ctx.get("round"))


def play(ctx: ContextStack, _got: Any) -> DFlow[Any]:
    n = ctx.get("round", 0)
    if n >= ROUNDS:
        return DFlow.just(n)
    ctx.put("round", n + 1)
    if ctx.get("declare_in") == "step":
        ctx.wait_for(ctx.get("peer"))  # (for the wait of the next step)
    return DFlow.from_call("ping", on_init=send_round).flat_map(play).id("dlh-pp-play")


def keep(ctx: ContextStack, how: dict[str, str]) -> int:
    ctx.put("peer", how["peer"])
    ctx.put("declare_in", how["declare_in"])
    return 0


PING_PONG = DFlow.from_call("s").map(keep).id("dlh-pp-keep").flat_map(play).id("dlh-pp-play").init("dlh-pp")


@pytest.mark.parametrize("declare_in", ["step", "on_init"])
def test_ping_pong_declared_both_ways_is_never_broken(detecting: dflow.Runtime, declare_in: str) -> None:
    """Pairs of runs answer each other ROUNDS times, each declaring that its wait is
    answered by the other: at every moment both may wait for each other as declared,
    but one of them is sending. The detector looks every 10 ms and must break none."""
    assert detecting.deadlocks is not None
    detecting.deadlocks.interval = 0.01
    broken: list[Any] = []
    detecting.deadlocks.listeners.append(broken.append)
    backend = backend_for(detecting.store)
    declared = 0
    add = backend.waits_add

    async def counted(*args: Any) -> None:
        nonlocal declared
        declared += 1
        await add(*args)

    setattr(backend, "waits_add", counted)  # noqa: B010 - (counting the waits declared)
    runs = []
    for _ in range(6):
        a_id, b_id = _ids("pa", "pb")
        runs.append(PING_PONG.call({"peer": b_id, "declare_in": declare_in}, trace_id=a_id))
        runs.append(PING_PONG.call({"peer": a_id, "declare_in": declare_in}, trace_id=b_id))
    for r in runs:
        assert r.result(10) == ROUNDS, r.trace_id
    assert broken == []
    assert [e for r in runs for e in _errors(r)] == []
    assert declared == len(runs) * ROUNDS, "every wait was declared"
    _until(lambda: _edges(detecting) == [], timeout=2)
    delattr(backend, "waits_add")


# -- declarations that name no live run -------------------------------------------------

WAITER = (
    DFlow.from_call("s")
    .map(declare_peer)
    .id("dlh-w-decl")
    .flat_map(lambda _: DFlow.from_call("answer"))
    .id("dlh-w-wait")
    .init("dlh-waiter")
)


async def answer_myself(ctx: ContextStack) -> None:
    ctx.wait_for(ctx.trace_id)
    await asyncio.sleep(INTERVAL * 4)
    await DFlow.acall("answer", "from me", ctx.trace_id)


SELF_ANSWERING = (
    DFlow.from_call("s")
    .flat_map(lambda _: DFlow.from_call("answer", on_init=answer_myself))
    .id("dlh-self-wait")
    .init("dlh-self-answering")
)


def test_waits_for_a_missing_or_ended_run_or_oneself(detecting: dflow.Runtime) -> None:
    ghost_id, ended_id, a_id, b_id, c_id, me_id, stuck_id = _ids(
        "ghost", "ended", "a", "b", "c", "me", "stuck"
    )
    DFlow.direct_run(dflow.InitParam(1, trace_id=ended_id), lambda v: DFlow.just(v)).result(5)
    a = WAITER.call(ghost_id, trace_id=a_id)  # a run that does not exist (yet)
    b = WAITER.call(ended_id, trace_id=b_id)  # a run that has ended
    c = WAITER.call(a_id, trace_id=c_id)  # a run waiting for one that can go on
    me = SELF_ANSWERING.call(None, trace_id=me_id)  # waits for itself, and answers itself
    assert me.result(5) == "from me" and _errors(me) == []
    _until(lambda: all(r.status() is RunStatus.WAITING for r in (a, b, c)) and len(_edges(detecting)) == 3)
    _passes(INTERVAL * 6)
    assert [r.status() for r in (a, b, c)] == [RunStatus.WAITING] * 3
    assert [_errors(r) for r in (a, b, c)] == [[], [], []]

    # a run that waits for itself, and nobody else: a deadlock of one
    stuck = WAITER.call(stuck_id, trace_id=stuck_id)
    with pytest.raises(dflow.RunFailedError, match=rf"the runs {stuck_id} -> {stuck_id} wait"):
        stuck.result(5)
    (error,) = _errors(stuck)
    assert error["type"] == "dflow.errors.DeadlockError" and error["cycle"] == [stuck_id]
    for r in (a, b, c):
        r.cancel()
    _until(lambda: _edges(detecting) == [], timeout=2)


def test_a_wait_for_a_run_that_expired(detecting: dflow.Runtime) -> None:
    dflow.shutdown()
    runtime = dflow.global_init_for_test(deadlock_interval=INTERVAL, ttl=0.1)
    gone_id, a_id = _ids("gone", "a")
    DFlow.direct_run(dflow.InitParam(1, trace_id=gone_id), lambda v: DFlow.just(v)).result(5)
    _until(
        lambda: (
            asyncio.run_coroutine_threadsafe(runtime.store.get_run(gone_id), runtime._loop).result(5) is None
        ),
        timeout=3,
    )  # type: ignore[arg-type]
    a = WAITER.call(gone_id, trace_id=a_id)
    _until(lambda: a.status() is RunStatus.WAITING and len(_edges(runtime)) == 1)
    _passes(INTERVAL * 6)
    assert a.status() is RunStatus.WAITING and _errors(a) == []
    a.cancel()


def say_done(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)  # declared, but the run never waits again
    return "done"


def test_a_declaration_never_followed_by_a_wait(detecting: dflow.Runtime) -> None:
    a_id, b_id = _ids("a", "b")
    b = WAITER.call(a_id, trace_id=b_id)  # b waits for a
    _until(lambda: b.status() is RunStatus.WAITING)
    a = DFlow.direct_run(
        dflow.InitParam(b_id, trace_id=a_id),
        lambda v: (
            DFlow.just(v)
            .map(say_done)
            .id("dlh-say")
            .flat_map(lambda _: DFlow.delay("nap", INTERVAL * 4))
            .id("dlh-nap")
        ),
    )
    assert a.result(5) == "nap"
    assert [e.waiter for e in _edges(detecting)] == [b_id], "a declared no edge: it never waited"
    _passes(INTERVAL * 4)
    assert b.status() is RunStatus.WAITING and _errors(b) == []
    b.cancel()


# -- zips ------------------------------------------------------------------------------


def ask_parent(ctx: ContextStack, v: Any) -> Any:
    ctx.wait_for(ctx.trace_id.rsplit("/", 1)[0])
    return v


def caught(error: BaseException) -> Any:
    if isinstance(error, DeadlockError):
        return {"cycle": error.error["cycle"]}
    raise error


async def busy(v: Any) -> Any:
    await asyncio.sleep(INTERVAL * 8)
    return v


@pytest.mark.parametrize("other", ["sleeping", "running"])
def test_a_zip_whose_other_branch_sleeps_or_runs(detecting: dflow.Runtime, other: str) -> None:
    """A branch waits for its parent, which waits at the zip for both branches: while the
    other branch sleeps or runs, the parent may go on; once that branch has ended, the
    two wait for each other for good."""
    second = (
        DFlow.delay("slept", INTERVAL * 8) if other == "sleeping" else DFlow.just(1).map(busy).id("dlh-busy")
    )
    (p_id,) = _ids("p")
    t0 = time.monotonic()
    p = DFlow.direct_run(
        dflow.InitParam(0, trace_id=p_id),
        lambda _: DFlow.zip(
            DFlow.just(1)
            .map(ask_parent)
            .id("dlh-z-ask")
            .flat_map(lambda _: DFlow.from_call("parent-answer"))
            .id("dlh-z-wait")
            .on_error_return(caught),
            second,
        ).id(f"dlh-zip-{other}"),
    )
    result = p.result(5)
    assert time.monotonic() - t0 >= INTERVAL * 8, "not broken while the other branch was not over"
    assert result[0] == {"cycle": [f"{p_id}/2-0", p_id]}


PAIR = (
    DFlow.from_call("s")
    .map(declare_peer)
    .id("dlh-pair-decl")
    .flat_map(lambda _: DFlow.from_call("answer"))
    .id("dlh-pair-wait")
    .on_error_return(caught)
    .init("dlh-pair")
)


def declare_then_zip(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)  # for p's next wait: the from_call after the zip
    return peer


P_ZIP = (
    DFlow.from_call("s")
    .map(declare_then_zip)
    .id("dlh-pz-decl")
    .flat_map(lambda _: DFlow.zip(DFlow.from_call("outside"), DFlow.just(1)))
    .id("dlh-pz-zip")
    .flat_map(lambda _: DFlow.from_call("answer"))
    .id("dlh-pz-wait")
    .on_error_return(caught)
    .init("dlh-pz")
)


def test_zip_branches_do_not_inherit_a_declaration(detecting: dflow.Runtime) -> None:
    """p declares that its next wait is answered by q, then zips before it waits: the
    branch waiting for an outside call must not be taken for waiting for q (q waits for
    p, so p -> branch -> q -> p would look like a cycle). After the zip, p's own wait is
    declared and the real cycle p <-> q is found (q's wait, declared first, is broken)."""
    p_id, q_id = _ids("p", "q")
    p = P_ZIP.call(q_id, trace_id=p_id)
    q = PAIR.call(p_id, trace_id=q_id)
    branch = f"{p_id}/3-0"
    _until(lambda: dflow.Run(branch).status() is RunStatus.WAITING and q.status() is RunStatus.WAITING)
    _passes(INTERVAL * 6)
    assert [e.waiter for e in _edges(detecting)] == [q_id], "the branch declared nothing"
    assert _errors(p) == [] and _errors(dflow.Run(branch)) == [] and _errors(q) == []
    DFlow.call("outside", "late", branch)
    assert q.result(5) == {"cycle": [q_id, p_id]}, "the parent kept its declaration for its own wait"
    assert _errors(p) == [] and p.status() is RunStatus.WAITING
    p.cancel()


def branch_declares(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)  # and the branch ends without waiting
    return peer


P_MERGE = (
    DFlow.from_call("s")
    .flat_map(lambda peer: DFlow.zip(DFlow.just(peer).map(branch_declares).id("dlh-pm-br"), DFlow.just(1)))
    .id("dlh-pm-zip")
    .flat_map(lambda _: DFlow.from_call("outside"))
    .id("dlh-pm-wait")
    .init("dlh-pm")
)


def test_a_branchs_declaration_does_not_reach_its_parent(detecting: dflow.Runtime) -> None:
    """A zip branch declared a wait for q and ended without waiting: the zip merges the
    branches' data into the run, but not that, or p's next wait (for an outside call)
    would be taken for a wait for q, which waits for p."""
    p_id, q_id = _ids("p", "q")
    q = PAIR.call(p_id, trace_id=q_id)
    _until(lambda: q.status() is RunStatus.WAITING)
    p = P_MERGE.call(q_id, trace_id=p_id)
    _until(lambda: p.status() is RunStatus.WAITING and p.info().waiting_for == "outside")
    _passes(INTERVAL * 6)
    assert [e.waiter for e in _edges(detecting)] == [q_id]
    assert _errors(p) == [] and _errors(q) == []
    assert WAIT_FOR_KEY not in p.context().as_dict()
    for r in (p, q):
        r.cancel()


# -- declared waits left behind ----------------------------------------------------------


def test_no_declared_wait_outlives_its_run() -> None:
    """Waits of runs that end, are cancelled or broken go with the next look; a runtime
    without a detector declares none (nothing would ever drop them)."""
    runtime = dflow.global_init_for_test(deadlock_interval=None)
    try:
        a_id, b_id = _ids("a", "b")
        a = WAITER.call(b_id, trace_id=a_id)
        _until(lambda: a.status() is RunStatus.WAITING)
        time.sleep(0.05)
        assert _edges(runtime) == [], "no detector: nothing declared"
        a.cancel()
    finally:
        dflow.shutdown()
    runtime = dflow.global_init_for_test(deadlock_interval=INTERVAL)
    try:
        ids = _ids("a", "b", "c", "d")
        runs = [
            WAITER.call(ids[(i + 1) % 4] if i < 3 else "nobody-" + ids[0], trace_id=t)
            for i, t in enumerate(ids)
        ]
        _until(lambda: len(_edges(runtime)) == 4)
        runs[0].cancel()
        DFlow.call("answer", "x", ids[1])
        runs[1].result(5)
        _until(lambda: sorted(e.waiter for e in _edges(runtime)) == sorted(ids[2:]), timeout=2)
        for r in runs[2:]:
            r.cancel()
        _until(lambda: _edges(runtime) == [], timeout=2)
    finally:
        dflow.shutdown()


# -- 10,000 declared waits ---------------------------------------------------------------


class TableStore:
    """The two reads of a store the detector makes, from a table."""

    def __init__(self, runs: dict[str, RunInfo]) -> None:
        self.runs = runs
        self.reads = 0

    async def get_run(self, trace_id: str) -> RunInfo | None:
        self.reads += 1
        return self.runs.get(trace_id)

    async def get_steps(self, trace_id: str) -> list[Any]:
        return []


def _many(n: int, close: bool) -> tuple[TableStore, MemoryStateBackend, list[str]]:
    backend = MemoryStateBackend()
    ids = [f"r{i}" for i in range(n)]
    runs = {r: RunInfo(r, RunStatus.WAITING, 3, 0.0, 0.0, waiting_for="answer") for r in ids}
    loop = asyncio.new_event_loop()
    for i, r in enumerate(ids):
        target = ids[(i + 1) % n] if close or i + 1 < n else "nobody"
        loop.run_until_complete(backend.waits_add(r, 3, "answer", [target]))
    loop.close()
    return TableStore(runs), backend, ids


@pytest.mark.parametrize("n, close", [(10_000, False), (10_000, True), (MAX_RUNS + 1, True)])
def test_ten_thousand_declared_waits(n: int, close: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A chain of 10,000 waits ending at a run that may answer: nothing is broken. A ring
    of 10,000: one wait is broken, its cycle has them all. Beyond MAX_RUNS the detector
    looks no further: it breaks nothing (it never guesses)."""
    caplog.set_level(logging.ERROR, "dflow.deadlock")  # (a ring's message names 10,000 runs)
    store, backend, ids = _many(n, close)
    resumed: list[tuple[Any, ...]] = []

    async def resume(*args: Any, **kwargs: Any) -> None:
        resumed.append((*args, kwargs))

    detector = DeadlockDetector(store, resume, interval=5, token="t")  # type: ignore[arg-type]
    t0 = time.perf_counter()
    found = asyncio.run(detector.detect(backend))
    took = time.perf_counter() - t0
    assert took < 5.0, f"one look at {n} waits took {took:.1f}s"
    if not close or n > MAX_RUNS:
        assert found == [] and resumed == []
        return
    (deadlock,) = found
    assert len(deadlock.cycle) == n and set(deadlock.cycle) == set(ids)
    assert [(r[0], r[1], r[3]) for r in resumed] == [(ids[0], "answer", {"failed": True, "seq": 3})]
    assert store.reads == 2 * n, "each run read once, and the knot again before breaking"


# -- hostile or damaged declarations -----------------------------------------------------


def test_wait_for_refuses_ids_no_run_can_have() -> None:
    ctx = ContextStack("me")
    for bad in ("a b", "a\nb", "ｆｕｌｌ", "x" * 129, "", "../x", "a/b-c"):
        with pytest.raises(InvalidTraceIdError):
            ctx.wait_for(bad)
    ctx.wait_for("p/3-0/1-2", "x" * 128)
    assert ctx.get(WAIT_FOR_KEY) == ["p/3-0/1-2", "x" * 128]


@pytest.fixture
def redis_store() -> Iterator[Any]:
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is not available: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} is not available: {exc}")
    from dflow.adapters.redis import RedisStore

    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield lambda: RedisStore(REDIS_URL, prefix=prefix), redis.Redis.from_url(REDIS_URL), prefix
    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(f"{prefix}:*"))
    if keys:
        r.delete(*keys)
    r.close()


def test_damaged_or_hostile_declarations_do_not_stop_detection(redis_store: Any) -> None:
    """A writer of the store can put anything under ``WAIT_FOR_KEY`` (a step cannot). Only run
    ids are declared; a field of the graph that is not an edge is dropped, not left to
    fail every later look (which would end detection for every run)."""
    make, r, prefix = redis_store

    async def go() -> None:
        store = make()
        backend = backend_for(store)
        await declare(store, "w1", 3, "answer", ["a b", "x" * 5000, 7, None, "ok", "p/1-0"])
        await declare(store, "w2", 3, "answer", "not a list")
        r.hset(
            f"{prefix}:{{waits}}:e",
            mapping={"one two three four": "1 x", "w3 nan-seq t": "1 x", "w4 3 t": "no-time"},
        )
        edges = await backend.waits_list()
        assert sorted((e.waiter, e.target) for e in edges) == [("w1", "ok"), ("w1", "p/1-0")]
        assert sorted(r.hkeys(f"{prefix}:{{waits}}:e")) == [b"w1 3 ok", b"w1 3 p/1-0"], "the damaged went"

        async def resume(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("nothing to break")

        assert await DeadlockDetector(store, resume, interval=1, token="t").detect() == []
        assert r.hlen(f"{prefix}:{{waits}}:e") == 0, "w1 does not exist: its waits are over"
        await store.close()

    asyncio.run(go())


# -- two runtimes in one process, the lease holder stopping ------------------------------


def test_two_runtimes_in_one_process_break_a_deadlock_once() -> None:
    transport = dflow.MemoryTransport()
    store = dflow.MemoryStore(transport=transport)
    one = dflow.configure(transport, store, secret=KEY, poll_interval=0.005, deadlock_interval=INTERVAL)
    loop = one._loop
    assert loop is not None
    two = dflow.Runtime(
        transport, store, secret=KEY, poll_interval=0.005, deadlock_interval=INTERVAL, deadlock_rule="newest"
    )  # (were both to break, both runs would fail)
    asyncio.run_coroutine_threadsafe(two.start(), loop).result(5)
    registries = [prom.CollectorRegistry(), prom.CollectorRegistry()]
    one.add_observer(Metrics(registry=registries[0]))
    two.add_observer(Metrics(registry=registries[1]))
    try:
        for _ in range(3):
            a_id, b_id = _ids("a", "b")
            a = PAIR.call(b_id, trace_id=a_id)
            _until(lambda r=a: r.status() is RunStatus.WAITING)  # type: ignore[misc]
            b = PAIR.call(a_id, trace_id=b_id)
            _until(lambda p=(a, b): len(_errors(p[0])) + len(_errors(p[1])) == 1, timeout=3)  # type: ignore[misc]
            _passes(INTERVAL * 4)
            assert len(_errors(a)) + len(_errors(b)) == 1, "one wait of the cycle is broken, once"
            broken = a if _errors(a) else b
            assert broken.result(5)["cycle"][0] == broken.trace_id
            (other,) = {a, b} - {broken}
            other.cancel()
        counts = [reg.get_sample_value("dflow_deadlocks_total") or 0.0 for reg in registries]
        assert sum(counts) == 3.0, counts

        # the lease holder stops: the other detector takes over at once
        backend = backend_for(store)
        assert isinstance(backend, MemoryStateBackend)
        holder = backend._waits_lease[0]
        stopping = one if one.deadlocks is not None and holder == one.deadlocks.token else two
        asyncio.run_coroutine_threadsafe(stopping.stop(1.0), loop).result(5)
        a_id, b_id = _ids("a", "b")
        a = PAIR.call(b_id, trace_id=a_id)
        _until(lambda: a.status() is RunStatus.WAITING)
        b = PAIR.call(a_id, trace_id=b_id)
        t0 = time.monotonic()
        _until(lambda: len(_errors(a)) + len(_errors(b)) == 1, timeout=3)
        assert time.monotonic() - t0 < 1.0, "no wait for the stopped holder's lease to run out"
        for r in (a, b):
            r.cancel()
    finally:
        if not two._stopping:
            asyncio.run_coroutine_threadsafe(two.stop(1.0), loop).result(5)
        dflow.shutdown()


# -- idle cost on Redis ------------------------------------------------------------------


def test_an_idle_detector_on_redis_reads_one_empty_hash_per_interval(redis_store: Any) -> None:
    make, r, prefix = redis_store

    async def go() -> dict[str, int]:
        store = make()
        backend = backend_for(store)
        calls: dict[str, int] = {}
        for name in ("waits_list", "waits_lease", "waits_drop", "waits_add"):
            method = getattr(backend, name)

            def counted(*args: Any, _m: Any = method, _n: str = name) -> Any:
                calls[_n] = calls.get(_n, 0) + 1
                return _m(*args)

            setattr(backend, name, counted)
        clock = FakeClock()
        runtime = dflow.Runtime(
            dflow.MemoryTransport(), store, secret=KEY, deadlock_interval=INTERVAL, clock=clock
        )
        assert runtime.deadlocks is not None
        detecting = asyncio.create_task(runtime.deadlocks.run())  # (the runtime's loop that looks)
        for looked in range(LOOKS):  # a second of intervals on the runtime's clock
            await _asleep_after(looked, calls, clock)
            await clock.advance(INTERVAL)
        await _asleep_after(LOOKS, calls, clock)
        assert r.exists(f"{prefix}:{{waits}}:lease") == 0, "idle: no lease taken"
        detecting.cancel()
        await asyncio.gather(detecting, return_exceptions=True)
        await store.close()
        return calls

    calls = asyncio.run(go())
    assert set(calls) <= {"waits_list", "waits_lease"}, calls
    assert calls.get("waits_lease", 0) <= 1, "only the give-back when it stops"
    assert calls["waits_list"] == LOOKS, calls


LOOKS = round(1.0 / INTERVAL)


async def _asleep_after(looks: int, calls: dict[str, int], clock: FakeClock) -> None:
    """Wait (real time, bounded) until the detector has looked ``looks`` times and sleeps
    on ``clock`` until its next look."""
    deadline = time.monotonic() + 10
    while not (calls.get("waits_list", 0) == looks and clock.sleeping == 1):
        assert time.monotonic() < deadline, f"the detector did not look {looks} times: {calls}"
        await asyncio.sleep(0.001)
