"""A value a step cannot hand on is named by where it is and what it is: its path inside the
value (``order.items[2].when``) and its qualified type (``numpy.bool``, not ``bool``)."""

from __future__ import annotations

import pytest

import dflow
from dflow import DFlow
from dflow.errors import SerializationError
from dflow.runtime import Runtime
from dflow.wire.values import encode


class NumpyLikeBool:
    """A stand-in for ``numpy.bool_``, whose class is named ``bool`` in ``numpy``."""


NumpyLikeBool.__module__ = "numpy"
NumpyLikeBool.__qualname__ = "bool"


def test_a_bad_value_nested_in_dicts_and_lists_is_named_by_its_path_and_qualified_type() -> None:
    value = {"order": {"items": [{"when": 1}, {"when": 2}, {"when": NumpyLikeBool()}]}}
    with pytest.raises(SerializationError) as caught:
        encode(value, "the result of step", "ship")
    assert str(caught.value).startswith(
        "the result of step 'ship': the value at order.items[2].when (of type numpy.bool, in a dict) cannot "
        "be serialised"
    ), caught.value


def test_keys_that_are_no_names_are_quoted_and_a_bad_top_value_is_named_by_its_type() -> None:
    with pytest.raises(
        SerializationError, match=r"the value at \[1\]\['x y'\] \(of type object, in a list\)"
    ):
        encode([1, {"x y": object()}])
    with pytest.raises(SerializationError, match=r"value: a value of type numpy.bool cannot be serialised"):
        encode(NumpyLikeBool())


def _bad(x: int) -> dict[str, object]:
    return {"order": {"items": [x, {"when": {1, 2}}]}}


def test_a_step_result_that_cannot_be_stored_fails_the_run_naming_the_path(local: Runtime) -> None:
    run = DFlow.from_call("go").map(_bad).id("pack").init("value-paths").call(1)
    with pytest.raises(
        dflow.RunFailedError, match=r"the value at order.items\[1\].when \(of type set, in a dict\)"
    ):
        run.result(5)
