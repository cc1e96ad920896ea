"""Write what a deployment's store keeps of the runs of tests/support/compat_flows.py, as
the release this is run with stores it, for tests/test_stored_compat.py.

    python -m tests.support.compat_writer          (from the repository's root)

A store keeps a run's frames record (signed), the flow blobs it refers to (cloudpickle,
signed: they name dflow's classes and functions by module path), its value and its data
(pydantic models, saga entries holding pickled compensations, a rerun's link). The writer
runs each flow in local mode on an in-memory store that notes every step a worker claims,
with those bytes, and writes one such step per fixture into
``tests/data/compat/<dflow version>/<name>.msgpack``: a later release recreates the run in
its store from it and must carry it on to the end the writing release reached, noted beside
it (the result, or the status, and what the steps did after that step). ``MANIFEST.json``
says what each fixture covers. It refuses to write over the fixtures of a version: those
are what that release stored, and stay as they are.

Pickled functions and error tracebacks carry source file names, absolute where a module was
imported from: before the flows run, the writer gives the code of dflow and of the compat
flows the file names of the checkout's layout (``dflow/circuit.py``), so that the fixtures
hold no path of the machine that wrote them (and it checks that they do not).
"""

from __future__ import annotations

import json
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

import dflow
from dflow import DFlow, RunCompensatedError, RunFailedError, RunStatus
from dflow.memory import MemoryStore, MemoryTransport
from tests.support import compat_flows as flows

ROOT = Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "tests" / "data" / "compat"
COMPENSATING = "dflow/compensating"  #: the data field of a run running its compensations


@dataclass
class Kept:
    """A step as the store handed it to a worker, with the blobs its frames name."""

    message: tuple[Any, ...]
    frames: bytes | None
    value: bytes
    data: dict[str, bytes]
    blobs: dict[str, bytes]
    logged: int  #: how much of ``flows.LOG`` was written when it was claimed
    pipeline: str | None


