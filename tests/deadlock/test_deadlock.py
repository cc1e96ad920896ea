"""Deadlock detection in local mode: runs waiting for each other are found within the
interval and one is resumed with ``DeadlockError``, which its handler catches; runs that
merely wait long are never broken. Also the knot finding on its own, ``ctx.wait_for``'s
checks, and the waits-for graph and lease of the in-memory and Redis backends."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client as prom
import pytest

import dflow
from dflow import ContextStack, DeadlockError, DFlow, InvalidTraceIdError, Run, RunStatus, StepStatus
from dflow.context import WAIT_FOR_KEY
from dflow.memory.state import MemoryStateBackend
from dflow.metrics import Metrics
from dflow.patterns.deadlock import _knots, newest_waiting, rule_of
from dflow.shared_state import StateBackend, backend_for

INTERVAL = 0.3
KEY = os.urandom(32)
REDIS_URL = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")


@pytest.fixture
def detecting() -> Iterator[dflow.Runtime]:
    """Local mode looking for deadlocks every 0.3 s."""
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


def _waiting(*runs: Run[Any]) -> bool:
    return all(r.status() is RunStatus.WAITING for r in runs)


def _edges(runtime: dflow.Runtime) -> list[Any]:
    return asyncio.run_coroutine_threadsafe(backend_for(runtime.store).waits_list(), runtime._loop).result(5)  # type: ignore[arg-type]


# -- flows -------------------------------------------------------------------------


def declare_peer(ctx: ContextStack, peer: str) -> str:
    ctx.wait_for(peer)
    return peer


async def give_up_and_answer(ctx: ContextStack, error: BaseException) -> dict[str, Any]:
    """A broken wait: answer the run it waited for, so that it goes on too."""
    if not isinstance(error, DeadlockError):
        raise error
    await DFlow.acall("answer", f"{ctx.trace_id} gave up", error.error["cycle"][1])
    return {"broken": error.error["cycle"], "message": str(error)}


# (ids of their own: step keys are process-wide, and those of the worker tests must stay theirs)
PAIR = (
    DFlow.from_call("dl-start")
    .map(declare_peer)
    .id("dl-declare")
    .flat_map(lambda peer: DFlow.from_call("answer"))
    .id("dl-wait")
    .map(lambda answer: {"answer": answer})
    .id("dl-got")
    .on_error_return(give_up_and_answer)
    .init("deadlock-pair-local")
)
OUTSIDE = (
    DFlow.from_call("dl-start")
    .flat_map(lambda _: DFlow.from_call("outside"))
    .id("dl-outside")
    .init("deadlock-outside-local")
)
NAP = (
    DFlow.from_call("dl-start")
    .flat_map(lambda _: DFlow.delay("nap", 30))
    .id("dl-nap")
    .init("deadlock-nap-local")
)


# -- two runs waiting on each other --------------------------------------------------


def test_two_runs_waiting_on_each_other_are_broken_within_the_interval(detecting: dflow.Runtime) -> None:
    pipeline = PAIR
    a_id, b_id = _ids("a", "b")
    a = pipeline.call(b_id, trace_id=a_id)
    _until(lambda: _waiting(a))
    b = pipeline.call(a_id, trace_id=b_id)
    _until(lambda: _waiting(b))
    both_waiting = time.monotonic()

    broken = a.result(5)
    found_in = time.monotonic() - both_waiting
    assert found_in < INTERVAL + 0.5, f"found {found_in:.2f}s after both waited (interval {INTERVAL}s)"
    assert broken["broken"] == [a_id, b_id], "the longest waiting run (a) is broken; the cycle starts with it"
    assert f"{a_id} -> {b_id} -> {a_id}" in broken["message"]
    assert b.result(5) == {"answer": f"{a_id} gave up"}, "b is not broken: a's handler answered it"

    steps = a.context().steps
    failed = [s for s in steps if s.status is StepStatus.FAILED]
    assert len(failed) == 1 and failed[0].error is not None
    assert failed[0].error["type"] == "dflow.errors.DeadlockError"
    assert failed[0].error["cycle"] == [a_id, b_id], "the run's record carries the cycle"
    assert [s.status for s in steps][-1] is StepStatus.RECOVERED
    assert not [s for s in b.context().steps if s.error], "b saw no error"
    assert WAIT_FOR_KEY not in a.context().as_dict(), "the declaration goes with the wait"
    _until(lambda: _edges(detecting) == [])


def test_a_wait_declared_in_on_init_and_the_newest_rule(detecting: dflow.Runtime) -> None:
    assert detecting.deadlocks is not None
    detecting.deadlocks.rule = newest_waiting

    def ask(ctx: ContextStack) -> None:
        ctx.wait_for(ctx.get("peer"))

    def start(ctx: ContextStack, peer: str) -> str:
        ctx.put("peer", peer)
        return peer

    pipeline = (
        DFlow.from_call("dl-start")
        .map(start)
        .id("dl-keep-peer")
        .flat_map(lambda _: DFlow.from_call("answer", on_init=ask))
        .id("dl-wait-on-init")
        .on_error_return(give_up_and_answer)
        .init(f"deadlock-on-init-{uuid.uuid4().hex[:8]}")
    )
    a_id, b_id = _ids("a", "b")
    a = pipeline.call(b_id, trace_id=a_id)
    _until(lambda: _waiting(a) and len(_edges(detecting)) == 1)
    b = pipeline.call(a_id, trace_id=b_id)
    assert b.result(5)["broken"] == [b_id, a_id], "the newest wait (b's) is broken"
    assert a.result(5) == f"{b_id} gave up"


def test_a_branch_waiting_for_its_parent_like_an_agent_tool(detecting: dflow.Runtime) -> None:
    """The parent waits at an ``any`` join for its only branch (as an agent waits for the
    sub-agent of ``agent_tool``); the branch waits for a call the parent would make."""

    def ask_parent(ctx: ContextStack, v: Any) -> Any:
        ctx.wait_for(ctx.trace_id.rsplit("/", 1)[0])
        return v

    def sub_agent_failed(error: BaseException) -> str:
        assert isinstance(error, DeadlockError)
        return f"fallback: {' -> '.join(error.error['cycle'])}"

    branch = (
        DFlow.just(1)
        .map(ask_parent)
        .id("dl-ask")
        .flat_map(lambda _: DFlow.from_call("parent-answer"))
        .id("dl-wait-parent")
        .on_error_return(sub_agent_failed)
    )
    (parent_id,) = _ids("parent")
    run = DFlow.direct_run(dflow.InitParam(0, trace_id=parent_id), lambda _: DFlow.any(branch).id("dl-tool"))
    result = run.result(5)
    child = f"{parent_id}/2-0"  # (step 2 of the run forks)
    assert result == f"fallback: {child} -> {parent_id}"


def test_a_sub_agent_of_an_agent_tool_waiting_for_its_caller(detecting: dflow.Runtime) -> None:
    """A sub-agent's flow tool waits for a call its calling agent would make: the caller
    waits for the sub-agent (``agent_tool``), which waits for it."""
    from dflow_agents import AgentStatus, ToolCallAgent, agent_tool, tool
    from dflow_agents.testing import ScriptedModel, call, reply

    def declare_caller(ctx: ContextStack, question: str) -> str:
        ctx.wait_for(ctx.trace_id.split("/")[0])
        return question

    @tool
    def ask_caller(question: str) -> DFlow[str]:
        """Ask the agent that called you, and wait for its answer."""
        return (
            DFlow.just(question)
            .map(declare_caller)
            .id("dl-ask-caller")
            .flat_map(lambda q: DFlow.from_call("caller-answer"))
            .id("dl-wait-caller")
        )

    helper_model = ScriptedModel(
        [reply(calls=[call("ask_caller", question="which city?")]), reply("No answer came; I guess Paris.")]
    )
    helper = ToolCallAgent(f"dl-helper-{uuid.uuid4().hex[:6]}", helper_model, [ask_caller])
    boss_model = ScriptedModel([reply(calls=[call("helper", query="find the city")]), reply("Paris, then.")])
    boss = ToolCallAgent(f"dl-boss-{uuid.uuid4().hex[:6]}", boss_model, [agent_tool(helper, name="helper")])

    run = boss.run("Which city?")
    result = run.result(10)
    assert (result.status, result.answer) == (AgentStatus.FINISHED, "Paris, then.")
    (observed,) = [m.content for m in helper_model.requests[1].messages if m.role == "tool"]
    assert "DeadlockError" in observed and f"-> {run.trace_id} ->" in observed, observed
    assert [m.content for m in boss_model.requests[1].messages if m.role == "tool"] == [
        "No answer came; I guess Paris."
    ]


# -- runs that merely wait long --------------------------------------------------------


def test_runs_that_merely_wait_long_are_never_broken(detecting: dflow.Runtime) -> None:
    pipeline, external, sleeper = PAIR, OUTSIDE, NAP
    c_id, d_id, e_id, f_id, g_id, h_id = _ids("c", "d", "e", "f", "g", "h")
    d = external.call(None, trace_id=d_id)  # waits for a call from outside, declared by nobody
    f = sleeper.call(None, trace_id=f_id)  # sleeping
    h = DFlow.direct_run(dflow.InitParam(1, trace_id=h_id), lambda v: DFlow.just(v))  # done
    h.result(5)
    c = pipeline.call(d_id, trace_id=c_id)
    e = pipeline.call(f_id, trace_id=e_id)
    g = pipeline.call(h_id, trace_id=g_id)
    g2 = pipeline.call(g_id, trace_id=_ids("g2")[0])  # waits for g, which waits for a run that has ended

    # an any whose branch waits for the parent, while its other branch waits for the outside
    def ask_parent(ctx: ContextStack, v: Any) -> Any:
        ctx.wait_for(ctx.trace_id.rsplit("/", 1)[0])
        return v

    (p_id,) = _ids("p")
    p = DFlow.direct_run(
        dflow.InitParam(0, trace_id=p_id),
        lambda _: DFlow.any(
            DFlow.just(1)
            .map(ask_parent)
            .id("dl-ask")
            .flat_map(lambda _: DFlow.from_call("parent-answer"))
            .id("dl-w"),
            DFlow.from_call("outside"),
        ).id("dl-race"),
    )
    everyone = [c, d, e, g, g2, p]
    _until(lambda: _waiting(*everyone) and f.status() is RunStatus.SLEEPING)
    _until(lambda: len(_edges(detecting)) == 5)

    time.sleep(INTERVAL * 6)
    assert _waiting(*everyone), [r.status() for r in everyone]
    assert f.status() is RunStatus.SLEEPING
    for r in everyone:
        assert not [s for s in r.context().steps if s.error], f"{r.trace_id} was broken"

    DFlow.call("outside", "late", d_id)
    DFlow.call("answer", "late", c_id)
    assert c.result(5) == {"answer": "late"}
    _until(lambda: len(_edges(detecting)) == 4, timeout=INTERVAL * 10)  # c's wait is over: its edge goes
    DFlow.call("outside", "late", f"{p_id}/2-1")
    assert p.result(5) == "late"
    for r in (e, g, g2, f):
        r.cancel()


# -- metrics -------------------------------------------------------------------------


def test_metrics_count_the_deadlocks_broken(detecting: dflow.Runtime) -> None:
    registry = prom.CollectorRegistry()
    detecting.add_observer(Metrics(registry=registry))
    pipeline = PAIR
    a_id, b_id = _ids("a", "b")
    a = pipeline.call(b_id, trace_id=a_id)
    b = pipeline.call(a_id, trace_id=b_id)
    assert a.result(5)["broken"] == [a_id, b_id] and b.result(5) == {"answer": f"{a_id} gave up"}
    assert registry.get_sample_value("dflow_deadlocks_total") == 1.0


# -- finding knots -------------------------------------------------------------------


def test_knots_are_sets_of_runs_that_wait_only_for_each_other() -> None:
    assert _knots({"a": ["b"], "b": ["a"]}) == [{"a", "b"}]
    assert _knots({"a": ["a"]}) == [{"a"}], "a run waiting for itself"
    assert _knots({"a": ["b"], "b": ["c"]}) == [], "c may go on"
    assert _knots({"a": ["b", "x"], "b": ["a"]}) == [], "a waits for any of b and x; x may go on"
    # two cycles, one waiting for the other: only the one that waits for nothing outside is broken
    assert _knots({"a": ["b"], "b": ["a", "c"], "c": ["d"], "d": ["c"]}) == [{"c", "d"}]
    # a run waiting for a knot is stuck, but not part of it
    assert _knots({"x": ["a"], "a": ["b"], "b": ["a"]}) == [{"a", "b"}]
    # a longer cycle through a join
    assert _knots({"p": ["p/1-0"], "p/1-0": ["q"], "q": ["p"]}) == [{"p", "p/1-0", "q"}]


def test_the_rule_and_the_interval_are_checked() -> None:
    assert rule_of("newest") is newest_waiting
    with pytest.raises(ValueError, match="deadlock_rule is one of 'longest', 'newest'"):
        rule_of("oldest")
    with pytest.raises(ValueError, match="deadlock_interval is a number of seconds above 0"):
        dflow.Runtime(dflow.MemoryTransport(), dflow.MemoryStore(), secret=KEY, deadlock_interval=-1)
    assert (
        dflow.Runtime(
            dflow.MemoryTransport(), dflow.MemoryStore(), secret=KEY, deadlock_interval=None
        ).deadlocks
        is None
    )


def test_wait_for_checks_the_run_ids() -> None:
    ctx = ContextStack("me")
    with pytest.raises(InvalidTraceIdError, match="contains '/'"):
        ctx.wait_for("not/a-branch")
    with pytest.raises(InvalidTraceIdError, match="is a str"):
        ctx.wait_for(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at least one run"):
        ctx.wait_for()
    ctx.wait_for("other", "parent/3-0")
    ctx.wait_for("other")
    assert ctx.get(WAIT_FOR_KEY) == ["other", "parent/3-0"]


# -- the backends' waits-for graph and lease -----------------------------------------------


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[StateBackend, Callable[[Any], Any]]]:
    if request.param == "memory":
        loop = asyncio.new_event_loop()
        yield MemoryStateBackend(), loop.run_until_complete
        loop.close()
        return
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is not available: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} is not available: {exc}")
    from dflow.adapters.redis import RedisStore

    prefix = f"t{uuid.uuid4().hex[:10]}"
    loop = asyncio.new_event_loop()
    store = RedisStore(REDIS_URL, prefix=prefix)
    yield backend_for(store), loop.run_until_complete
    loop.run_until_complete(store.close())
    loop.close()
    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(f"{prefix}:*"))
    assert {k.decode() for k in keys} <= {f"{prefix}:{{waits}}:e", f"{prefix}:{{waits}}:lease"}
    if keys:
        r.delete(*keys)
    r.close()


def test_a_backend_keeps_declared_waits(backend: tuple[StateBackend, Callable[[Any], Any]]) -> None:
    b, run = backend
    before = time.time()
    run(b.waits_add("a", 3, "answer me", ["b", "c/2-0"]))
    time.sleep(0.01)
    run(b.waits_add("a", 3, "answer me", ["b"]))  # again: keeps its first time
    run(b.waits_add("b", 5, "x", ["a"]))
    edges = sorted(run(b.waits_list()), key=lambda e: (e.waiter, e.target))
    assert [(e.waiter, e.seq, e.call_type, e.target) for e in edges] == [
        ("a", 3, "answer me", "b"),
        ("a", 3, "answer me", "c/2-0"),
        ("b", 5, "x", "a"),
    ]
    assert all(before - 1 <= e.since <= time.time() + 1 for e in edges)
    assert edges[0].since == edges[1].since < edges[2].since
    run(b.waits_drop(edges[:2]))
    assert [(e.waiter, e.target) for e in run(b.waits_list())] == [("b", "a")]
    run(b.waits_drop(run(b.waits_list())))
    assert run(b.waits_list()) == []


def test_one_detector_at_a_time_holds_the_lease(backend: tuple[StateBackend, Callable[[Any], Any]]) -> None:
    b, run = backend
    assert run(b.waits_lease("one", 0.3)) is True
    assert run(b.waits_lease("two", 0.3)) is False
    assert run(b.waits_lease("one", 0.3)) is True, "renewed"
    assert run(b.waits_lease("two", 0)) is False, "only its holder gives it up"
    assert run(b.waits_lease("two", 0.3)) is False
    time.sleep(0.35)
    assert run(b.waits_lease("two", 0.3)) is True, "taken over once it ran out"
    assert run(b.waits_lease("one", 0.3)) is False
    assert run(b.waits_lease("two", 0)) is False
    assert run(b.waits_lease("one", 0.3)) is True, "given up: free at once"
