"""Compensation (``DFlow.compensate``) under odd and hostile input, in local mode and, where
the Redis scripts take part, on Redis in this process: compensations that raise
``BaseException`` or return huge values, 50 rounds of a flat_map loop, more compensations
than one chain holds, an ``any`` whose loser completed a step, zip branches whose run
recovers, runs cancelled twice or while compensating, saga fields forged through the HTTP
API or in the store, a step writing the run's compensating mark, and reruns."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import dflow
from dflow import ContextStack, DFlow, RunCompensatedError, RunFailedError, RunStatus, StepStatus
from dflow.wire.values import encode

SECRET = "secret-of-the-saga-hostile-tests-0123456789"


class Ledger(list[Any]):
    """What the steps of a test did and undid, in order (shared: flows built at run time
    capture it by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        dflow.shared(self, f"saga-hostile-ledger-{uuid.uuid4().hex[:8]}")

    def add(self, *event: Any) -> None:
        with self.lock:
            self.append(event)

    def of(self, kind: str) -> list[Any]:
        return [e[1] for e in self if e[0] == kind]


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _redis_url() -> str:
    from tests.integration.conftest import REDIS_URL, require

    url = urlunsplit(urlsplit(REDIS_URL)._replace(path="/10"))
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        require(f"Redis at {url}", False, str(exc))
    return url


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """Local mode, or this process as a worker on Redis (database 10; the key prefix is
    yielded, to read the store's keys)."""
    if request.param == "memory":
        DFlow.global_init_for_test()
        try:
            yield None
        finally:
            dflow.shutdown()
        return
    from tests.integration.conftest import fresh_prefix

    url = _redis_url()
    with fresh_prefix(url) as p:
        dflow.configure(f"{url}?stream={p}:steps", f"{url}?prefix={p}", secret=SECRET, deadlock_interval=None)
        try:
            yield p
        finally:
            dflow.shutdown()


@pytest.fixture
def on_redis() -> Iterator[tuple[str, Any]]:
    """This process as a worker on Redis: the key prefix and a client of that Redis."""
    import redis

    from tests.integration.conftest import fresh_prefix

    url = _redis_url()
    r = redis.Redis.from_url(url)
    with fresh_prefix(url) as p:
        dflow.configure(f"{url}?stream={p}:steps", f"{url}?prefix={p}", secret=SECRET, deadlock_interval=None)
        try:
            yield p, r
        finally:
            dflow.shutdown()
            r.close()


def boom(v: Any) -> None:
    raise ValueError("the last step fails")


def _compensated(run: dflow.Run[Any], timeout: float = 20) -> dict[str, Any]:
    with pytest.raises(RunCompensatedError) as caught:
        run.result(timeout)
    return caught.value.error


def _failed(run: dflow.Run[Any], timeout: float = 20) -> dict[str, Any]:
    with pytest.raises(RunFailedError) as caught:
        run.result(timeout)
    assert not isinstance(caught.value, RunCompensatedError), caught.value.error
    return caught.value.error


# -- what compensations do ---------------------------------------------------------------------


class Weird(BaseException):
    """A library's own BaseException."""


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt(), Weird("weird")], ids=type)
@pytest.mark.usefixtures("local")
def test_a_compensation_raising_a_base_exception_fails_the_run_and_spares_the_worker(
    raised: BaseException,
) -> None:
    ledger = Ledger()
    tries = {"n": 0}

    def undo_badly(v: Any) -> None:
        tries["n"] += 1
        raise raised

    flow = (
        DFlow.from_call("go")
        .map(lambda v: "a")
        .id("a")
        .compensate(lambda v: ledger.add("undo", v))
        .map(lambda v: "b")
        .id("b")
        .compensate(undo_badly, backoff=0.01)
        .map(boom)
        .id("c")
    )
    run = flow.init(_name("saga-base")).call()
    error = _failed(run)
    assert run.status() is RunStatus.FAILED
    assert error["type"] == "ValueError" and error["step"] == "c", "the error it failed with first"
    assert error["compensation_error"]["type"].endswith(type(raised).__qualname__)
    assert error["compensated"] == [] and error["undone"] == ["b>c", "a>b>c"]
    assert tries["n"] == 1, "a BaseException is not retried (the policy retries Exception)"
    assert ledger.of("undo") == [], "nothing after it is undone"
    after = DFlow.from_call("go").map(lambda v: v + 1).id("next").init(_name("saga-after")).call(1)
    assert after.result(10) == 2, "the worker goes on"


