"""The monad laws, checked with hypothesis, observed as run results in local mode.

left identity    just(a).flat_map(f)          == f(a)
right identity   m.flat_map(just)             == m
associativity    m.flat_map(f).flat_map(g)    == m.flat_map(lambda x: f(x).flat_map(g))
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflow import DFlow

pytestmark = pytest.mark.usefixtures("local")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)

Op = tuple[str, int]
ops = st.lists(st.tuples(st.sampled_from(["add", "wrap", "tag", "const"]), st.integers(-9, 9)), max_size=4)


def apply(op: str, k: int, x: Any) -> Any:
    if op == "add":
        return x + k if isinstance(x, int) and not isinstance(x, bool) else x
    if op == "wrap":
        return [x]
    if op == "tag":
        return {"t": k, "v": x}
    return k


def chain(start: DFlow[Any], program: list[Op], tag: str) -> DFlow[Any]:
    flow = start
    for i, (op, k) in enumerate(program):
        flow = flow.map(functools.partial(apply, op, k)).id(f"{tag}{i}")
    return flow


@st.composite
def flow_functions(draw: st.DrawFn, tag: str) -> Callable[[Any], DFlow[Any]]:
    """A function value -> DFlow: a map chain, a zip of two chains, or a chain after a delay."""
    shape = draw(st.sampled_from(["chain", "zip", "delay"]))
    first, second = draw(ops), draw(ops)

    def f(x: Any) -> DFlow[Any]:
        if shape == "zip":
            return DFlow.zip(
                chain(DFlow.just(x), first, tag + "a"), chain(DFlow.just(x), second, tag + "b")
            ).id(tag + "z")
        if shape == "delay":
            return chain(DFlow.delay(x, 0), first, tag)
        return chain(DFlow.just(x), first, tag)

    f.__qualname__ = f"{tag}:{shape}:{first}:{second}"
    return f


def result(builder: Callable[[Any], DFlow[Any]]) -> Any:
    return DFlow.direct_run(None, builder).result(10)


law_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@law_settings
@given(a=json_values, f=flow_functions("f"))
def test_left_identity(a: Any, f: Callable[[Any], DFlow[Any]]) -> None:
    assert result(lambda _: DFlow.just(a).flat_map(f).id("bind")) == result(lambda _: f(a))


@law_settings
@given(a=json_values, program=ops)
def test_right_identity(a: Any, program: list[Op]) -> None:
    def m() -> DFlow[Any]:
        return chain(DFlow.just(a), program, "m")

    assert result(lambda _: m().flat_map(DFlow.just).id("unit")) == result(lambda _: m())


@law_settings
@given(a=json_values, program=ops, f=flow_functions("f"), g=flow_functions("g"))
def test_associativity(
    a: Any, program: list[Op], f: Callable[[Any], DFlow[Any]], g: Callable[[Any], DFlow[Any]]
) -> None:
    def m() -> DFlow[Any]:
        return chain(DFlow.just(a), program, "m")

    left = result(lambda _: m().flat_map(f).id("bf").flat_map(g).id("bg"))
    right = result(lambda _: m().flat_map(lambda x: f(x).flat_map(g).id("bg")).id("bfg"))
    assert left == right
