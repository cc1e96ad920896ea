"""The instrumentation seam of the runtime: ``StepObserver``.

A ``Runtime`` made with ``observers=[...]`` (or given one by ``Runtime.add_observer``)
calls its observers on the step path: when a run is created in this process, when a
claimed step starts and when its commit is done (or lost, or abandoned), when a step is
parked or its flow cannot be loaded, when a message is dead-lettered. ``dflow.metrics``
(Prometheus), ``dflow.otel`` (OpenTelemetry) and the worker's JSON logs are observers.

Cost: a runtime without observers pays one ``is not None`` test per hook site; no label,
no span, no run data is made. An observer's hooks run on the runtime's event loop, inline
in the step path: keep them short and never block. Each observer is isolated: what one of
its hooks raises (an ``Exception``) is logged on ``dflow.observe`` (at most once a minute
per observer and hook) and the step goes on, as do the other observers; a step whose
``started`` raised gets none of that observer's other hooks. ``attach`` is not isolated:
what it raises stops the runtime's start.

Labels: ``started`` gets the step's *pipeline* and *step* labels (``step_labels``), both
of bounded variety: the step is the ``label`` of its node, else its id (never its full
key, which nests, nor a trace id); the pipeline is the name of the pipeline the run's flow belongs to, read from
the run's outermost frame when that is a pipeline's chain (or one of its zip/any branches),
else from the run's data key ``PIPELINE_KEY``, which the step whose tail call leaves the
pipeline's chain writes (and the zip/any branches of the flow it built inherit), else from
the outermost level of the step key (a run that left its pipeline's chain before the key was
written); ``NO_PIPELINE`` when no pipeline of this process matches it alone (a
``direct_run``, or two pipelines ending alike). A compensation step (saga undo) has the
pipeline label of the run it undoes, which its run's compensating mark keeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .context import StepRecord
from .model import registry
from .model.nodes import Chain, Frame
from .store import COMPENSATING, Claim, NewRun
from .wire.values import decode, encode

if TYPE_CHECKING:
    from .runtime.worker import Runtime

__all__ = [
    "NO_PIPELINE",
    "PIPELINE_KEY",
    "StepObserver",
    "combine",
    "compensated_pipeline",
    "kept_pipeline",
    "run_label",
    "step_labels",
]

log = logging.getLogger("dflow.observe")

NO_PIPELINE = "(none)"  #: the pipeline label of a step no pipeline of this process names alone


class StepObserver:
    """Hooks on the runtime's step path; each does nothing here: override what you need.

    Per step, in order: ``started`` (its result is the *token* the other hooks of that
    step get), ``forking`` (only for a step that starts zip/any branches, before the
    commit), then exactly one of ``finished`` (the commit returned) or ``aborted`` (the
    step was handed back: the store or transport failed, or the runtime stopped)."""

    def attach(self, runtime: Runtime) -> None:
        """``runtime`` starts (called on its event loop): start what needs the loop."""

    async def detach(self, runtime: Runtime) -> None:
        """``runtime`` stops, before it closes its transport and store."""

    def run_starting(self, trace_id: str, pipeline: str, data: dict[str, bytes]) -> Any:
        """A run of ``pipeline`` (its label) is about to be created by this process;
        entries put in ``data`` become the run's initial data (keys starting ``dflow/`` are
        dflow's). Returns a token for ``run_started``."""
        return None

    def run_started(self, token: Any, error: BaseException | None) -> None:
        """The run of ``run_starting``'s ``token`` was created (``error``: it was not)."""

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        """A claimed step starts running here. ``pipeline`` and ``step`` are its labels
        (see the module). Returns the token of this step's other hooks."""
        return None

    def forking(self, token: Any, children: list[NewRun], changes: dict[str, bytes | None]) -> None:
        """The step starts zip/any branch runs. Entries put in ``changes`` are committed
        with the step, to its run's data, which the branch runs start with; entries put in
        a child's ``data`` only: a store may make a branch's data from its parent's with
        the changes (the Redis store does), so what must reach a branch goes in both."""

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        """The step's commit returned. ``records[0]`` is the step's own record (its status:
        done, failed, retrying, waiting, ...), the others those of error handlers that ran;
        ``applied`` is ``False`` when the lease was lost and nothing was committed."""

    def aborted(self, token: Any, error: BaseException) -> None:
        """The step was not committed and is handed back (it runs again), for ``error``."""

    def parked(self, claim: Claim, reason: str, count: int) -> None:
        """The step's code is missing here: it is parked (the ``count``-th time) for a worker
        that has it."""

    def rejected(self, claim: Claim, reason: str) -> None:
        """The step's flow cannot be loaded (a bad signature, a damaged record): its run fails."""

    def dead_lettered(self, reason: str) -> None:
        """A message that is no step message was set aside with ``reason``."""


