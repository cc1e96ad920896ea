"""Bad input gets a clear error naming what was wrong, and nothing else breaks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack
import pytest

import dflow
from dflow import (
    BuildError,
    ConfigurationError,
    ContextStack,
    DFlow,
    DuplicateIdError,
    InitParam,
    MissingIdError,
    NotWaitingError,
    RunExistsError,
    RunFailedError,
    RunNotFoundError,
    RunTimeoutError,
    SerializationError,
    UnknownEntryError,
)
from dflow.client import current_runtime
from dflow.testing import MALFORMED_MESSAGES
from tests.support.recorder import recorder


def test_missing_ids_are_named_at_build_time() -> None:
    flow = DFlow.from_call("start").map(lambda x: x).map(str).id("ok").flat_map(lambda x: DFlow.just(x))
    with pytest.raises(MissingIdError) as info:
        flow.init()
    msg = str(info.value)
    assert "map(<lambda>)" in msg and "flat_map(<lambda>)" in msg
    assert "test_errors.py:" in msg, "the message points at the line that built the node"
    assert ".id(" in msg


def test_duplicate_ids_are_named_at_build_time() -> None:
    flow = DFlow.from_call("start").map(len).id("step").map(abs).id("step")
    with pytest.raises(DuplicateIdError, match="id 'step' is used twice.*map\\(len\\).*map\\(abs\\)"):
        flow.init()
    two_zips = DFlow.zip(DFlow.just(1)).flat_map(lambda x: DFlow.zip(DFlow.just(x)))
    with pytest.raises(BuildError):
        two_zips.id("z").map(len).id("zip").init()


def test_bad_arguments_fail_where_the_flow_is_built() -> None:
    with pytest.raises(BuildError, match="takes 3 arguments"):
        DFlow.just(1).map(lambda a, b, c: a)
    with pytest.raises(BuildError, match="needs a function"):
        DFlow.just(1).map(42)  # type: ignore[arg-type]
    with pytest.raises(BuildError, match="may not contain"):
        DFlow.just(1).id("a>b")
    with pytest.raises(BuildError, match="attempts"):
        DFlow.just(1).retry(0)
    with pytest.raises(BuildError, match="seconds"):
        DFlow.just(1).timeout(-1)
    with pytest.raises(BuildError, match="at least one flow"):
        DFlow.zip()
    with pytest.raises(BuildError, match="takes flows"):
        DFlow.any(DFlow.just(1), 2)  # type: ignore[arg-type]
    with pytest.raises(AttributeError, match="immutable"):
        DFlow.just(1)._id = "x"  # type: ignore[misc]


def test_no_runtime_configured() -> None:
    dflow.shutdown()
    with pytest.raises(ConfigurationError, match="global_init_for_test"):
        DFlow.direct_run(1, lambda x: DFlow.just(x))


def test_a_model_without_an_installed_runtime_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model reaches the runtime through its port; with none installed (the runtime
    package installs one when imported) a start says so instead of failing obscurely."""
    from dflow.model import running

    pipeline = DFlow.just(1).id("port").init("errors-port")
    monkeypatch.setattr(running, "_runner", None)
    with pytest.raises(ConfigurationError, match="no dflow runtime is installed to run flows: import dflow"):
        pipeline.call()
    with pytest.raises(ConfigurationError, match="no dflow runtime is installed"):
        DFlow.just(1).map(abs).id("guarded").circuit("errors-port")


