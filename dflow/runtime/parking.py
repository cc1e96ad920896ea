"""The note a parked step leaves on its run: why no worker that took it could run it, in
words a person can act on (the pipeline, the step, the ids that differ), not the digest of
a chain."""

from __future__ import annotations

from ..errors import DFlowError, StoreError
from ..model.registry import missing_flow_note
from ..store import Claim, Store

__all__ = ["parked_note"]


async def parked_note(store: Store, claim: Claim, problem: DFlowError) -> str:
    """What to record for the step of ``claim`` parked for ``problem``."""
    if getattr(problem, "chain_ref", None) is None:
        return str(problem)
    try:
        info = await store.get_run(claim.message.trace_id)
    except StoreError:
        info = None
    return missing_flow_note(info.pipeline if info is not None else None, claim.message.key)
