"""Pipelines made by ``init()`` in this process, by the key of their head step.

Workers resolve the static part of a run through it; lazy chains built by ``flat_map``
travel with the run instead.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._model import Chain
    from .client import Pipeline

log = logging.getLogger("dflow")

_pipelines: dict[str, Pipeline] = {}
_by_ref: dict[str, Chain] = {}
_ref_by_id: dict[int, str] = {}


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
