"""A compensation's row shows its own data: its input is the output of the step it undid,
its output what the compensation returned (in the run's records, ``tree()`` and so the
console and ``dflow inspect``)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import dflow
from dflow import DFlow


def _boom(_: Any) -> None:
    raise ValueError("the hotel is full")


def _refund(charge: dict[str, Any]) -> dict[str, Any]:
    return {"refunded": charge["amount"], "id": f"rf-{charge['id']}"}


@pytest.mark.usefixtures("local")
def test_a_compensation_row_has_the_undone_output_as_input_and_its_own_return_as_output() -> None:
    run = (
        DFlow.from_call("go")
        .map(lambda v: {"id": "c1", "amount": v})
        .id("charge")
        .compensate(_refund)
        .map(_boom)
        .id("hotel")
        .init(f"saga-rows-{uuid.uuid4().hex[:6]}")
        .call(40)
    )
    with pytest.raises(dflow.RunCompensatedError):
        run.result(10)
    (undo,) = [s for s in run.context().steps if (s.name or "").startswith("compensate")]
    assert undo.input == {"id": "c1", "amount": 40}, "what the undone step had output"
    assert undo.output == {"refunded": 40, "id": "rf-c1"}, "what the compensation returned"
    tree = run.tree()
    assert "rf-c1" in tree and "refunded" in tree, tree


@pytest.mark.usefixtures("local")
def test_a_compensation_returning_what_cannot_be_stored_is_noted_and_still_compensates() -> None:
    run = (
        DFlow.from_call("go")
        .map(lambda v: v)
        .id("charge")
        .compensate(lambda v: object())
        .map(_boom)
        .id("hotel")
        .init(f"saga-rows-{uuid.uuid4().hex[:6]}")
        .call(1)
    )
    with pytest.raises(dflow.RunCompensatedError):
        run.result(10)
    (undo,) = [s for s in run.context().steps if (s.name or "").startswith("compensate")]
    assert undo.output == "(not kept: a value of type object, which cannot be stored)"
