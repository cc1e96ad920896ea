"""Circuit breakers made visible: ``Circuit.known()`` lists the circuits used lately with
their state (in memory and on Redis, bounded), ``dflow circuits`` prints them, ``dflow
inspect`` names the circuit that refused a step, and the metrics carry each circuit's state.

The Redis tests use db 13 and a real ``dflow worker`` process, which imports this module for
its flows (``guarded``, ``healthy``) and serves its metrics over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client as prom
import pytest

import dflow
from dflow import Circuit, CircuitOpenError, DFlow, RunFailedError
from dflow.cli import main
from dflow.memory.state import MemoryStateBackend
from dflow.metrics import Metrics
from dflow.runtime import Runtime
from dflow.shared_state import KNOWN_FOR, CircuitConfig, Outcome

if TYPE_CHECKING:
    from tests.support.workers import Cluster

REDIS_URL = "redis://127.0.0.1:6379/13"
GUARDED, HEALTHY = "cv-dep", "cv-ok"  #: the circuits of the worker's flows


def dependency(value: str) -> str:
    if value == "fail":
        raise ConnectionError("the dependency is down")
    return f"ok {value}"


def fell_back(error: BaseException) -> str:
    return type(error).__name__


# the worker's flows: a circuit that opens after 2 failures for 300 s, and one left closed
guarded = (
    DFlow.from_call("cv-guarded")
    .map(dependency)
    .id("dep")
    .circuit(GUARDED, failures=2, window=30, cool_down=300)
    .on_error_return(fell_back)
    .init("cv-guarded")
)
healthy = DFlow.from_call("cv-healthy").map(dependency).id("dep").circuit(HEALTHY).init("cv-healthy")


def _name() -> str:
    return f"cv-{uuid.uuid4().hex[:8]}"


def _until(check: Callable[[], Any], what: str, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return found


# -- local mode ------------------------------------------------------------------------


def test_known_circuits_and_their_metrics_in_local_mode(local: Runtime) -> None:
    registry = prom.CollectorRegistry()
    local.add_observer(Metrics(registry=registry, lag_interval=0.05))
    name, other = _name(), _name()
    breaker = Circuit(name, failures=2, window=30, cool_down=1.5)
    pipeline = (
        DFlow.from_call(name)
        .map(dependency)
        .id("dep")
        .circuit(name, failures=2, window=30, cool_down=1.5)
        .on_error_return(fell_back)
        .init(f"cv-{name}")
    )

    def state() -> float | None:
        return registry.get_sample_value("dflow_circuit_state", {"circuit": name})

    def fast() -> float | None:
        return registry.get_sample_value("dflow_circuit_fast_failures_total", {"circuit": name})

    assert pipeline.call("a").result(10) == "ok a"
    with pytest.raises(ConnectionError):
        Circuit(other).call(dependency, "fail")
    known = {c.name: c for c in Circuit.known()}
    assert known[name].state == "closed" and known[name].config == breaker.config
    assert (known[other].state, known[other].failures, known[other].config) == ("closed", 1, CircuitConfig())
    _until(lambda: state() == 0.0, "the gauge shows the circuit closed")
    assert registry.get_sample_value("dflow_circuit_failures", {"circuit": other}) == 1.0

    assert [pipeline.call("fail").result(10) for _ in range(2)] == ["ConnectionError"] * 2
    assert dflow.gather([pipeline.call(i) for i in range(3)], timeout=10) == ["CircuitOpenError"] * 3
    now = next(c for c in Circuit.known() if c.name == name)
    assert (now.state, now.failures, now.probing) == ("open", 0, False)
    assert now.retry_at == pytest.approx(now.opened_at + 1.5)
    _until(lambda: state() == 2.0, "the gauge shows the circuit open")
    assert fast() == 3.0, "each refused call counted once"
    _until(lambda: state() == 1.0, "after the cool-down: half-open")
    assert pipeline.call("probe").result(10) == "ok probe"
    _until(lambda: state() == 0.0, "the probe's success closed it")
    assert fast() == 3.0

    text = prom.generate_latest(registry).decode()
    assert "# TYPE dflow_circuit_state gauge" in text
    assert f'dflow_circuit_fast_failures_total{{circuit="{name}"}} 3.0' in text


def test_the_memory_backend_lists_the_circuits_used_last_for_a_day(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dflow.memory.state.KNOWN_CIRCUITS", 3)
    clock = [1000.0]
    backend = MemoryStateBackend(clock=lambda: clock[0])
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    config = CircuitConfig(failures=1, cool_down=60)
    for name in ("a", "b", "c", "d"):
        clock[0] += 1
        run(backend.circuit_enter(name, config, "token"))
    run(backend.circuit_record("b", config, "token", False, Outcome.FAILURE))
    clock[0] += 1
    run(backend.circuit_enter("b", CircuitConfig(failures=3), "token"))  # used again: the latest settings
    listed = run(backend.circuit_list())
    assert [c.name for c in listed] == ["b", "c", "d"], "the 3 used last, by name"
    assert (listed[0].snapshot.state, listed[0].config.failures) == ("open", 3)
    assert listed[1].snapshot.state == "closed"
    clock[0] += KNOWN_FOR - 1.5
    assert [c.name for c in run(backend.circuit_list())] == ["b", "d"], "c was last used a day ago"
    clock[0] += 10
    assert run(backend.circuit_list()) == []
    loop.close()


def test_dflow_circuits_says_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("redis")
    monkeypatch.delenv("DFLOW_STORE", raising=False)
    assert main(["circuits"]) == 2
    assert "dflow circuits: --store is required (or set DFLOW_STORE)" in capsys.readouterr().err
    assert main(["circuits", "--store", "redis://127.0.0.1:1/0"]) == 2  # nothing listens there
    assert "dflow circuits: cannot read the circuits of redis://127.0.0.1:1/0: cannot reach Redis" in (
        capsys.readouterr().err
    )


# -- Redis -----------------------------------------------------------------------------


def _redis() -> Any:
    redis = pytest.importorskip("redis")
    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, decode_responses=True)
    try:
        r.ping()
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {REDIS_URL} is not available: {exc}")
        pytest.skip(f"Redis at {REDIS_URL} is not available: {exc}")
    return r


@pytest.fixture
def redis_prefix() -> Iterator[tuple[Any, str]]:
    """A client of db 13 and a fresh key prefix, whose keys are deleted afterwards."""
    r = _redis()
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield r, prefix
    keys = list(r.scan_iter(f"{prefix}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


def test_the_redis_backend_lists_circuits_bounded_under_hash_tagged_keys(
    redis_prefix: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dflow.adapters.redis import RedisStore
    from dflow.shared_state import backend_for

    r, prefix = redis_prefix
    monkeypatch.setattr("dflow.adapters.redis.state.KNOWN_CIRCUITS", 3)
    loop = asyncio.new_event_loop()
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        backend = backend_for(store)
        config = CircuitConfig(failures=1, window=10, cool_down=60)
        for name in ("a", "b", "c", "d"):
            loop.run_until_complete(backend.circuit_enter(name, config, "token"))
        loop.run_until_complete(backend.circuit_record("c", config, "token", False, Outcome.FAILURE))
        loop.run_until_complete(backend.circuit_enter("b", CircuitConfig(failures=2, window=5), "token"))
        listed = loop.run_until_complete(backend.circuit_list())
    finally:
        loop.run_until_complete(store.close())
        loop.close()
    assert [c.name for c in listed] == ["b", "c", "d"], "the 3 used last, by name"
    assert [c.config for c in listed] == [CircuitConfig(failures=2, window=5), config, config]
    assert [c.snapshot.state for c in listed] == ["closed", "open", "closed"]
    assert listed[1].snapshot.retry_at == pytest.approx(listed[1].snapshot.opened_at + 60)
    names, settings = f"{prefix}:{{circuits}}", f"{prefix}:{{circuits}}:config"
    assert r.zrange(names, 0, -1) == ["c", "d", "b"] and set(r.hkeys(settings)) == {"b", "c", "d"}
    assert KNOWN_FOR - 60 < r.ttl(names) <= KNOWN_FOR and KNOWN_FOR - 60 < r.ttl(settings) <= KNOWN_FOR
    assert set(r.scan_iter(f"{prefix}:*")) == {names, settings, f"{prefix}:{{circuit:c}}"}


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[Cluster, str]]:
    """One ``dflow worker`` process running this module's flows on Redis db 13, and the URL
    of the metrics it serves; this process its client."""
    from tests.support.workers import Cluster

    r = _redis()
    prefix = f"t{uuid.uuid4().hex[:10]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = Cluster("tests.test_circuit_visibility", REDIS_URL, prefix, env={"DFLOW_METRICS_PORT": str(port)})
    try:
        c.workers.start(1)
        c.connect()
        yield c, f"http://127.0.0.1:{port}/metrics"
    finally:
        c.close()
        keys = list(r.scan_iter(f"{prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    from tests.support.workers import ROOT

    return subprocess.run(
        [sys.executable, "-m", "dflow.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``dflow ARGS`` in this process: its exit code and output."""
    code = main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.integration  # worker processes
