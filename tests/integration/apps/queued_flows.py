"""A flow with a step on the ``gpu`` task queue, for ``dflow worker`` processes started with
and without ``--queues gpu`` (``test_queues_distributed``)."""

from __future__ import annotations

from dflow import DFlow

queued = (
    DFlow.from_call("queued")
    .map(lambda x: x + 1)
    .id("prep")
    .map(lambda x: x * 10)
    .id("on-gpu")
    .queue("gpu")
    .map(lambda x: x + 2)
    .id("after")
    .init("queued")
)