_SKIP = object()  #: the token of a step whose ``started`` raised: that observer's other hooks skip it
_REPORT_EVERY = 60.0  #: seconds between two reports of one observer's failures in one hook


class _Isolated(StepObserver):
    """One observer whose hooks never raise (see the module): what they raise is logged."""

    def __init__(self, observer: StepObserver) -> None:
        self.observer = observer
        self._reported: dict[str, float] = {}  # by hook: when its failure was last logged

    def _failed(self, hook: str, exc: Exception) -> None:
        now = time.monotonic()
        last = self._reported.get(hook)
        if last is None or now - last >= _REPORT_EVERY:
            self._reported[hook] = now
            log.error(
                "dflow: the observer %s raised in %s; ignored, the step goes on (reported at most once a "
                "minute)",
                type(self.observer).__qualname__,
                hook,
                exc_info=exc,
            )

    def attach(self, runtime: Runtime) -> None:
        self.observer.attach(runtime)

    async def detach(self, runtime: Runtime) -> None:
        try:
            await self.observer.detach(runtime)
        except Exception as exc:
            self._failed("detach", exc)

    def run_starting(self, trace_id: str, pipeline: str, data: dict[str, bytes]) -> Any:
        try:
            return self.observer.run_starting(trace_id, pipeline, data)
        except Exception as exc:
            self._failed("run_starting", exc)
            return _SKIP

    def run_started(self, token: Any, error: BaseException | None) -> None:
        if token is not _SKIP:
            try:
                self.observer.run_started(token, error)
            except Exception as exc:
                self._failed("run_started", exc)

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        try:
            return self.observer.started(claim, pipeline, step)
        except Exception as exc:
            self._failed("started", exc)
            return _SKIP

    def forking(self, token: Any, children: list[NewRun], changes: dict[str, bytes | None]) -> None:
        if token is not _SKIP:
            try:
                self.observer.forking(token, children, changes)
            except Exception as exc:
                self._failed("forking", exc)

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        if token is not _SKIP:
            try:
                self.observer.finished(token, records, applied)
            except Exception as exc:
                self._failed("finished", exc)

    def aborted(self, token: Any, error: BaseException) -> None:
        if token is not _SKIP:
            try:
                self.observer.aborted(token, error)
            except Exception as exc:
                self._failed("aborted", exc)

    def parked(self, claim: Claim, reason: str, count: int) -> None:
        try:
            self.observer.parked(claim, reason, count)
        except Exception as exc:
            self._failed("parked", exc)

    def rejected(self, claim: Claim, reason: str) -> None:
        try:
            self.observer.rejected(claim, reason)
        except Exception as exc:
            self._failed("rejected", exc)

    def dead_lettered(self, reason: str) -> None:
        try:
            self.observer.dead_lettered(reason)
        except Exception as exc:
            self._failed("dead_lettered", exc)


