"""Shared ``State`` and ``Circuit`` on Redis, used by three real ``dflow worker`` processes
(``state_app``) with this process as their client; and the Redis backend's own edges
(rollback, probe leases, keys, odd names and bad versions, a client whose clock is off)
driven from here."""

from __future__ import annotations

import itertools
import time
import types
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

import dflow
from dflow import Circuit, CircuitOpenError, ConflictError, State, VersionNotFoundError
from tests.support.workers import Cluster

from .apps import state_app


@pytest.fixture(scope="module")
def cluster(redis_url: str, module_prefix: str) -> Iterator[Cluster]:
    c = Cluster(
        "tests.integration.apps.state_app",
        redis_url,
        module_prefix,
        env={"DFLOW_TEST_REDIS": redis_url, "DFLOW_TEST_PREFIX": module_prefix},
    )
    try:
        c.workers.start(3)
        c.connect()
        yield c
    finally:
        c.close()


def test_fifty_runs_on_three_workers_count_to_exactly_one_thousand(cluster: Cluster) -> None:
    name = f"counter-{uuid.uuid4().hex[:8]}"
    value = {"name": name, "history": 1000}  # every version kept: the whole history is checked
    runs = [state_app.count_pipeline.call(value) for _ in range(50)]
    dflow.gather(runs, timeout=120)
    state = State(name, history=1000, max_bytes=1024)
    assert state.get() == (1000, 1000)

    history = state.history()
    assert [v.version for v in history] == list(range(1000, 0, -1))
    assert all(v.value == v.version for v in history), "each version is the one before plus one"
    assert all(a.at >= b.at for a, b in itertools.pairwise(history)), "written in the order of their versions"
    by_run = Counter(v.run for v in history)
    assert by_run == {r.trace_id: 20 for r in runs}, "each run wrote 20 versions"
    assert len({(v.run, v.step) for v in history}) == 1000, "each step of each run wrote once"
    workers = {rec.worker.rsplit(":", 1)[0] for r in runs[:10] for rec in r.context().steps if rec.worker}
    assert len(workers) == 3, f"the steps ran on the three worker processes: {workers}"

    # a rollback restores an older value as a new version, written by this process
    assert state.rollback(990) == 1001
    assert state.get() == (990, 1001)
    newest = state.history()[0]
    assert (newest.version, newest.value, newest.restores, newest.run, newest.step) == (
        1001,
        990,
        990,
        "external",
        None,
    )
    kept = State(name, history=3)  # a write trims what is kept to the writer's history
    kept.set(7)
    assert [v.version for v in kept.history()] == [1002, 1001, 1000]
    with pytest.raises(VersionNotFoundError, match="versions 1000 to 1002 are kept"):
        kept.rollback(999)
    with pytest.raises(ConflictError) as info:
        kept.set(8, expect=1001)
    assert info.value.version == 1002


def test_a_circuit_shared_by_three_workers(cluster: Cluster) -> None:
    r = cluster.r
    p = cluster.prefix
    calls = f"{p}:dep-calls"
    circuit = Circuit("dep", state_app.FAILURES, state_app.WINDOW, state_app.COOL_DOWN)
    guarded = state_app.guarded_pipeline

    r.set(f"{p}:mode", "fail")
    first = dflow.gather([guarded.call(i) for i in range(state_app.FAILURES)], timeout=20)
    assert [x.split("@")[0] for x in first] == ["RuntimeError"] * 5
    assert int(r.get(calls) or 0) == 5
    opened = circuit.state()
    assert opened.state == "open"

    # open: every worker fails fast, the dependency is not called
    rejected = dflow.gather([guarded.call(i) for i in range(15)], timeout=20)
    assert time.time() < opened.retry_at, "the machine is too slow: these runs outlasted the cool-down"
    assert {x.split("@")[0] for x in rejected} == {"CircuitOpenError"}
    assert len({x.split("@")[1] for x in rejected}) >= 2, f"rejected by several workers: {rejected}"
    assert int(r.get(calls) or 0) == 5

    # after the cool-down, one probe at a time across all workers; its success closes
    r.set(f"{p}:mode", "hold")  # the probe waits in the dependency until released
    time.sleep(max(0.0, circuit.state().retry_at - time.time()) + 0.1)
    probing = [guarded.call(i) for i in range(8)]
    _until(lambda: sum(run.status().finished for run in probing) == 7, "seven of the eight runs end")
    seen = circuit.state()
    assert (seen.state, seen.probing) == ("half_open", True)
    assert int(r.get(calls) or 0) == 6, "exactly one probe reached the dependency"
    r.set(f"{p}:release", 1)
    results = dflow.gather(probing, timeout=30)
    assert sorted(x.split("@")[0] for x in results) == ["CircuitOpenError"] * 7 + ["ok"]
    assert circuit.state().state == "closed"

    r.set(f"{p}:mode", "ok")
    assert {x.split("@")[0] for x in dflow.gather([guarded.call(i) for i in range(6)], timeout=20)} == {"ok"}
    assert int(r.get(calls) or 0) == 12
    assert not list(r.scan_iter(f"{p}:{{circuit:dep}}*")), "a closed circuit leaves no keys"


