"""Mocks in local mode: ``pipeline.with_mocks({...})`` runs a flow with fakes in place of the
functions of the named steps (its side effects do not happen), as an object or in a ``with``
block that also mocks the runs the original pipeline starts; a mock of a step the pipeline
does not have names the steps it has."""

from __future__ import annotations

import uuid
from typing import Any
from unittest import mock

import pytest

import dflow
from dflow import ContextStack, DFlow
from dflow.runtime import Runtime

charged: list[int] = []


def charge(order: dict[str, Any]) -> dict[str, Any]:
    charged.append(order["amount"])  # the side effect a test must not cause
    return {**order, "charged": True}


def _orders(name: str | None = None) -> dflow.Pipeline[dict[str, Any]]:
    return (
        DFlow.from_call("order")
        .map(lambda o: {**o, "amount": o["qty"] * 5})
        .id("price")
        .map(charge)
        .id("charge")
        .map(lambda o: {**o, "shipped": True})
        .id("ship")
        .init(name or f"orders-{uuid.uuid4().hex[:6]}")
    )


@pytest.fixture(autouse=True)
def _clean() -> None:
    charged.clear()


def test_a_mocked_pipeline_calls_the_fake_instead_of_the_steps_function(local: Runtime) -> None:
    orders = _orders()
    fake = mock.Mock(side_effect=lambda o: {**o, "charged": "fake"})
    run = orders.with_mocks({"charge": fake}).call({"qty": 2})
    assert run.result(5) == {"qty": 2, "amount": 10, "charged": "fake", "shipped": True}
    fake.assert_called_once_with({"qty": 2, "amount": 10})
    assert charged == [], "the real step did not run"
    assert orders.call({"qty": 1}).result(5)["charged"] is True, "the pipeline itself is not mocked"
    assert charged == [5]


def test_under_a_with_block_the_original_pipelines_runs_are_mocked_and_after_it_not(local: Runtime) -> None:
    orders = _orders()
    with orders.with_mocks({"charge": lambda ctx, o: {**o, "charged": ctx.trace_id}}):
        run = orders.call({"qty": 1})
        entry_run = orders.entry("order").call({"qty": 3})
        assert run.result(5)["charged"] == run.trace_id, "a fake may take the ctx"
        assert entry_run.result(5)["charged"] == entry_run.trace_id
    assert charged == []
    assert orders.call({"qty": 1}).result(5)["charged"] is True
    assert charged == [5]


def test_a_mocked_step_in_a_zip_branch_and_a_just_headed_pipeline(local: Runtime) -> None:
    left = DFlow.just(2).id("l").map(lambda x: x * 100).id("remote")
    right = DFlow.just(3).id("r").map(lambda x: x + 1).id("local-step")
    flow = DFlow.zip(left, right).id("both").map(sum).id("total")
    pipeline = flow.init(f"zipped-{uuid.uuid4().hex[:6]}")
    assert pipeline.with_mocks({"remote": lambda x: -x}).call().result(5) == 2
    assert pipeline.call().result(5) == 204


def test_a_mock_of_an_unknown_step_names_the_steps_there_are(local: Runtime) -> None:
    orders = _orders("orders-for-errors")
    with pytest.raises(dflow.BuildError) as caught:
        orders.with_mocks({"charg": lambda o: o})
    text = str(caught.value)
    assert "pipeline 'orders-for-errors' has no step 'charg' to mock" in text
    assert "'price'" in text and "'charge'" in text and "'ship'" in text


def test_only_callables_mock_only_steps_with_a_function(local: Runtime) -> None:
    orders = _orders("orders-for-kinds")
    with pytest.raises(dflow.BuildError, match="the mock of step 'charge' must be callable, got int"):
        orders.with_mocks({"charge": 3})
    pipeline = DFlow.just(1).id("one").map(lambda x: x).id("two").init(f"j-{uuid.uuid4().hex[:6]}")
    with pytest.raises(dflow.BuildError, match="step 'one' .* is a just: only map and flat_map steps"):
        pipeline.with_mocks({"one": lambda: 2})


def test_a_fake_is_called_as_the_step_would_be_with_its_ctx(local: Runtime) -> None:
    seen: list[str] = []

    def fake(ctx: ContextStack, o: dict[str, Any]) -> dict[str, Any]:
        seen.append(ctx.idempotency_key)
        return o

    run = _orders().with_mocks({"charge": fake}).call({"qty": 1})
    run.result(5)
    assert seen == [f"{run.trace_id}:2"]


def test_an_async_fake_mocks_a_step_and_a_fake_flow_mocks_a_flat_map(local: Runtime) -> None:
    async def fake(o: dict[str, Any]) -> dict[str, Any]:
        return {**o, "charged": "async"}

    assert _orders().with_mocks({"charge": fake}).call({"qty": 1}).result(5)["charged"] == "async"
    expand = (
        DFlow.just(2).id("n").flat_map(lambda n: DFlow.just(n).id("i").map(lambda x: x * 7).id("x")).id("fm")
    )
    pipeline = expand.init(f"expand-{uuid.uuid4().hex[:6]}")
    assert pipeline.with_mocks({"fm": lambda n: DFlow.just(-n).id("stub")}).call().result(5) == -2
    assert pipeline.call().result(5) == 14
