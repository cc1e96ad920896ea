"""The Store seam in parts: a write side and a read side an adapter implements, fused
dispatch as a capability a store has or not, and the compensations flag a commit sets."""

from __future__ import annotations

import inspect

from dflow import MemoryStore, MemoryTransport
from dflow.store import (
    COMPENSATING,
    Compensations,
    FusedDispatch,
    RunReader,
    RunWriter,
    Store,
    compensations_in,
    fused_variant,
    saga_prefix,
)


def test_the_write_side_is_the_hot_path_in_nine_methods_and_the_read_side_six() -> None:
    assert sorted(RunWriter.__abstractmethods__) == [
        "cancel",
        "claim",
        "commit",
        "create_run",
        "due",
        "extend",
        "init_done",
        "park",
        "resume",
    ]
    assert sorted(RunReader.__abstractmethods__) == [
        "count_runs",
        "get_blob",
        "get_data",
        "get_run",
        "get_steps",
        "page_runs",
    ]
    assert Store.__abstractmethods__ == RunWriter.__abstractmethods__ | RunReader.__abstractmethods__
    assert not hasattr(Store, "list_runs")


def test_a_store_built_with_a_transport_is_fused_dispatch_and_one_without_is_not() -> None:
    plain, fused = MemoryStore(), MemoryStore(transport=MemoryTransport())
    assert not isinstance(plain, FusedDispatch) and not plain.fused
    assert isinstance(fused, FusedDispatch) and fused.fused
    assert isinstance(fused, MemoryStore) and type(fused).__name__ == "MemoryStore"
    assert type(fused) is fused_variant(MemoryStore), "one fused class per store class"


def test_a_store_subclass_built_with_a_transport_keeps_what_it_overrides() -> None:
    class Counting(MemoryStore):
        created = 0

        async def create_run(self, run):  # type: ignore[no-untyped-def]
            Counting.created += 1
            return await super().create_run(run)

    store = Counting(transport=MemoryTransport())
    assert isinstance(store, Counting) and isinstance(store, FusedDispatch)
    assert inspect.getattr_static(type(store), "create_run") is Counting.__dict__["create_run"]


def test_a_commit_holds_compensations_when_it_writes_one_of_the_runs_own() -> None:
    own = saga_prefix("run") + "000000000003"
    assert compensations_in("run", {own: b"entry"}) is Compensations.HELD
    assert compensations_in("run", {own: None}) is None, "deleting one raises nothing"
    assert compensations_in("run", {"user": b"x"}) is None
    assert compensations_in("run", {COMPENSATING: b"mark", own: b"e"}) is Compensations.RUNNING


def test_a_branch_holds_only_its_own_compensations_not_its_parents() -> None:
    parents = saga_prefix("run") + "000000000001"
    branch = "run/4-1"
    assert compensations_in(branch, {parents: b"entry"}) is None
    assert compensations_in(branch, {saga_prefix(branch) + "000000000005": b"entry"}) is Compensations.HELD
    assert compensations_in("run", {saga_prefix(branch) + "000000000005": b"e"}) is Compensations.HELD, (
        "a branch's entry delivered at the join is its parent's to run"
    )
