"""Hostile input in local mode: values, ids and messages that must not change what a run
computes, reach another run's data, or make the process import or execute anything."""

from __future__ import annotations

import sys
import time
from typing import Any

import msgpack
import pytest
from pydantic import BaseModel

import dflow
from dflow import DFlow, InvalidTraceIdError, SerializationError
from dflow.wire.values import decode

pytestmark = pytest.mark.usefixtures("local")


def _model_value(name: str, body: Any) -> bytes:
    return msgpack.packb(
        msgpack.ExtType(1, msgpack.packb([name, body], use_bin_type=True)), use_bin_type=True
    )


def test_a_value_never_makes_the_process_import_a_module() -> None:
    assert "dflow_never_imported" not in sys.modules
    with pytest.raises(SerializationError, match="not registered in this process.*register_model"):
        decode(_model_value("dflow_never_imported:Evil", {"x": 1}))
    assert "dflow_never_imported" not in sys.modules
    with pytest.raises(SerializationError, match="not registered"):
        decode(_model_value("os:system", "echo hi"))  # importable, but not a registered model
    with pytest.raises(SerializationError, match="malformed"):
        decode(msgpack.packb(msgpack.ExtType(1, b"\xc1"), use_bin_type=True))


class Invoice(BaseModel):
    total: int


class Secretive(BaseModel):
    note: str


def test_models_named_in_type_hints_or_registered_are_rebuilt() -> None:
    body = _model_value(f"{Invoice.__module__}:{Invoice.__qualname__}", {"total": 3})

    def bill(invoice: Invoice) -> int:  # naming Invoice registers it
        return invoice.total

    DFlow.just(1).map(bill).id("bill")
    assert decode(body) == Invoice(total=3)
    with pytest.raises(SerializationError, match="Secretive"):
        decode(_model_value(f"{Secretive.__module__}:{Secretive.__qualname__}", {"note": "x"}))
    dflow.register_model(Secretive)
    assert decode(_model_value(f"{Secretive.__module__}:{Secretive.__qualname__}", {"note": "x"})).note == "x"
    with pytest.raises(TypeError, match="BaseModel subclass"):
        dflow.register_model(dict)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad, why",
    [
        (42, "is a str, got int"),
        ("", "is empty"),
        ("x" * 129, "129 characters long"),
        ("order\n2", "may only contain"),
        ("order\x1b[2J", "may only contain"),
        ("order 2", "may only contain"),
        ("order/2-0", "only branch runs"),
    ],
)
def test_trace_ids_are_checked_at_every_entry_point(bad: Any, why: str) -> None:
    p = DFlow.from_call("start").map(lambda x: x).id("same").init("ids")
    for start in (
        lambda: p.call(1, trace_id=bad),
        lambda: p.entry("start").call(1, trace_id=bad),
        lambda: DFlow.direct_run(dflow.InitParam(1, trace_id=bad), lambda x: DFlow.just(x)),
    ):
        with pytest.raises(InvalidTraceIdError, match=why):
            start()
    if not (isinstance(bad, str) and "/" in bad and len(bad) < 100):  # a branch's id names a run to call
        with pytest.raises(InvalidTraceIdError):
            DFlow.call("approve", 1, bad)
        with pytest.raises(InvalidTraceIdError):
            dflow.Run(bad)
    assert p.call(1, trace_id="order-2_b.c:d@e").result(5) == 1


def test_a_users_run_can_never_be_a_branch_of_another() -> None:
    # Before, a user's id "<trace>.2-0" was overwritten by the branch of that run's zip.
    r = DFlow.direct_run(
        dflow.InitParam(1, trace_id="order"), lambda x: DFlow.zip(DFlow.just(x), DFlow.just(x))
    )
    assert r.result(5) == [1, 1]
    steps = r.context().steps
    branches = next(s.output for s in steps if s.status is dflow.StepStatus.FORKED)
    assert branches == ["order/2-0", "order/2-1"]
    with pytest.raises(InvalidTraceIdError):
        DFlow.direct_run(dflow.InitParam(1, trace_id="order/2-0"), lambda x: DFlow.just(x))
    assert dflow.Run("order/2-0").result(5) == 1, "a branch can be read by its id"