class _Fanout(StepObserver):
    """Several isolated observers as one: each hook calls each observer in order."""

    def __init__(self, observers: Sequence[_Isolated]) -> None:
        self.observers = tuple(observers)

    def attach(self, runtime: Runtime) -> None:
        for o in self.observers:
            o.attach(runtime)

    async def detach(self, runtime: Runtime) -> None:
        for o in self.observers:
            await o.detach(runtime)

    def run_starting(self, trace_id: str, pipeline: str, data: dict[str, bytes]) -> Any:
        return tuple(o.run_starting(trace_id, pipeline, data) for o in self.observers)

    def run_started(self, token: Any, error: BaseException | None) -> None:
        for o, t in zip(self.observers, token):
            o.run_started(t, error)

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        return tuple(o.started(claim, pipeline, step) for o in self.observers)

    def forking(self, token: Any, children: list[NewRun], changes: dict[str, bytes | None]) -> None:
        for o, t in zip(self.observers, token):
            o.forking(t, children, changes)

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        for o, t in zip(self.observers, token):
            o.finished(t, records, applied)

    def aborted(self, token: Any, error: BaseException) -> None:
        for o, t in zip(self.observers, token):
            o.aborted(t, error)

    def parked(self, claim: Claim, reason: str, count: int) -> None:
        for o in self.observers:
            o.parked(claim, reason, count)

    def rejected(self, claim: Claim, reason: str) -> None:
        for o in self.observers:
            o.rejected(claim, reason)

    def dead_lettered(self, reason: str) -> None:
        for o in self.observers:
            o.dead_lettered(reason)


def combine(observers: Sequence[StepObserver]) -> StepObserver | None:
    """One observer for ``observers``, each isolated (see the module); ``None`` for none."""
    for o in observers:
        if not isinstance(o, StepObserver):
            raise TypeError(
                "an observer is a dflow.observe.StepObserver (dflow.metrics.Metrics, dflow.otel.Tracing, "
                f"...), got {type(o).__qualname__}"
            )
    flat: list[_Isolated] = []
    for o in observers:
        for one in o.observers if isinstance(o, _Fanout) else (o,):
            flat.append(one if isinstance(one, _Isolated) else _Isolated(one))
    if not flat:
        return None
    return flat[0] if len(flat) == 1 else _Fanout(flat)


# -- labels ------------------------------------------------------------------------------

#: the run data key of the name of the pipeline a run belongs to, written by the step whose
#: tail call leaves the pipeline's chain (the frames name it until then; see the module)
PIPELINE_KEY = "dflow/pipeline"

#: by (outermost chain, top chain, its position, its key suffix): what makes the step's key,
#: without hashing the key itself (a fresh string of each message, as long as its chain); the
#: pipeline its frames name (``None`` when they name none), the one its key matches, the step
_labels: dict[tuple[Chain, Chain, int, str], tuple[str | None, str, str]] = {}
_MAX_LABELS = 4096  #: cached steps at most; the cache is emptied when full


def step_labels(
    frames: tuple[Frame, ...], key: str, data: Mapping[str, bytes] | None = None
) -> tuple[str, str]:
    """The (pipeline, step) labels of the step at the top of ``frames``, whose key is
    ``key`` (``frames[-1].key``), of a run whose data is ``data`` (see the module); the step
    label is the node's ``label``, else its id. A compensation step (its run's ``data`` has
    the compensating mark) has the pipeline of the run it undoes. Cached: the same step
    costs one dict lookup."""
    root, top = frames[0].chain, frames[-1]
    at = (root, top.chain, top.pos, top.suffix)
    hit = _labels.get(at)
    if hit is None:
        node = top.node
        named = _named_pipeline(root)
        hit = (
            named,
            NO_PIPELINE if named is not None else _pipeline_by_key(key),
            node._label or node._id or "",
        )
        if len(_labels) >= _MAX_LABELS:
            _labels.clear()
        _labels[at] = hit
    named, by_key, step = hit
    if named is not None:
        return named, step
    if data is not None:
        kept = data.get(PIPELINE_KEY)
        if kept is not None:
            pipeline = _kept_pipeline(kept)
            if pipeline is not None:
                return pipeline, step
        if by_key is NO_PIPELINE and COMPENSATING in data:
            return compensated_pipeline(data), step
    return by_key, step