@pytest.mark.usefixtures("local")
class TestRunTimeErrors:
    def test_non_serialisable_result_fails_the_run_and_nothing_else(self) -> None:
        good = [
            DFlow.direct_run(i, lambda x: DFlow.delay(x, 0.05).map(lambda v: v + 1).id("inc"))
            for i in range(20)
        ]
        bad = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: object()).id("make-object"))
        with pytest.raises(RunFailedError) as info:
            bad.result(5)
        err = info.value.error
        assert err["type"] == "dflow.errors.SerializationError"
        assert "make-object" in err["message"] and "object" in err["message"]
        assert "pydantic model" in err["message"], "the message says what to return instead"
        assert dflow.gather(good, timeout=5) == list(range(1, 21))

    def test_non_serialisable_context_value(self) -> None:
        def store_socket(ctx: ContextStack, x: int) -> int:
            ctx.put("conn", {1, 2})
            return x

        with pytest.raises(RunFailedError, match="ctx.put\\('conn'\\).*set"):
            DFlow.direct_run(1, lambda x: DFlow.just(x).map(store_socket).id("put")).result(5)

    def test_values_that_encode_but_cannot_be_read_back_fail_the_step_that_made_them(self) -> None:
        made: list[str] = []

        def tuple_keys(x: int) -> dict[Any, int]:
            made.append("tuple_keys")
            return {(x, x): 1}

        r = DFlow.direct_run(
            1, lambda x: DFlow.just(x).map(tuple_keys).id("pairs").map(lambda v: v).id("next")
        )
        with pytest.raises(RunFailedError) as info:
            r.result(5)
        assert info.value.error["step"] == "pairs>next", "the producing step is blamed, not the next"
        assert "dict key of type tuple ((1, 1)) cannot be read back" in info.value.error["message"]
        # as the final value: the run fails; it does not end DONE with a result that cannot be read
        last = DFlow.direct_run(2, lambda x: DFlow.just(x).map(tuple_keys).id("pairs"))
        with pytest.raises(RunFailedError, match="cannot be read back"):
            last.result(5)
        assert last.status() is dflow.RunStatus.FAILED

        def put_pairs(ctx: ContextStack, x: int) -> int:
            ctx.put("pairs", [{("a",): 1}])
            return x

        with pytest.raises(RunFailedError, match=r"ctx.put\('pairs'\).*dict key of type tuple"):
            DFlow.direct_run(1, lambda x: DFlow.just(x).map(put_pairs).id("put")).result(5)

    def test_integers_beyond_64_bits_get_a_message_that_names_the_limit(self) -> None:
        r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: {"n": 2**70}).id("big"))
        with pytest.raises(RunFailedError) as info:
            r.result(5)
        msg = info.value.error["message"]
        assert (
            "the integer 1180591620717411303424 is outside msgpack's 64-bit range (-2**63 .. 2**64-1)" in msg
        )
        assert "pass it as a string" in msg and "use msgpack data" not in msg.lower()

    def test_non_serialisable_parameter_is_refused_before_the_run_starts(self) -> None:
        p = DFlow.from_call("start").init("p")
        with pytest.raises(SerializationError, match="parameter of entry 'start'"):
            p.call(object())

    def test_unknown_entry(self) -> None:
        p = DFlow.from_call("start").map(len).id("len").init("sizes")
        with pytest.raises(
            UnknownEntryError, match="pipeline 'sizes' has no entry 'begin'; its entries: 'start'"
        ):
            p.entry("begin")

    def test_call_to_a_finished_or_unknown_run(self) -> None:
        r = DFlow.direct_run(1, lambda x: DFlow.just(x))
        r.result(5)
        with pytest.raises(NotWaitingError, match=f"run '{r.trace_id}' has finished"):
            DFlow.call("approve", "yes", r.trace_id)
        with pytest.raises(RunNotFoundError, match="no-such-trace"):
            DFlow.call("approve", "yes", "no-such-trace")
        assert DFlow.direct_run(2, lambda x: DFlow.just(x)).result(5) == 2

    def test_call_before_the_run_reaches_from_call_is_refused_with_if_waiting(self) -> None:
        r = DFlow.direct_run(
            1, lambda x: DFlow.delay(x, 0.3).flat_map(lambda v: DFlow.from_call("late")).id("fm")
        )
        with pytest.raises(NotWaitingError, match="not waiting for call 'late'.*on_init"):
            DFlow.call("late", 1, r.trace_id, if_waiting=True)
        with pytest.raises(RunTimeoutError):
            r.result(0.5)
        DFlow.call("late", "now", r.trace_id)
        assert r.result(5) == "now"

    def test_flat_map_returning_something_else(self) -> None:
        with pytest.raises(RunFailedError, match="must be a DFlow, got int"):
            DFlow.direct_run(1, lambda x: DFlow.just(x).flat_map(lambda v: v + 1).id("fm")).result(5)

    def test_flat_map_returning_a_flow_without_ids(self) -> None:
        with pytest.raises(RunFailedError, match="MissingIdError.*map\\(<lambda>\\)"):
            DFlow.direct_run(1, lambda x: DFlow.just(x).map(lambda v: v)).result(5)

    def test_duplicate_trace_id(self) -> None:
        DFlow.direct_run(InitParam(1, trace_id="once"), lambda x: DFlow.just(x)).result(5)
        with pytest.raises(RunExistsError, match="'once' already exists"):
            DFlow.direct_run(InitParam(2, trace_id="once"), lambda x: DFlow.just(x))

    def test_result_timeout_leaves_the_run_going(self) -> None:
        r = DFlow.direct_run(7, lambda x: DFlow.delay(x, 0.4))
        with pytest.raises(RunTimeoutError, match="did not finish within 0.05s"):
            r.result(0.05)
        assert r.result(5) == 7

    def test_garbage_on_the_transport_is_dead_lettered_and_serving_goes_on(self) -> None:
        runtime = current_runtime()
        broker = runtime.transport.broker  # type: ignore[attr-defined]

        bad = [
            b"\x00\x01 not msgpack",
            b"\x93\x01\x02\x03",  # msgpack, wrong shape
            msgpack.packb(["t", 1, "k", None, 0]),  # the right shape with a wrong value: once looped
            msgpack.packb({1: "t", 2: 1, 3: "k", 4: 0, 5: 0}),
        ]

        async def inject() -> None:
            for body in bad:
                await runtime.transport.publish(body, "x")

        from dflow.client import _current

        _current().run(inject())
        assert DFlow.direct_run(5, lambda x: DFlow.just(x).map(lambda v: v * 2).id("d")).result(5) == 10
        deadline = time.monotonic() + 5
        while len(broker.dead_letters) < len(bad) and time.monotonic() < deadline:
            time.sleep(0.01)
        reasons = [reason for _, reason in broker.dead_letters]
        assert len(reasons) == len(bad) and all("not a dflow step message" in r for r in reasons)

    def test_a_stale_duplicate_message_is_dropped(self) -> None:
        # Deliver a step's message twice: the step runs and commits once.
        runs = recorder()

        async def slow(x: int) -> int:
            runs.append(x)
            await asyncio.sleep(0.05)
            return x

        r = DFlow.direct_run(1, lambda x: DFlow.just(x).map(slow).id("slow").map(lambda v: v).id("after"))
        r.result(5)
        runtime = current_runtime()
        from dflow.client import _current
        from dflow.wire.values import Message

        _current().run(runtime.publish([Message(r.trace_id, 1, "slow>after")]))
        time.sleep(0.2)
        assert runs == [1]
        assert [s.key for s in r.context().steps].count("slow>after") == 1


