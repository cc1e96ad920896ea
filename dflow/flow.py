"""The flow model: ``DFlow``, an immutable description of a chain of steps.

The public home of ``DFlow``, ``InitParam`` and ``adirect_run`` (defined in
``dflow.model.flow``). Operators return new ``DFlow`` values; nothing runs until a pipeline
made by ``init()`` is called, or ``DFlow.direct_run`` starts a run.
"""

from __future__ import annotations

from .model.flow import DFlow, InitParam, adirect_run
from .model.flow import direct_run as direct_run

# what this module also offered before the model had a package of its own
from .model.nodes import (  # noqa: F401
    CONSUMED,
    Chain,
    Fallback,
    Frame,
    Kind,
    Node,
    _chain_from,
    _fn_name,
    _site_text,
    compile_flow,
)

__all__ = ["DFlow", "InitParam", "adirect_run"]