def kept_pipeline(frames: tuple[Frame, ...], after: tuple[Frame, ...] | None) -> dict[str, bytes]:
    """The run data change that keeps the run's pipeline (``PIPELINE_KEY``) when the step at
    ``frames`` moves the run to ``after`` and that leaves the pipeline's chain (a tail call
    replaced the outermost frame, the last that named it); none else."""
    if not after or after[0].chain is frames[0].chain:
        return {}
    named = _named_pipeline(frames[0].chain)
    return {} if named is None else {PIPELINE_KEY: _encoded(named)}


def _encoded(name: str) -> bytes:
    raw = _encodings.get(name)
    if raw is None:
        if len(_encodings) >= _MAX_LABELS:
            _encodings.clear()
        raw = _encodings[name] = encode(name)
    return raw


def _kept_pipeline(raw: bytes) -> str | None:
    name = _decodings.get(raw)
    if name is None:
        try:
            found = decode(raw)
        except Exception:
            return None  # (not one dflow wrote: the step key tells)
        if not isinstance(found, str) or not found:
            return None
        if len(_decodings) >= _MAX_LABELS:
            _decodings.clear()
        name = _decodings[raw] = found
    return name


_encodings: dict[str, bytes] = {}  #: pipeline names' ``PIPELINE_KEY`` values
_decodings: dict[bytes, str] = {}  #: the other way


def compensated_pipeline(data: Mapping[str, bytes]) -> str:
    """The pipeline label of the run whose compensations run, as its compensating mark
    keeps it (``NO_PIPELINE`` when the mark has none: one written before it kept it)."""
    try:
        pipeline = decode(data[COMPENSATING]).get("pipeline")
    except Exception:
        return NO_PIPELINE
    return pipeline if isinstance(pipeline, str) and pipeline else NO_PIPELINE


def run_label(frames: tuple[Frame, ...] | None, first_key: str | None) -> str:
    """The pipeline label of a run created at ``frames``, whose first step's key is
    ``first_key`` (``NO_PIPELINE`` for a run finished at creation)."""
    if not frames or first_key is None:
        return NO_PIPELINE
    return step_labels(frames, first_key)[0]


def _named_pipeline(root: Chain) -> str | None:
    """The name of the pipeline whose chain (or a zip/any branch of it: ``p:<digest>/<pos>.<i>``)
    ``root`` is; ``None`` for a flow built at run time (or one of no pipeline of this process)."""
    ref = registry.ref_of(root)
    if ref is not None:
        head = registry.chain_by_ref(ref.split("/", 1)[0])
        pipeline = registry.pipeline_for(head.keys[0]) if head is not None else None
        if pipeline is not None:
            return pipeline.name
    return None


def _pipeline_by_key(key: str) -> str:
    level = outer_key(key)
    names = {p.name for k, p in list(registry._pipelines.items()) if k == level or k.endswith(">" + level)}
    return names.pop() if len(names) == 1 else NO_PIPELINE


def outer_key(key: str) -> str:
    """The part of a step key that is a key of the run's outermost chain: what follows the
    last ``/`` (flat_map nesting), with a zip/any branch marker ``id[i]`` undone
    (``"x>y/p>z[0]>c"`` -> ``"z>c"``). Ids contain neither ``/``, ``>`` nor ``[``."""
    seg = key[key.rfind("/") + 1 :]
    b = seg.rfind("[")
    if b >= 0:
        start = seg.rfind(">", 0, b) + 1
        close = seg.find("]", b)
        seg = seg[start:b] + (seg[close + 1 :] if close >= 0 else "")
    return seg
