"""Pipelines made by ``init()`` in this process, by the key of their head step.

Workers resolve the static part of a run through it; lazy chains built by ``flat_map``
travel with the run instead.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..schedules import Schedule
    from .nodes import Chain
    from .pipeline import Pipeline

log = logging.getLogger("dflow")

_pipelines: dict[str, Pipeline] = {}
_by_ref: dict[str, Chain] = {}
_ref_by_id: dict[int, str] = {}
_schedules: dict[str, Schedule] = {}  #: declared by ``Pipeline.schedule``, by name


def static_ref(head_key: str) -> str:
    """The reference of a pipeline's chain: ``p:`` and a digest of its head key (which
    names every step of the chain, and can be long: a run's frames carry the digest)."""
    return "p:" + hashlib.blake2b(head_key.encode(), digest_size=12).hexdigest()


def register(pipeline: Pipeline) -> None:
    """Record ``pipeline`` under its head key, with references for its chain and for the
    chains of its zip/any branches. A later pipeline with the same head key wins."""
    key = pipeline._chain.keys[0]
    if key in _pipelines and _pipelines[key] is not pipeline:
        log.debug("dflow: pipeline %r replaces an earlier one with head key %r", pipeline.name, key)
    _pipelines[key] = pipeline
    _add(static_ref(key), pipeline._chain)
    _add("p:" + key, pipeline._chain, primary=False)  # as runs of dflow 0.1 refer to it


def register_local(ref: str, chain: Chain) -> None:
    """Record ``chain`` (and its branches) under ``ref``, a ``p:`` reference of this process
    alone (a mocked pipeline's: ``model.mocks``)."""
    _add(ref, chain)


def _add(ref: str, chain: Chain, *, primary: bool = True) -> None:
    old = _by_ref.get(ref)
    if old is not None and primary:
        _ref_by_id.pop(id(old), None)
    _by_ref[ref] = chain
    if primary:
        _ref_by_id[id(chain)] = ref
    for pos, node in enumerate(chain.nodes):
        for i, branch in enumerate(node._branches):
            if branch._compiled is not None:
                _add(f"{ref}/{pos}.{i}", branch._compiled, primary=primary)


def ref_of(chain: Chain) -> str | None:
    """The static reference of ``chain`` when it belongs to a registered pipeline."""
    ref = _ref_by_id.get(id(chain))
    return ref if ref is not None and _by_ref.get(ref) is chain else None


def chain_by_ref(ref: str) -> Chain | None:
    """The registered chain for a static reference, if this process has it."""
    return _by_ref.get(ref)


def pipeline_for(head_key: str) -> Pipeline | None:
    """The pipeline registered under ``head_key``, if any."""
    return _pipelines.get(head_key)


def missing_flow_note(pipeline: str | None, key: str) -> str:
    """Why no pipeline of this process has the step ``key`` of a run started by ``pipeline``
    (its name, if known), in words: the pipeline, the step, and the ids that differ from the
    pipeline of that name built here (the ids of a step key run from that step to the end
    of its chain), or the pipelines built here when none has that name."""
    step = key.split(">", 1)[0]
    what = f"step {step!r} (key {key!r})" + (f" of pipeline {pipeline!r}" if pipeline else "")
    same = [p for p in _pipelines.values() if p.name == pipeline] if pipeline else []
    if not same:
        return f"{what}: {_not_built(pipeline)}; import the module that builds it"
    theirs = [part.rsplit("/", 1)[-1] for part in key.split(">")]  # (the ids of this chain's level)
    notes = "; ".join(_ids_differ(theirs, p._chain.keys[0].split(">")) for p in same)
    return (
        f"{what}: the pipeline {pipeline!r} built in this worker differs from the one that started the run: "
        f"{notes} (ids renamed since the run started? deploy the same modules on every worker)"
    )


def _not_built(pipeline: str | None) -> str:
    built = sorted({p.name for p in _pipelines.values()})
    listed = ", ".join(repr(n) for n in built[:20]) + (" ..." if len(built) > 20 else "")
    where = (
        f"no pipeline named {pipeline!r} is built in this worker" if pipeline else "no pipeline here has it"
    )
    return f"{where} (it builds {listed or 'none'})"


def _ids_differ(theirs: list[str], ours: list[str]) -> str:
    """How the ids of a run's chain from its step on (``theirs``) differ from a chain built here."""
    tail = ours[-len(theirs) :] if len(ours) >= len(theirs) else ours
    gone = [i for i in theirs if i not in ours]
    new = [i for i in tail if i not in theirs]
    if not (gone or new):
        return f"the pipeline built here has the steps {' > '.join(ours)}, in another order or shape"
    return (
        f"the run's flow has the ids {', '.join(map(repr, gone)) or '(none)'} where the pipeline built "
        f"here has {', '.join(map(repr, new)) or '(none)'}"
    )


def pipelines() -> list[Pipeline]:
    """The pipelines registered in this process (one per head key)."""
    return list(_pipelines.values())


def pipeline_named(name: str) -> Pipeline | None:
    """The pipeline registered in this process under ``name`` (the last one made)."""
    found = None
    for p in _pipelines.values():
        if p.name == name:
            found = p
    return found


def declare_schedule(schedule: Schedule) -> None:
    """Record ``schedule`` as declared in this process (a later one of that name wins): the
    runtimes here keep it in their store's book."""
    _schedules[schedule.name] = schedule


def declared_schedules() -> list[Schedule]:
    """The schedules declared in this process."""
    return list(_schedules.values())
