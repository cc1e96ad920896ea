"""Run listings in local mode: the pipeline that starts a run is recorded and filters it, the
runs a flow forks are not listed, and the in-memory listings stay right through many moves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

import dflow
from dflow import DFlow, RunInfo, RunStatus
from dflow.client import _current
from dflow.server.runs import start_in_session

pytestmark = pytest.mark.usefixtures("local")
T = TypeVar("T")


def _on_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the runtime's loop, which the in-memory store belongs to."""
    return _current().run(coro)


def _store() -> dflow.Store:
    return dflow.current_runtime().store


def _page(status: RunStatus | None = None, pipeline: str | None = None) -> list[str]:
    page = _on_loop(_store().page_runs(100, status=status, pipeline=pipeline))
    assert page.cursor is None
    return [r.trace_id for r in page.runs]


def test_the_pipeline_that_starts_a_run_is_recorded_however_it_is_started() -> None:
    approve = (
        DFlow.from_call("listing-approve").map(lambda x: x + 1).id("listing-inc").init("listing-approvals")
    )
    plain = DFlow.just(1).map(lambda x: x * 2).id("listing-double").init()  # named after its head key
    by_entry = approve.entry("listing-approve").call(1)
    by_call = approve.call(2)
    by_head = plain.call()
    direct = DFlow.direct_run(3, lambda x: DFlow.just(x).map(lambda v: v).id("listing-same"))
    in_session = asyncio.run(start_in_session(approve, 4, "session-1"))
    for run in (by_entry, by_call, by_head, direct, in_session):
        run.result(5)
    assert (
        by_entry.info().pipeline
        == by_call.info().pipeline
        == in_session.info().pipeline
        == "listing-approvals"
    )
    assert by_head.info().pipeline == plain.name and plain.name
    assert direct.info().pipeline is None
    assert set(_page(pipeline="listing-approvals")) == {
        by_entry.trace_id,
        by_call.trace_id,
        in_session.trace_id,
    }
    assert _page(pipeline=plain.name) == [by_head.trace_id]
    assert set(_page(status=RunStatus.DONE)) == {
        r.trace_id for r in (in_session, direct, by_head, by_call, by_entry)
    }
    counts = _on_loop(_store().count_runs(pipeline="listing-approvals"))
    assert counts[RunStatus.DONE] == 3 and sum(counts.values()) == 3


def test_the_runs_a_flow_forks_are_reached_through_it_not_listed() -> None:
    fan = (
        DFlow.just(2)
        .flat_map(
            lambda x: DFlow.zip(
                [DFlow.just(x + i).map(lambda v: v * v).id("listing-square") for i in range(3)]
            )
        )
        .id("listing-fan")
        .init("listing-fans")
    )
    run = fan.call()
    assert run.result(5) == [4, 9, 16]
    ids = [f"{run.trace_id}/{seq}-{i}" for seq in range(8) for i in range(3)]  # (the fork's seq, its index)
    branches: list[RunInfo] = [b for b in (_on_loop(_store().get_run(t)) for t in ids) if b is not None]
    assert [b.parent for b in branches] == [run.trace_id] * 3, "the branches exist"
    assert _page(pipeline="listing-fans") == [run.trace_id]
    assert not {b.trace_id for b in branches} & set(_page())


def test_a_waiting_run_is_listed_as_waiting_until_it_is_answered() -> None:
    p = (
        DFlow.from_call("listing-order")
        .flat_map(
            lambda order: DFlow.from_call("listing-pay").map(lambda paid: [order, paid]).id("listing-both")
        )
        .id("listing-wait")
        .init("listing-orders")
    )
    run = p.call("book")
    deadline = time.monotonic() + 5
    while run.status() is not RunStatus.WAITING:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _page(status=RunStatus.WAITING, pipeline="listing-orders") == [run.trace_id]
    DFlow.call("listing-pay", 10, run.trace_id)
    assert run.result(5) == ["book", 10]
    assert _page(status=RunStatus.WAITING, pipeline="listing-orders") == []
    assert _page(status=RunStatus.DONE, pipeline="listing-orders") == [run.trace_id]