def test_a_probe_lease_runs_out_when_its_holder_is_gone(cluster: Cluster) -> None:
    """A prober that never reports (its process died) holds the circuit for its lease only;
    its late report then counts for nothing."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    circuit = Circuit(name, failures=1, cool_down=0.2, probe_lease=1.5)
    with pytest.raises(RuntimeError), circuit:
        raise RuntimeError("down")
    time.sleep(0.25)
    dead = circuit.__enter__()  # the probe of a process that dies: never left
    assert dead is circuit and circuit.state().probing
    with pytest.raises(CircuitOpenError) as info:
        circuit.call(lambda: None)
    assert info.value.state == "half_open" and 0 < info.value.retry_after <= 1.5
    time.sleep(info.value.retry_after + 0.05)
    assert circuit.call(lambda: "probed") == "probed"  # a new probe, whose success closes
    assert circuit.state().state == "closed"
    circuit.__exit__(RuntimeError, RuntimeError("late"), None)  # the dead probe's late failure
    assert circuit.state().state == "closed"


def test_state_keys_are_hash_tagged_by_name(cluster: Cluster, redis_url: str) -> None:
    name = f"tagged:{uuid.uuid4().hex[:8]}"
    State(name).set({"a": 1})
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.type(f"{cluster.prefix}:{{state:{name}}}") == b"list"
    finally:
        r.close()
    with pytest.raises(ValueError, match="'{'"):
        State("a{b}")


def test_a_step_on_a_worker_sees_what_this_process_wrote(cluster: Cluster) -> None:
    name = f"seen-{uuid.uuid4().hex[:8]}"
    State(name).set(41)
    run = state_app.add_pipeline.call(name)
    assert run.result(20) == 42
    assert State(name).get() == (42, 2)
    assert State(name).history()[0].run == run.trace_id


def _until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_retry_after_is_measured_by_the_store_clock_not_a_skewed_local_one(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dflow.patterns.circuit as circuit_module

    behind = types.SimpleNamespace(time=lambda: time.time() - 600.0, monotonic=time.monotonic)
    monkeypatch.setattr(circuit_module, "time", behind, raising=False)  # this machine's clock: 10 min behind
    c = Circuit(f"skew-{uuid.uuid4().hex[:8]}", failures=1, cool_down=2.0)
    with pytest.raises(ZeroDivisionError), c:
        _ = 1 / 0
    with pytest.raises(CircuitOpenError) as info:
        c.call(lambda: None)
    assert 0 < info.value.retry_after <= 2.0, f"a retry would wait {info.value.retry_after:.0f}s"


@pytest.mark.parametrize(
    "name",
    [
        "a:b",
        "a*",
        "*",
        "ключ:значение",
        "x" * 200,
        "a]b[c?",
        "a:{",
    ],
)
def test_odd_names_are_separate_states(cluster: Cluster, name: str) -> None:
    if "{" in name:
        with pytest.raises(ValueError, match="'{'"):
            State(name)
        return
    tag = uuid.uuid4().hex[:6]
    full = (name + tag)[-200:]
    s, other = State(full), State(full + "x" if len(full) < 200 else full[:-1])
    assert s.set({"v": 1}) == 1 and other.get() == (None, 0)
    assert s.set({"v": 2}) == 2 and s.rollback(1) == 3
    assert s.get() == ({"v": 1}, 3) and [v.restores for v in s.history()] == [1, None, None]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="version number"):
            s.rollback(bad)
    for unknown in (4, 2**70):
        with pytest.raises(VersionNotFoundError, match="versions 1 to 3 are kept"):
            s.rollback(unknown)