@pytest.mark.usefixtures("local")
def test_a_compensation_returning_a_huge_value_drops_it() -> None:
    def huge(v: Any) -> str:
        return "x" * (9 * 1024 * 1024)  # over the 8 MiB a step may write

    run = (
        DFlow.from_call("go")
        .map(lambda v: "a")
        .id("a")
        .compensate(huge)
        .map(boom)
        .id("b")
        .init(_name("saga-huge"))
        .call()
    )
    error = _compensated(run)
    assert error["compensated"] == ["a>b"]
    (undo,) = [s for s in run.context().steps if (s.name or "").startswith("compensate")]
    assert undo.output == f"(not kept: a value of type str, {9 * 1024 * 1024 + 5} bytes)", (
        "its record notes what it was"
    )


@pytest.mark.usefixtures("local")
def test_a_compensated_step_in_a_flat_map_loop_50_times() -> None:
    ledger = Ledger()

    def loop(i: int) -> DFlow[Any]:
        if i == 50:
            return DFlow.just(i).map(boom).id("end")
        return (
            DFlow.just(i)
            .map(lambda x: x)
            .id("round")
            .compensate(lambda ctx, x: ledger.add("undo", (x, ctx.idempotency_key)))
            .flat_map(lambda x: loop(x + 1))
            .id("again")
        )

    run = DFlow.from_call("go").flat_map(loop).id("loop").init(_name("saga-loop")).call(0)
    error = _compensated(run)
    undone = ledger.of("undo")
    assert [x for x, _ in undone] == list(range(49, -1, -1)), "newest first"
    assert len({k for _, k in undone}) == 50, "each a step of its own"
    assert len(error["compensated"]) == 50
    assert not [k for k in run.context().keys() if k.startswith("dflow/saga/")]


def test_150_compensations_run_in_two_chains_newest_first(backend: str | None) -> None:
    ledger = Ledger()
    flow: Any = DFlow.from_call("go")
    for i in range(150):
        flow = flow.map(lambda v, i=i: i).id(f"k{i}").compensate(lambda v: ledger.add("undo", v))
    run = flow.map(boom).id("end").init(_name("saga-150")).call()
    error = _compensated(run, 60)
    assert ledger.of("undo") == list(range(149, -1, -1))
    assert len(error["compensated"]) == 150 and error["compensated"][0].startswith("k149>")
    names = [
        s.name
        for s in run.context().steps
        if s.status is StepStatus.DONE and (s.name or "").startswith("compensate")
    ]
    assert len(names) == 150 and len(set(names)) == 150, "each committed once"


# -- branches ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("local")
def test_an_any_loser_that_completed_a_step_undoes_it_and_the_winner_stays() -> None:
    ledger = Ledger()

    def book(what: str) -> Any:
        def do(v: Any) -> str:
            ledger.add("do", what)
            return what

        return do

    def race(v: Any) -> DFlow[Any]:
        return DFlow.any(
            DFlow.delay(v, 0.2).map(book("fast")).id("fast").compensate(lambda w: ledger.add("undo", w)),
            DFlow.just(v)
            .map(book("slow"))
            .id("slow")
            .compensate(lambda w: ledger.add("undo", w))
            .flat_map(lambda s: DFlow.delay(s, 5))
            .id("nap")
            .map(book("never"))
            .id("never"),
        ).id("race")

    ok = DFlow.from_call("go").map(book("before")).id("before").compensate(lambda w: ledger.add("undo", w))
    run = ok.flat_map(race).id("r").init(_name("saga-any")).call()
    assert run.result(10) == "fast"
    _until(lambda: ledger.of("undo") == ["slow"])
    (fork,) = [s for s in run.context().steps if s.status is StepStatus.FORKED]
    statuses = [dflow.Run(b).status() for b in fork.output]
    assert statuses == [RunStatus.DONE, RunStatus.COMPENSATED], "the loser undid what it did"
    time.sleep(0.1)
    assert ledger.of("undo") == ["slow"] and "never" not in ledger.of("do")
    assert run.status() is RunStatus.DONE

    ledger.clear()
    failing = ok.flat_map(race).id("r2").map(boom).id("after").init(_name("saga-any-fails")).call()
    error = _compensated(failing)
    assert error["compensated"] == ["fast>race[0]/r2>after", "before>r2>after"], "the winner's, then before"
    _until(lambda: sorted(ledger.of("undo")) == ["before", "fast", "slow"])