def test_a_start_time_is_read_as_iso_8601_in_utc_unless_it_has_an_offset() -> None:
    from dflow.run_pages import parse_started

    assert parse_started("after", "2026-12-02") == 1_796_169_600.0
    assert parse_started("after", "2026-12-02T14:30") == 1_796_169_600.0 + 14.5 * 3600
    assert parse_started("after", " 2026-12-02 15:30:00+01:00 ") == 1_796_169_600.0 + 14.5 * 3600
    assert parse_started("after", "2026-12-02T14:30:00.250Z") == 1_796_169_600.0 + 14.5 * 3600 + 0.25
    with pytest.raises(
        ValueError, match=r"before '14h30' is not a time: give a date and time as 2026-12-02T14:30"
    ):
        parse_started("before", "14h30")


def test_a_window_holds_the_runs_started_from_its_start_and_before_its_end_by_the_millisecond() -> None:
    from dflow.run_pages import StartedWindow

    window = StartedWindow(10.0, 20.0)
    assert [window.holds(t) for t in (9.9989, 10.0, 10.0004, 19.9995, 20.0, 20.5)] == [
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert StartedWindow().holds(0.0) and not StartedWindow().bounded and window.bounded


def test_a_sort_is_newest_or_oldest_first_and_any_other_is_refused_naming_the_choices() -> None:
    from dflow.run_pages import parse_sort

    assert (parse_sort(None), parse_sort("newest"), parse_sort("oldest")) == (False, False, True)
    for bad in ("Oldest", "asc", "", "x" * 100):
        with pytest.raises(ValueError, match=r"is not an order of the runs list: use one of newest, oldest"):
            parse_sort(bad)


def test_a_window_read_oldest_first_starts_at_its_start_and_stops_at_its_end() -> None:
    from dflow.run_pages import StartedWindow, decode_cursor

    window = StartedWindow(10.0, 20.0)
    first = window.first_cursor(oldest_first=True)
    assert first is not None and decode_cursor(first, oldest_first=True) == (10_000, "\x00")
    assert StartedWindow(None, 20.0).first_cursor(oldest_first=True) is None
    assert [window.keeps(t, oldest_first=True) for t in (5.0, 19.9995, 20.0)] == [True, True, False]
    with pytest.raises(ValueError, match="newest first, not oldest first"):
        decode_cursor(StartedWindow(None, 20.0).first_cursor() or "", oldest_first=True)


def test_a_search_by_id_with_filters_finds_the_runs_that_pass_them_past_the_first_the_id_starts() -> None:
    from dflow.run_pages import ANY_TIME, find_in_window

    p = (
        DFlow.from_call("listing-ship")
        .flat_map(lambda order: DFlow.from_call("listing-paid").map(lambda paid: paid).id("listing-got"))
        .id("listing-shipping")
        .init("listing-ships")
    )
    runs = [p.call(i, trace_id=f"order-{i:02d}") for i in range(30)]
    deadline = time.monotonic() + 10
    while any(r.status() is not RunStatus.WAITING for r in runs):
        assert time.monotonic() < deadline, "the runs did not all come to wait"
        time.sleep(0.01)
    for run in runs[:25]:  # the first 25 in id order end; the last 5 still wait
        run.cancel("shipped elsewhere")
    while any(r.status() is not RunStatus.CANCELLED for r in runs[:25]):
        assert time.monotonic() < deadline, "the runs were not all cancelled"
        time.sleep(0.01)

    waiting = _on_loop(find_in_window(_store(), "order-", 10, ANY_TIME, status=RunStatus.WAITING))
    assert [r.trace_id for r in waiting] == [f"order-{i}" for i in range(25, 30)]
    two = _on_loop(find_in_window(_store(), "order-", 2, ANY_TIME, status=RunStatus.WAITING))
    assert [r.trace_id for r in two] == ["order-25", "order-26"], "read on past the first reads"
    firsts = _on_loop(find_in_window(_store(), "order-", 3, ANY_TIME))
    assert [r.trace_id for r in firsts] == ["order-00", "order-01", "order-02"], "unfiltered: in id order"
