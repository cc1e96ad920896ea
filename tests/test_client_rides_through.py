"""The client rides through a store that cannot be reached for a while: waits for a run try
again until their deadline (a store error that is not transient is raised at once), and
``configure(..., check=True)`` says at once which of the store and the transport does not
answer, its URL redacted."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

import dflow
from dflow import RunInfo, RunStatus
from dflow.errors import ConfigurationError, RunTimeoutError, StoreError, StoreUnavailableError
from dflow.memory.store import MemoryStore
from dflow.runtime.waits import wait_through_outages
from dflow.testing import FakeClock
from dflow.wire.values import encode


class Flaky(MemoryStore):
    """A store whose waits fail with ``error`` the first ``failures`` times."""

    def __init__(self, failures: int, error: StoreError) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.calls = 0

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return [RunInfo(t, RunStatus.DONE, 1, 0.0, 0.0, raw_result=encode(42)) for t in trace_ids]


def _waited(store: Flaky, timeout: float | None, clock: FakeClock) -> Any:
    async def go() -> Any:
        task = asyncio.ensure_future(wait_through_outages(store, ["r1"], timeout, clock))
        while not task.done():
            await asyncio.sleep(0)
            await clock.advance(0.05)
        return task.result()

    return asyncio.run(go())


def test_a_wait_rides_through_a_store_that_cannot_be_reached_for_a_while() -> None:
    clock = FakeClock()
    store = Flaky(20, StoreUnavailableError("cannot reach Redis for the store: Connection refused"))
    start = clock.monotonic()
    (info,) = _waited(store, 60.0, clock)
    assert info.result == 42 and store.calls == 21
    assert clock.monotonic() - start < 60, "the pauses are capped"


def test_a_wait_whose_deadline_passes_in_an_outage_names_the_stores_error() -> None:
    store = Flaky(10**6, StoreUnavailableError("cannot reach Redis for the store: Connection refused"))
    with pytest.raises(
        RunTimeoutError, match=r"within 5.0s: the store could not be reached meanwhile \(Store"
    ):
        _waited(store, 5.0, FakeClock())


def test_a_store_error_that_is_not_transient_is_raised_at_once() -> None:
    store = Flaky(1, StoreError("Redis store error: WRONGTYPE"))
    with pytest.raises(StoreError, match="WRONGTYPE"):
        _waited(store, 60.0, FakeClock())
    assert store.calls == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_configure_with_check_says_which_part_cannot_be_reached_with_its_url_redacted() -> None:
    pytest.importorskip("redis")
    port = _closed_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with pytest.raises(ConfigurationError) as caught:
        dflow.configure(url, url, consume=False, check=True, secret="x" * 32)
    text = str(caught.value)
    assert text.startswith(f"cannot reach the store redis://:***@127.0.0.1:{port}/0: "), text
    assert "hunter2" not in text
    with pytest.raises(ConfigurationError, match="no dflow runtime is configured"):
        dflow.current_runtime()