@pytest.mark.usefixtures("local")
def test_a_zip_whose_run_recovers_undoes_nothing_of_its_branches() -> None:
    """A failing branch's entries reach its parent at the join, as the design says: the
    run's handler recovers it, so nothing is undone (as for a step that is not in a branch)."""
    ledger = Ledger()

    def trip(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v).map(lambda x: "a").id("a").compensate(lambda w: ledger.add("undo", w)),
            DFlow.just(v)
            .map(lambda x: "b")
            .id("b")
            .compensate(lambda w: ledger.add("undo", w))
            .flat_map(lambda c: DFlow.delay(c, 0.1))
            .id("pause")
            .map(boom)
            .id("b-fails"),
        ).id("z")

    flow = (
        DFlow.from_call("go")
        .map(lambda v: "before")
        .id("before")
        .compensate(lambda w: ledger.add("undo", w))
        .flat_map(trip)
        .id("t")
        .on_error_return(lambda e: "recovered")
    )
    run = flow.init(_name("saga-zip-recovers")).call()
    assert run.result(10) == "recovered"
    time.sleep(0.1)
    assert ledger.of("undo") == [], "the run did not fail: nothing is undone"
    entries = sorted(k for k in run.context().keys() if k.startswith("dflow/saga/"))
    assert len(entries) == 3, f"the run holds what the branches did, to undo if it fails later: {entries}"

    ledger.clear()
    failing = flow.map(boom).id("later").init(_name("saga-zip-recovers-then-fails")).call()
    error = _compensated(failing)
    assert ledger.of("undo") == ["b", "a", "before"], "newest position first: branch 1, branch 0, before"
    assert len(error["compensated"]) == 3


def test_a_failing_zip_undoes_its_branches_then_the_steps_before(backend: str | None) -> None:
    ledger = Ledger()

    def trip(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v).map(lambda x: "flight").id("flight").compensate(lambda w: ledger.add("undo", w)),
            DFlow.just(v)
            .map(lambda x: "car")
            .id("car")
            .compensate(lambda w: ledger.add("undo", w))
            .flat_map(lambda c: DFlow.delay(c, 0.2))
            .id("slow")
            .map(boom)
            .id("hotel"),
        ).id("both")

    flow = (
        DFlow.from_call("go")
        .map(lambda v: "before")
        .id("before")
        .compensate(lambda w: ledger.add("undo", w))
        .flat_map(trip)
        .id("book")
    )
    run = flow.init(_name("saga-zip-order")).call()
    error = _compensated(run)
    assert ledger.of("undo") == ["car", "flight", "before"]
    assert error["type"] == "ValueError" and error["step"] == "hotel>both[1]/book", (
        "the failed branch's error"
    )
    (fork,) = [s for s in run.context().steps if s.status is StepStatus.FORKED]
    assert [dflow.Run(b).status() for b in fork.output] == [RunStatus.DONE, RunStatus.FAILED], (
        "the failed branch leaves its compensations to its run"
    )


@pytest.mark.xfail(
    strict=True,
    reason="a branch the zip no longer wants undoes its steps by itself, while its "
    "run undoes the steps before the zip at the same time: not newest first",
)
@pytest.mark.usefixtures("local")
def test_a_zip_branch_still_running_is_undone_before_the_steps_before_the_zip() -> None:
    ledger = Ledger()

    async def undo_slowly(w: str) -> None:
        await asyncio.sleep(0.2)
        ledger.add("undo", w)

    def trip(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v)
            .map(lambda x: "a")
            .id("a")
            .compensate(undo_slowly)
            .flat_map(lambda s: DFlow.delay(s, 5))
            .id("a-nap"),
            DFlow.delay(v, 0.1).map(boom).id("b-fails"),
        ).id("z")

    flow = (
        DFlow.from_call("go")
        .map(lambda v: "before")
        .id("before")
        .compensate(lambda w: ledger.add("undo", w))
        .flat_map(trip)
        .id("t")
    )
    run = flow.init(_name("saga-zip-running")).call()
    _compensated(run)
    _until(lambda: len(ledger.of("undo")) == 2)
    assert ledger.of("undo") == ["a", "before"]


# -- cancelling --------------------------------------------------------------------------------


