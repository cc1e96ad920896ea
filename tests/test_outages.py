"""An outage of the store or the transport, as the loops that call it see it: a pause that
doubles up to a cap, one line when it starts (with its cause), one when it ends (with how
long it lasted), nothing in between."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dflow.errors import StoreError, TransportError
from dflow.ops.outages import Backoff, Outage, Outages
from dflow.testing import FakeClock


def test_the_pause_doubles_with_each_failure_up_to_its_cap_and_starts_again_after_a_success() -> None:
    backoff = Backoff(base=0.1, cap=2.0)
    pauses = [backoff.next() for _ in range(8)]
    for got, want in zip(pauses, [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]):
        assert want * 0.8 <= got <= want, pauses
    backoff.reset()
    assert backoff.next() <= 0.1


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends_with_its_duration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    outage = Outage("the store", clock)
    caplog.set_level(logging.INFO, logger="dflow.runtime")

    async def outage_of_15s() -> None:
        backoffs = [Backoff() for _ in range(64)]  # as many loops as a worker's consumers
        for _ in range(150):  # 15 s
            for b in backoffs:
                outage.failed(
                    StoreError("cannot reach Redis for the store: Connection refused"), b, "scanning"
                )
            await clock.advance(0.1)
        outage.ok(backoffs[0])

    asyncio.run(outage_of_15s())
    lines = [r.getMessage() for r in caplog.records if r.name == "dflow.runtime"]
    assert len(lines) == 2, lines
    assert lines[0] == (
        "dflow: the store failed (scanning: StoreError: cannot reach Redis for the store: Connection refused); "
        "retrying with backoff (up to 5s), quietly until it works again"
    )
    assert lines[1].startswith(
        "dflow: the store works again after 15.0s (9600 failed calls; it failed with StoreError"
    )
    assert not outage.down
    outage.ok()
    assert len([r for r in caplog.records if r.name == "dflow.runtime"]) == 2, "no outage: nothing to say"


def test_store_and_transport_errors_are_their_own_outages_and_other_errors_none() -> None:
    outages = Outages()
    assert outages.of(StoreError("down")) is outages.store
    assert outages.of(TransportError("down")) is outages.transport
    assert outages.of(ValueError("a bug")) is None