class KeepingStore(MemoryStore):
    """An in-memory store (not fused: every step goes through ``claim``) that keeps a copy
    of every claim it hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Kept] = []

    async def claim(self, message: Any, worker: str, lease: float) -> Any:
        claim = await super().claim(message, worker, lease)
        if claim is not None:
            blobs = {}
            for ref in claim.blobs:
                blob = await self.get_blob(ref)
                assert blob is not None, f"the store lacks the blob {ref} of a live run"
                blobs[ref] = blob
            run = self._runs[message.trace_id]
            self.kept.append(
                Kept(
                    tuple(claim.message),
                    claim.frames,
                    claim.value,
                    dict(claim.data),  # the store's own dict changes as the run goes on: a copy
                    blobs,
                    len(flows.LOG),
                    run.pipeline,
                )
            )
        return claim


def _kept(store: KeepingStore, trace_id: str, pick: Callable[[Kept], bool], nth: int = 0) -> Kept:
    found = [k for k in store.kept if k.message[0] == trace_id and pick(k)]
    assert len(found) > nth, f"run {trace_id}: no claim {nth} of those asked for (claims: {len(store.kept)})"
    return found[nth]


def _key(prefix: str) -> Callable[[Kept], bool]:
    return lambda k: str(k.message[2]).startswith(prefix) and k.message[4] == 0  # a RUN message


def _wait_for(run: dflow.Run[Any], status: RunStatus, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while run.status() is not status:
        assert time.monotonic() < deadline, f"run {run.trace_id} did not reach {status}"
        time.sleep(0.01)


def _fixture(name: str, covers: list[str], kept: Kept, run: dflow.Run[Any], **end: Any) -> dict[str, Any]:
    info = run.info()
    trace = run.trace_id
    return {
        "name": name,
        "covers": covers,
        "written_by": dflow.__version__,
        "trace_id": trace,
        "pipeline": kept.pipeline,
        "message": list(kept.message),
        "frames": kept.frames,
        "blobs": kept.blobs,
        "value": kept.value,
        "data": kept.data,
        "calls": end.pop("calls", []),
        "status": info.status.value,
        "result": info.raw_result,
        "error_type": (info.error or {}).get("type"),
        # what the steps did from that step on: a run carried on from it does the same
        "log": [what for run_id, what in flows.LOG[kept.logged :] if run_id == trace],
        **end,
    }


def write_kitchen(store: KeepingStore) -> dict[str, Any]:
    run = flows.KITCHEN.call(flows.Order(item="widget", qty=3))
    _wait_for(run, RunStatus.WAITING)
    payload = 4
    DFlow.call("compat-answer", payload, run.trace_id)
    run.result(timeout=30)
    kept = _kept(store, run.trace_id, lambda k: bool(k.blobs))  # the built chain's first step: its from_call
    covers = [
        "a chain built at run time (flat_map) with from_call+on_init, map, flat_map, zip, any, delay, just",
        "id, name, retry, timeout, in_thread, on_error_return, fallback, circuit",
        "a lambda's closure, a shared object and a pipeline captured by name",
        "a pydantic model as the run's parameter, in its data and in its result",
    ]
    return _fixture("kitchen", covers, kept, run, calls=[["compat-answer", payload]])


def write_saga(store: KeepingStore) -> list[dict[str, Any]]:
    run = flows.SAGA.call(flows.Order(item="gear", qty=2))
    try:
        run.result(timeout=30)
    except RunCompensatedError:
        pass
    entries = _kept(store, run.trace_id, _key("ship"))  # two saga entries in its data
    undo = _kept(store, run.trace_id, lambda k: COMPENSATING in k.data and k.message[4] == 0, nth=1)
    return [
        _fixture(
            "saga_entries",
            ["saga entries (pickled compensations of a chain built at run time) in a run's data"],
            entries,
            run,
        ),
        _fixture("saga_undo", ["a run's chain of compensation steps, built at run time"], undo, run),
    ]


def write_direct(store: KeepingStore) -> dict[str, Any]:
    run = DFlow.direct_run(flows.Order(item="bolt", qty=5), flows.direct)
    run.result(timeout=30)
    kept = _kept(store, run.trace_id, lambda k: bool(k.blobs))
    return _fixture("direct_run", ["the chain of a direct_run (its builder step)"], kept, run)


def write_rerun(store: KeepingStore) -> dict[str, Any]:
    flows.BROKEN["rerun"] = True
    original = flows.RERUN.call(6)
    try:
        original.result(timeout=30)
    except RunFailedError:
        pass
    (failed,) = [r for r in original.context().steps if r.key.startswith("second")]
    flows.BROKEN["rerun"] = False  # the fix is deployed
    rerun = original.rerun_from(failed.seq)
    rerun.result(timeout=30)
    kept = _kept(store, rerun.trace_id, _key("second"))
    return _fixture(
        "rerun", ["a rerun's link to its original in the run's data"], kept, rerun, rerun_of=original.trace_id
    )


def _relocated(code: types.CodeType) -> types.CodeType:
    """``code`` and the code nested in it (lambdas, inner functions) with file names
    relative to the checkout."""
    consts = tuple(_relocated(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    path = Path(code.co_filename)
    name = (
        path.relative_to(ROOT).as_posix()
        if path.is_absolute() and path.is_relative_to(ROOT)
        else code.co_filename
    )
    return code.replace(co_filename=name, co_consts=consts)


def _functions_of(obj: Any, seen: set[int]) -> list[types.FunctionType]:
    """The functions a module or class defines, methods and properties included."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    out: list[types.FunctionType] = []
    for value in vars(obj).values():
        for part in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            while isinstance(part, types.FunctionType):
                out.append(part)
                part = getattr(part, "__wrapped__", None)
        if isinstance(value, type) and value.__module__ == getattr(obj, "__name__", value.__module__):
            out += _functions_of(value, seen)
    return out


def relative_sources() -> None:
    """Give the loaded modules of dflow and the compat flows the file names of the
    checkout's layout, in their ``__file__`` (cloudpickle stores it with a function pickled
    by value) and in their functions' code (pickled with it, and named by tracebacks)."""
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if not (name == "dflow" or name.startswith("dflow.") or name == flows.__name__):
            continue
        file = getattr(module, "__file__", None)
        if file and Path(file).is_relative_to(ROOT):
            module.__file__ = Path(file).relative_to(ROOT).as_posix()
        for fn in _functions_of(module, seen):
            if fn.__module__ == name:
                fn.__code__ = _relocated(fn.__code__)


def main() -> int:
    target = OUT / dflow.__version__
    if target.exists():
        print(f"{target} exists: the fixtures of {dflow.__version__} are written once", file=sys.stderr)
        return 1
    relative_sources()
    store = KeepingStore()
    dflow.configure(MemoryTransport(), store, secret=flows.SECRET, poll_interval=0.005)
    try:
        fixtures = [write_kitchen(store), *write_saga(store), write_direct(store), write_rerun(store)]
    finally:
        dflow.shutdown()
    packed = {f["name"]: msgpack.packb(f, use_bin_type=True) for f in fixtures}
    for name, raw in packed.items():
        if str(ROOT).encode() in raw:
            print(f"the fixture {name} names the checkout's path: not written", file=sys.stderr)
            return 1
    target.mkdir(parents=True)
    for name, raw in packed.items():
        (target / f"{name}.msgpack").write_bytes(raw)
    manifest = {
        f["name"]: {
            "covers": f["covers"],
            "status": f["status"],
            "log": f["log"],
            "blobs": sorted(f["blobs"]),
        }
        for f in fixtures
    }
    (target / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(fixtures)} fixtures to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