def _waiting_booking(ledger: Ledger, name: str, undo: Any = None) -> dflow.Run[Any]:
    flow = (
        DFlow.from_call("go")
        .map(lambda v: 1)
        .id("c1")
        .compensate(lambda v: ledger.add("undo", v))
        .map(lambda v: 2)
        .id("c2")
        .compensate(undo or (lambda v: ledger.add("undo", v)))
        .flat_map(lambda v: DFlow.from_call("approval"))
        .id("wait")
    )
    run = flow.init(_name(name)).call()
    _until(lambda: run.info().waiting_for == "approval")
    return run


def test_a_run_cancelled_twice_runs_no_compensation_twice(backend: str | None) -> None:
    """A second cancel, before or after the run's FAIL step commits, changes nothing: the
    compensations all run, once each."""
    ledger = Ledger()
    run = _waiting_booking(ledger, "saga-cancel-twice")
    first = run.cancel("first")
    second = run.cancel("second")
    assert first.status is RunStatus.RUNNING and second.status in (RunStatus.RUNNING, RunStatus.COMPENSATED)
    _until(lambda: run.status().finished)
    error = _compensated(run)
    assert error["type"] == "dflow.RunCancelled" and error["message"] in ("first", "second")
    assert ledger.of("undo") == [2, 1], "each once"
    assert run.cancel("third").status is run.status(), "an ended run stays as it ended"


def test_cancel_during_compensation_leaves_the_compensations_running(backend: str | None) -> None:
    """What the store contract says (``Store.cancel``): a cancel of a run that compensates
    changes nothing; the compensations all run, once each."""
    ledger = Ledger()
    gate = threading.Event()
    dflow.shared(gate, _name("saga-gate"))

    async def undo_when_let(v: int) -> None:
        ledger.add("started", v)
        while not gate.is_set():
            await asyncio.sleep(0.01)
        ledger.add("undo", v)

    run = _waiting_booking(ledger, "saga-cancel-compensating", undo_when_let)
    run.cancel("stop")
    _until(lambda: ledger.of("started") == [2])
    assert run.cancel("stop the compensation").status is RunStatus.RUNNING, "it goes on compensating"
    gate.set()
    with pytest.raises(RunCompensatedError) as caught:
        run.result(10)
    assert caught.value.error["message"] == "stop", "the first cancel's reason"
    assert ledger.of("undo") == [2, 1]
    assert not [k for k in run.context().keys() if k.startswith("dflow/saga/")]


# -- forged and misplaced saga data ------------------------------------------------------------


@pytest.mark.usefixtures("local")
def test_the_http_api_takes_no_run_data() -> None:
    import httpx

    from dflow.server import ServerThread, Tokens, create_app
    from tests.support.http_api import bearer, new_session, start, wait_status

    ledger = Ledger()
    admin = "admin-token-of-the-saga-hostile-tests-0123456789"
    name = _name("saga-http")
    (
        DFlow.from_call("go")
        .map(lambda v: {"got": v})
        .id("h1")
        .compensate(lambda v: ledger.add("undo", v))
        .map(lambda v: v)
        .id("h2")
        .init(name)
    )
    app = create_app(tokens=Tokens(SECRET, ttl=600), admin_token=admin, pipelines=[name])
    with ServerThread(app) as base, httpx.Client(base_url=base, timeout=30) as api:
        token = new_session(api, admin)["token"]
        forged = {"dflow/saga/000000000009": "entry", "dflow/compensating": {"error": {}, "done": []}}
        refused = start(api, token, name, None, data=forged)
        assert refused.status_code == 422 and "data" in refused.text, refused.text
        r = start(api, token, name, forged)  # as a parameter it is a value like any other
        assert r.status_code == 201, r.text
        trace = r.json()["trace_id"]
        done = wait_status(api, token, trace, until="done")
        assert done["result"] == {"got": forged}
        assert not [
            k
            for k in dflow.Run(trace).context().keys()
            if k != "dflow/session" and k.startswith("dflow/") and not k.startswith("dflow/saga/")
        ]
        cancelled = api.post(f"/runs/{trace}/cancel", headers=bearer(token))
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "done"
    assert ledger.of("undo") == []


def _entry_fields(prefix: str, r: Any, trace: str) -> dict[bytes, bytes]:
    return {k: v for k, v in r.hgetall(f"{prefix}:d:{trace}").items() if k.startswith(b"dflow/saga/")}