def test_dflow_circuits_inspect_and_worker_metrics_show_an_open_circuit(
    worker: tuple[Cluster, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, metrics_url = worker
    store = cluster.store_url
    assert _main(capsys, "circuits", "--store", store) == (
        0,
        "no circuit breaker was used with this store within the last day\n",
    )

    failed = [guarded.call("fail") for _ in range(2)]
    assert dflow.gather(failed, timeout=30) == ["ConnectionError"] * 2
    refused = guarded.call("late")
    assert refused.result(30) == "CircuitOpenError"
    assert healthy.call("a").result(30) == "ok a"
    with pytest.raises(RunFailedError, match="ConnectionError"):
        healthy.call("fail").result(30)

    table = _cli("circuits", "--store", store)  # (as a user runs it)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["CIRCUIT", "STATE", "FAILURES", "OPENED", "PROBE"]
    row = re.fullmatch(
        r"cv-dep\s+open\s+0/2 in 30s\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+may go in (\d+\.\d)s", lines[1]
    )
    assert row is not None, table.stdout
    assert 250 < float(row.group(1)) <= 300
    assert re.fullmatch(r"cv-ok\s+closed\s+1/5 in 30s\s+-\s+-", lines[2]), table.stdout
    assert len(lines) == 3

    code, out = _main(capsys, "circuits", "--store", store, "--json")
    listed = {c["name"]: c for c in json.loads(out)}
    dep = listed[GUARDED]
    assert (dep["state"], dep["failures"], dep["probing"]) == ("open", 0, False)
    assert dep["config"] == {"failures": 2, "window": 30.0, "cool_down": 300.0, "probe_lease": 30.0}
    assert time.time() - 60 < dep["opened_at"] <= time.time() + 5
    assert dep["retry_at"] == pytest.approx(dep["opened_at"] + 300)
    assert (listed[HEALTHY]["state"], listed[HEALTHY]["failures"]) == ("closed", 1)
    assert [c.name for c in Circuit.known()] == [GUARDED, HEALTHY], "the same list from the library"

    code, tree = _main(capsys, "inspect", refused.trace_id, "--store", store)
    assert code == 0
    assert "dflow.errors.CircuitOpenError: circuit 'cv-dep' is open" in tree
    assert "\ncircuits that failed steps fast (the call was refused, the dependency not called):\n" in tree
    note = re.search(
        r"^  cv-dep: 1 step refused while open; now open \(a probe may go in (\d+\.\d)s\)$",
        tree,
        re.MULTILINE,
    )
    assert note is not None, tree
    assert 250 < float(note.group(1)) <= 300
    code, plain = _main(capsys, "inspect", failed[0].trace_id, "--store", store)
    assert "ConnectionError" in plain and "circuits that failed steps fast" not in plain

    # the worker samples the circuits every 5 s; its own refusals it counts at once
    def sampled() -> str | None:
        text = _metrics(metrics_url)
        return text if f'dflow_circuit_state{{circuit="{GUARDED}"}} 2.0' in text else None

    text = _until(sampled, "the worker's metrics show the circuit open", timeout=20)
    assert f'dflow_circuit_state{{circuit="{HEALTHY}"}} 0.0' in text
    assert f'dflow_circuit_failures{{circuit="{HEALTHY}"}} 1.0' in text
    assert f'dflow_circuit_fast_failures_total{{circuit="{GUARDED}"}} 1.0' in text
    assert f'dflow_circuit_fast_failures_total{{circuit="{HEALTHY}"}}' not in text
    with pytest.raises(CircuitOpenError):
        Circuit(GUARDED, failures=2, window=30, cool_down=300).call(
            dependency, "x"
        )  # refused here, not there
    assert f'dflow_circuit_fast_failures_total{{circuit="{GUARDED}"}} 1.0' in _metrics(metrics_url)
