"""Pipelines made by ``init()`` in this process, by the key of their head step.

Workers resolve the static part of a run through it; lazy chains built by ``flat_map``
travel with the run instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .client import Pipeline
    from .flow import Chain

log = logging.getLogger("dflow")

_pipelines: dict[str, Pipeline] = {}


def register(pipeline: Pipeline) -> None:
    """Record ``pipeline`` under its head key; a later pipeline with the same key wins."""
    key = pipeline._chain.keys[0]
    if key in _pipelines and _pipelines[key] is not pipeline:
        log.debug("dflow: pipeline %r replaces an earlier one with head key %r", pipeline.name, key)
    _pipelines[key] = pipeline


def chain_for(head_key: str) -> Chain | None:
    """The chain of the pipeline registered under ``head_key``, if any."""
    p = _pipelines.get(head_key)
    return p._chain if p is not None else None