def _resumable(ledger: Ledger, name: str) -> Any:
    return (
        DFlow.from_call("go")
        .map(lambda v: f"{v}-booked")
        .id("r1")
        .compensate(lambda ctx, v: ledger.add("undo", (v, ctx.trace_id)))
        .flat_map(lambda v: DFlow.from_call("resume"))
        .id("wait")
        .map(boom)
        .id("fail")
        .init(_name(name))
    )


def test_an_entry_replayed_from_another_run_runs_no_code(on_redis: tuple[str, Any]) -> None:
    prefix, r = on_redis
    ledger = Ledger()
    pipeline = _resumable(ledger, "saga-replay")
    victim, thief = pipeline.call("victim"), pipeline.call("thief")
    _until(lambda: victim.info().waiting_for == "resume" and thief.info().waiting_for == "resume")
    ((_, stolen),) = _entry_fields(prefix, r, victim.trace_id).items()
    r.hset(f"{prefix}:d:{thief.trace_id}", "dflow/saga/000000000009", stolen)
    DFlow.call("resume", None, thief.trace_id)
    error = _failed(thief)
    assert error["compensation_error"]["type"] == "dflow.errors.PayloadRejectedError"
    assert ledger.of("undo") == [], "nothing is undone blindly"
    victim.cancel()
    _compensated(victim)
    assert ledger.of("undo") == [("victim-booked", victim.trace_id)]


def test_an_entry_copied_to_another_place_of_its_own_run_runs_no_code(on_redis: tuple[str, Any]) -> None:
    prefix, r = on_redis
    ledger = Ledger()
    run = _resumable(ledger, "saga-copy").call("trip")
    _until(lambda: run.info().waiting_for == "resume")
    ((_, entry),) = _entry_fields(prefix, r, run.trace_id).items()
    r.hset(f"{prefix}:d:{run.trace_id}", "dflow/saga/000000000009", entry)  # undo it twice, say a refund
    DFlow.call("resume", None, run.trace_id)
    error = _failed(run)
    assert error["compensation_error"]["type"] == "dflow.errors.PayloadRejectedError"
    assert ledger.of("undo") == [], "an entry is good only where it was written"


def test_a_branch_runs_its_own_compensations_not_its_parents(on_redis: tuple[str, Any]) -> None:
    """A branch's data starts as a copy of its parent's, whose entries are the parent's:
    cancelled, a branch runs its own, and the parent its own, each once."""
    prefix, r = on_redis
    ledger = Ledger()

    def pair(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v)
            .map(lambda x: "left")
            .id("left")
            .compensate(lambda w: ledger.add("undo", w))
            .flat_map(lambda s: DFlow.from_call("never"))
            .id("left-wait"),
            DFlow.just(v).flat_map(lambda s: DFlow.from_call("never")).id("right-wait"),
        ).id("pair")

    run = (
        DFlow.from_call("go")
        .map(lambda v: "parent")
        .id("p1")
        .compensate(lambda w: ledger.add("undo", w))
        .flat_map(pair)
        .id("fork")
        .init(_name("saga-branch-own"))
        .call()
    )
    _until(
        lambda: (
            len(ledger) == 0
            and run.status() is RunStatus.WAITING
            and len([s for s in run.context().steps if s.status is StepStatus.FORKED]) == 1
        )
    )
    (fork,) = [s for s in run.context().steps if s.status is StepStatus.FORKED]
    left, right = (dflow.Run(b) for b in fork.output)
    _until(lambda: left.info().waiting_for == "never" and right.info().waiting_for == "never")
    assert set(_entry_fields(prefix, r, right.trace_id)) == {b"dflow/saga/000000000001"}, (
        "the parent's, copied"
    )
    run.cancel("enough")
    error = _compensated(run)
    assert error["type"] == "dflow.RunCancelled"
    _until(lambda: left.status().finished and right.status().finished)
    assert left.status() is RunStatus.COMPENSATED and right.status() is RunStatus.CANCELLED
    time.sleep(0.1)
    assert sorted(ledger.of("undo")) == ["left", "parent"], "each once, by its own run"


