"""Runs stored by an earlier release go on with today's code.

tests/data/compat/<version>/ holds, per fixture, one step of a run as that release's store
handed it to a worker: its signed frames record, the signed flow blobs they refer to
(cloudpickle: they name dflow's classes and functions by the module paths of that release),
its value and data (saga entries holding pickled compensations, a rerun's link, pydantic
models). ``tests/support/compat_writer.py`` wrote them with that release. Each test
recreates the run in a local-mode store, lets today's runtime carry it on (answering the
calls it waits for), and checks that it ends as it ended when it was written: same status,
same result, same side effects from that step on.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import dflow
from dflow import DFlow, RunStatus
from dflow.memory import MemoryStore, MemoryTransport
from dflow.model.chains import MOVED_MODULES, _Unpickler
from dflow.patterns.rerun import RERUN_KEY, link_of
from dflow.runtime.process import _current
from dflow.store import Frames, NewRun
from dflow.wire.values import Message, decode
from tests.support import compat_flows as flows

ROOT = Path(__file__).resolve().parent / "data" / "compat"
FIXTURES = sorted(ROOT.glob("*/*.msgpack"))
#: the step records of a run as a release's Redis store keeps them (tests/support/records_writer.py)
RECORDS = sorted((ROOT / "records").glob("*.records"))


def _read(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(path.read_bytes(), raw=False)
    return out


@pytest.fixture
def deployment() -> Iterator[dflow.Runtime]:
    """Local mode signing with the key the fixtures were written with (a deployment's
    DFLOW_SECRET), the compat flows' process state reset."""
    flows.LOG.clear()
    flows._FAILED_ONCE.clear()
    flows.BROKEN["rerun"] = False  # the rerun's fix is deployed
    transport = MemoryTransport()
    runtime = dflow.configure(
        transport, MemoryStore(transport=transport), secret=flows.SECRET, poll_interval=0.005
    )
    yield runtime
    dflow.shutdown()


async def _recreate(runtime: dflow.Runtime, f: dict[str, Any]) -> None:
    """Put the stored run back into a store, as it was when its step was handed out, and
    dispatch that step."""
    blobs: dict[str, bytes] = f["blobs"]
    run = NewRun(
        f["trace_id"],
        Frames(f["frames"], tuple(sorted(blobs)), dict(blobs)) if f["frames"] is not None else None,
        f["value"],
        Message(*f["message"]),
        data=dict(f["data"]),
        pipeline=f["pipeline"],
    )
    await runtime.publish(await runtime.store.create_run(run))


def _wait_for(run: dflow.Run[Any], status: RunStatus, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while run.status() is not status:
        assert time.monotonic() < deadline, (
            f"the run did not come to {status.value} (it is {run.status().value})"
        )
        time.sleep(0.005)


def test_there_are_fixtures_of_the_release_before_the_layout() -> None:
    names = {p.stem for p in FIXTURES if p.parent.name == "0.2.0"}
    assert names == {"kitchen", "saga_entries", "saga_undo", "direct_run", "rerun"}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_stored_run_goes_on_to_the_end_it_had_when_it_was_written(
    path: Path, deployment: dflow.Runtime
) -> None:
    f = _read(path)
    trace = f["trace_id"]
    _current().run(_recreate(deployment, f))
    run: dflow.Run[Any] = dflow.Run(trace)
    for call_type, payload in f["calls"]:
        _wait_for(run, RunStatus.WAITING)
        DFlow.call(call_type, payload, trace)
    deadline = time.monotonic() + 30
    while not run.status().finished:
        assert time.monotonic() < deadline, f"run {trace} of {path.stem} did not end: {run.tree()}"
        time.sleep(0.005)
    info = run.info()
    assert info.status.value == f["status"], run.tree()
    if f["result"] is not None:
        assert decode(info.raw_result) == decode(f["result"])  # pydantic models compare by value
    if f["error_type"] is not None:
        assert info.error is not None and info.error["type"] == f["error_type"]
    assert [what for run_id, what in flows.LOG if run_id == trace] == f["log"], "the steps' side effects"
    if f["name"] == "rerun":
        link = link_of(f["data"][RERUN_KEY])
        assert link is not None and link.trace_id == f["rerun_of"] and link.run == trace


def test_the_kitchen_fixture_ends_with_what_every_node_kind_and_modifier_made() -> None:
    """The expected result is worked out by hand, so that a fixture whose flow went wrong
    when it was written cannot pass as the reference."""
    f = _read(ROOT / "0.2.0" / "kitchen.msgpack")
    # answer 4 + qty 3 = 7, + the closure's 30 = 37, doubled 74, + 1 in a thread 75, flaky
    # then retried 75, broken and recovered 76, broken and fallen back to alt 77, guarded
    # 80, the shared counter 1080; zip: 1085, 1080 after the delay, len("compat.greeter")
    # 14: sum 2179; any: a1 fails, a2 doubles: 4358
    assert decode(f["result"]) == {
        "total": 4358,
        "order": flows.Order(item="widget", qty=3),
        "greeter": "compat.greeter",
    }


def test_the_module_paths_old_blobs_name_are_gone_and_load_through_the_alias_table() -> None:
    """What makes the old blobs load is the table: their modules no longer exist, and each
    old path resolves to the same object under its new one."""
    unpickler = _Unpickler(io.BytesIO(b""))
    for old, new in MOVED_MODULES.items():
        assert importlib.util.find_spec(new) is not None, f"{old} maps to {new}, which does not exist"
        if old.rpartition(".")[2].startswith("_"):
            assert importlib.util.find_spec(old) is None, f"{old} still exists: it needs no alias"
    named = {
        ("dflow._model", "_chain_from"),
        ("dflow._model", "CONSUMED"),
        ("dflow._model", "Fallback"),
        ("dflow._durable", "_shared_named"),
        ("dflow._durable", "_pipeline_named"),
        ("dflow._saga", "Undo"),
        ("dflow.circuit", "_from_spec"),
        ("dflow.flow", "DFlow"),
    }
    for module, name in named:
        found = unpickler.find_class(module, name)
        home = importlib.import_module(MOVED_MODULES[module])
        assert found is getattr(home, name)
    with pytest.raises(ModuleNotFoundError):
        pickle.Unpickler(io.BytesIO(b"")).find_class("dflow._model", "_chain_from")


def test_there_are_records_of_the_release_before_values_were_kept_once_and_of_this_form() -> None:
    full, lean = (_read(ROOT / "records" / f"{name}.records") for name in ("full_bytes", "by_reference"))
    assert [p.stem for p in RECORDS] == ["by_reference", "full_bytes"]
    inputs = [msgpack.unpackb(p, raw=False)[7] for p in full["packed"]]
    assert all(i is None or isinstance(i, bytes) for i in inputs), "every input in full"
    assert sum(map(len, lean["packed"])) < sum(map(len, full["packed"])), "the later form refers to values"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_step_records_a_redis_store_kept_read_with_their_inputs_and_outputs_from_any_index(
    path: Path,
) -> None:
    from dflow.adapters.redis.records import unpack_records

    f = _read(path)
    packed, expected = f["packed"], [tuple(pair) for pair in f["expected"]]
    assert [(r.raw_input, r.raw_output) for r in unpack_records(packed)] == expected
    for start in range(1, len(packed)):
        tail = unpack_records(packed[start:], packed[start - 1])
        assert [(r.raw_input, r.raw_output) for r in tail] == expected[start:], f"from {start}"
    assert [r.key for r in unpack_records(packed)] == ["entry", "a", "b", "c", "d", "e"]
