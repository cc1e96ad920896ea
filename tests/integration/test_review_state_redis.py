"""Review of ``State`` and ``Circuit`` on Redis: a client whose clock is off still gets a
right ``retry_after``; odd names and bad versions. This process is the client (no worker)."""

from __future__ import annotations

import time
import types
import uuid
from collections.abc import Iterator

import pytest

import dflow
from dflow import Circuit, CircuitOpenError, State, VersionNotFoundError

from .conftest import SECRET
from .workers import streams_transport


@pytest.fixture(scope="module")
def client(redis_url: str, module_prefix: str) -> Iterator[None]:
    dflow.configure(streams_transport(redis_url, module_prefix), f"{redis_url}?prefix={module_prefix}",
                    secret=SECRET, consume=False)
    try:
        yield
    finally:
        dflow.shutdown()


def test_retry_after_is_measured_by_the_store_clock_not_a_skewed_local_one(
    client: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dflow.circuit as circuit_module

    behind = types.SimpleNamespace(time=lambda: time.time() - 600.0, monotonic=time.monotonic)
    monkeypatch.setattr(circuit_module, "time", behind, raising=False)  # this machine's clock: 10 min behind
    c = Circuit(f"skew-{uuid.uuid4().hex[:8]}", failures=1, cool_down=2.0)
    with pytest.raises(ZeroDivisionError), c:
        _ = 1 / 0
    with pytest.raises(CircuitOpenError) as info:
        c.call(lambda: None)
    assert 0 < info.value.retry_after <= 2.0, f"a retry would wait {info.value.retry_after:.0f}s"


@pytest.mark.parametrize("name", ["a:b", "a*", "*", "ключ:значение", "x" * 200, "a]b[c?", "a:{", ])
def test_odd_names_are_separate_states(client: None, name: str) -> None:
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
