"""A Kafka worker that holds no partition for a minute says so once, and again when it holds
some: a group with more members than partitions, or one that never settles, runs nothing."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("kafka")

from dflow.adapters.kafka.assignment import AssignmentWatch

log = logging.getLogger("test.kafka.assignment")


def test_a_worker_without_a_partition_for_a_minute_is_told_once_then_when_it_has_one() -> None:
    watch = AssignmentWatch("orders-steps", 4, now=0.0)
    assert [watch.seen(0, t) for t in (1.0, 30.0, 59.0)] == [None, None, None]
    said = watch.seen(0, 61.0)
    assert said is not None and "no partition of topic 'orders-steps' for 61 s" in said
    assert "more members than the topic's 4 partitions" in said and "does not settle" in said
    assert watch.seen(0, 200.0) is None, "said once"
    assert watch.seen(2, 201.0) == "this worker holds 2 partition(s) of topic 'orders-steps' again"
    assert watch.seen(2, 400.0) is None


def test_a_worker_that_holds_partitions_is_not_told_and_a_new_gap_counts_from_its_start() -> None:
    watch = AssignmentWatch("t", 8, now=0.0)
    assert watch.seen(3, 10.0) is None
    assert watch.seen(0, 100.0) is None  # a rebalance: none for now
    assert watch.seen(0, 159.0) is None
    assert watch.seen(0, 161.0) is not None


def test_the_warning_is_logged_at_warning_and_the_recovery_at_info(caplog: pytest.LogCaptureFixture) -> None:
    watch = AssignmentWatch("t", 1, now=0.0, after=5.0)
    with caplog.at_level(logging.INFO, logger=log.name):
        watch.look(0, 6.0, log)
        watch.look(1, 7.0, log)
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.INFO]
    assert caplog.records[0].getMessage().startswith("dflow: this worker has held no partition")
    assert caplog.records[1].getMessage().startswith("dflow: this worker holds 1 partition(s)")