def test_a_step_writing_the_compensating_mark_fails_its_run_with_a_clear_error(backend: str | None) -> None:
    def scribble(ctx: ContextStack, v: Any) -> Any:
        with pytest.raises(dflow.DFlowError, match="dflow's own"):
            ctx.put("dflow/compensating", "not a mark")  # a step cannot
        ctx._changes["dflow/compensating"] = encode("not a mark")  # a writer of the store could
        return v

    ends_well = (
        DFlow.from_call("go")
        .map(scribble)
        .id("w1")
        .map(lambda v: v)
        .id("w2")
        .init(_name("saga-mark"))
        .call(1)
    )
    error = _failed(ends_well, 10)
    assert error["type"] == "dflow.errors.PayloadRejectedError" and "dflow/compensating" in error["message"]
    ends_badly = (
        DFlow.from_call("go").map(scribble).id("x1").map(boom).id("x2").init(_name("saga-mark-fails")).call(1)
    )
    error = _failed(ends_badly, 10)
    assert error["type"] == "ValueError"
    assert error["compensation_error"]["type"] == "dflow.errors.PayloadRejectedError"


# -- reruns ------------------------------------------------------------------------------------


def _trip(ledger: Ledger, hotel_ok: dict[str, bool]) -> Any:
    def hotel(v: str) -> str:
        if not hotel_ok["ok"]:
            raise LookupError("no rooms")
        return f"hotel with {v}"

    return (
        DFlow.from_call("go")
        .map(lambda v: "flight-1")
        .id("flight")
        .compensate(lambda w: ledger.add("undo", w))
        .map(lambda v: "car-1")
        .id("car")
        .compensate(lambda w: ledger.add("undo", w))
        .map(hotel)
        .id("hotel")
        .init(_name("saga-rerun"))
    )


@pytest.mark.usefixtures("local")
def test_a_rerun_of_a_compensated_run_does_not_carry_its_compensations() -> None:
    ledger = Ledger()
    hotel_ok = {"ok": False}
    run = _trip(ledger, hotel_ok).call()
    _compensated(run)
    assert ledger.of("undo") == ["car-1", "flight-1"]
    hotel_ok["ok"] = True
    again = run.rerun_from(1)  # from the first step: everything runs again
    assert again.result(10) == "hotel with car-1"
    assert [k for k in again.context().keys() if k.startswith("dflow/")] == [
        "dflow/rerun",
        "dflow/saga/000000000001",
        "dflow/saga/000000000002",
    ], "its own entries; none of the original's, nor its compensating mark"
    assert ledger.of("undo") == ["car-1", "flight-1"], "nothing more is undone"


@pytest.mark.usefixtures("local")
def test_a_rerun_does_not_replay_steps_its_original_undid() -> None:
    ledger = Ledger()
    hotel_ok = {"ok": False}
    run = _trip(ledger, hotel_ok).call()
    _compensated(run)
    hotel_ok["ok"] = True
    hotel = next(s.seq for s in run.context().steps if s.key == "hotel")
    try:
        again = run.rerun_from(hotel)
        outcome: Any = again.result(10)
    except dflow.DFlowError as exc:
        outcome = exc
    assert outcome != "hotel with car-1", "car-1 was cancelled by the original's compensation"


@pytest.mark.usefixtures("local")
def test_entries_of_nested_branches_reach_the_run() -> None:
    ledger = Ledger()

    def undo(w: str) -> None:
        ledger.add("undo", w)

    def inner(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v).map(lambda x: "inner-ok").id("inner-ok").compensate(undo),
            DFlow.just(v)
            .map(lambda x: "inner-2")
            .id("inner-2")
            .compensate(undo)
            .flat_map(lambda c: DFlow.delay(c, 0.1))
            .id("inner-pause")
            .map(boom)
            .id("inner-fails"),
        ).id("inner")

    def outer(v: Any) -> DFlow[Any]:
        return DFlow.zip(
            DFlow.just(v).map(lambda x: "outer-ok").id("outer-ok").compensate(undo),
            DFlow.just(v).map(lambda x: "outer-1").id("outer-1").compensate(undo).flat_map(inner).id("nest"),
        ).id("outer")

    run = (
        DFlow.from_call("go")
        .map(lambda v: "before")
        .id("before")
        .compensate(undo)
        .flat_map(outer)
        .id("o")
        .init(_name("saga-nested"))
        .call()
    )
    error = _compensated(run)
    assert ledger.of("undo") == ["inner-2", "inner-ok", "outer-1", "outer-ok", "before"], (
        "newest position first"
    )
    assert len(error["compensated"]) == 5