def test_forged_message_kinds_are_dead_lettered_and_change_nothing() -> None:
    from dflow.client import _current
    from dflow.wire.values import CONTINUE, FAIL, JOIN, Message

    runtime = dflow.current_runtime()
    broker = runtime.transport.broker  # type: ignore[attr-defined]
    r = DFlow.direct_run(5, lambda x: DFlow.delay(x, 0.5).map(lambda v: v * 10).id("times-ten"))
    deadline = time.monotonic() + 5
    while r.status() is not dflow.RunStatus.SLEEPING:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    info = r.info()
    key = "delay>times-ten"

    async def inject() -> None:
        # the timer's own message, early; and a JOIN and a FAIL for the step the run is at
        await runtime.publish(
            [
                Message(r.trace_id, info.seq, key, 0, CONTINUE),
                Message(r.trace_id, info.seq, key, 0, JOIN),
                Message(r.trace_id, info.seq, key, 0, FAIL),
            ]
        )

    t0 = time.monotonic()
    _current().run(inject())
    assert r.result(5) == 50
    assert time.monotonic() - t0 >= 0.3, "the delay was not cut short"
    reasons = [why for _, why in broker.dead_letters]
    assert any("before its due time" in w for w in reasons)
    assert sum("is not the one the run expects" in w for w in reasons) == 2


def test_recursion_that_is_not_a_tail_call_is_stopped_at_a_depth_limit() -> None:
    def deeper(n: int) -> DFlow[int]:
        return DFlow.just(n + 1).flat_map(deeper).id("deeper-and-deeper").map(lambda v: v).id("after")

    with pytest.raises(dflow.RunFailedError, match="nests 1001 flows deep, over the limit of 1000"):
        DFlow.direct_run(0, deeper).result(30)


def test_step_keys_are_limited_in_length() -> None:
    def nest(ids: list[str]) -> Any:
        def build(v: int) -> DFlow[int]:
            if not ids:
                return DFlow.just(v)
            return DFlow.just(v).flat_map(nest(ids[1:])).id(ids[0]).map(lambda w: w).id("then")

        return build

    long_ids = [f"{i}-" + "x" * 200 for i in range(20)]  # distinct ids: no loop folds them
    with pytest.raises(dflow.RunFailedError, match="nests too deep: its step keys would be"):
        DFlow.direct_run(0, nest(long_ids)).result(10)


def test_stored_text_cannot_drive_the_terminal() -> None:
    evil = "\x1b[2J\x1b]0;owned\x07\u202eevil"

    def boom(v: int) -> int:
        raise ValueError(evil)

    r = DFlow.direct_run(
        1, lambda x: DFlow.just(x).map(lambda v: evil).id(f"id{chr(27)}x").map(boom).id("boom")
    )
    with pytest.raises(dflow.RunFailedError):
        r.result(5)
    tree = r.tree()
    assert "\x1b" not in tree and "\x07" not in tree and "\u202e" not in tree
    assert "\\x1b[2J" in tree and "\\u202e" in tree


def test_a_result_whose_class_is_missing_is_shown_as_its_fields() -> None:
    class Local(BaseModel):  # a class no other process could register
        x: int

    r = DFlow.direct_run(1, lambda v: DFlow.just(v).map(lambda w: Local(x=w)).id("local"))
    assert r.result(5) == Local(x=1)
    from dflow.wire.values import _models

    _models.pop(f"{Local.__module__}:{Local.__qualname__}")  # as in a process that lacks it
    tree = r.tree()
    assert "Local(x=1)" in tree and "undecodable" not in tree


def test_zip_branch_counts_are_limited() -> None:
    with pytest.raises(dflow.RunFailedError, match="has 1001 branches, over the limit of 1000: split them"):
        DFlow.direct_run(1, lambda x: DFlow.zip([DFlow.just(i) for i in range(1001)])).result(10)
    # a zip of zips goes past it
    out = DFlow.direct_run(
        1, lambda x: DFlow.zip([DFlow.zip([DFlow.just(i) for i in range(50)]) for _ in range(30)])
    )
    assert len(out.result(30)) == 30


def test_hand_made_values_that_would_explode_in_memory_are_not_decoded() -> None:
    from dflow.wire.values import limits

    dense = b"\xdd" + (2 * 1024 * 1024).to_bytes(4, "big") + b"\x80" * (2 * 1024 * 1024)  # 2M empty maps
    with pytest.raises(SerializationError, match="holds more than one list or map per 8 bytes"):
        decode(dense)
    huge = msgpack.packb("x" * (limits.max_bytes + 1))
    with pytest.raises(SerializationError, match="over the limit"):
        decode(huge)
    honest = msgpack.packb([{"name": f"item {i}", "price": i * 1.5} for i in range(100_000)])
    assert len(honest) > limits.dense_from and len(decode(honest)) == 100_000