def test_result_of_unknown_run(local: Any) -> None:
    with pytest.raises(RunNotFoundError):
        dflow.Run("nope").result(1)


def test_timeout_and_in_thread_only_on_steps_that_run_functions() -> None:
    with pytest.raises(BuildError, match="timeout applies to map and flat_map"):
        DFlow.from_call("approve").timeout(5)
    with pytest.raises(BuildError, match="in_thread applies"):
        DFlow.delay(1, 1).in_thread()


def test_entry_with_on_init_is_refused() -> None:
    with pytest.raises(BuildError, match="on_init, which would never run"):
        DFlow.from_call("start", on_init=lambda ctx: None).init()


@pytest.mark.parametrize("name,body", MALFORMED_MESSAGES, ids=[n for n, _ in MALFORMED_MESSAGES])
def test_only_exact_step_messages_decode(name: str, body: bytes) -> None:
    from dflow.wire.values import Message

    with pytest.raises(SerializationError, match="not a dflow step message"):
        Message.decode(body)


def test_a_step_message_decodes_to_itself() -> None:
    from dflow.wire.values import Message

    for m in [Message("t", 1, "k", 0, 3), Message("a/3-1/0-2", 2**53 - 1, "思考>loop/agent", 300, 0)]:
        assert Message.decode(m.encode()) == m
