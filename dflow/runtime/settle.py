"""What follows the applied commit of a step that called ``ctx.once`` or set its run's
business key (a step that did neither pays nothing: the step cycle does not call here): the
parts it kept are dropped, the key it set is written. Both are best effort: the step is done,
and a failure here is logged, never a reason to run the step again.
"""

from __future__ import annotations

import logging

from ..context import ContextStack
from ..parts import PartsOfStep
from ..store import Advance, Store, Transition

__all__ = ["settle"]

log = logging.getLogger("dflow.runtime")


async def settle(store: Store, ctx: ContextStack, transition: Transition) -> None:
    """After the applied commit of the step of ``ctx`` (moving its run by ``transition``):
    its kept parts dropped, its business key written."""
    if ctx._kept is not None:
        await _drop_parts(ctx._kept, transition)
    if ctx._business_key is not None:
        await _keep_business_key(store, ctx.trace_id, ctx._business_key)


async def _keep_business_key(store: Store, trace_id: str, key: str) -> None:
    """The business key a step set, written once its commit is applied (its own small write:
    a step whose commit was refused sets none); on the root run of a zip/any branch."""
    try:
        await store.run_notes.set_business_key(trace_id.partition("/")[0], key)
    except Exception as exc:
        log.warning(
            "dflow: could not give run %r the business key %r (its step is done; dflow ls --key will not "
            "find it): %s",
            trace_id,
            key,
            exc,
        )


async def _drop_parts(parts: PartsOfStep, transition: Transition) -> None:
    """The parts a committed step kept are forgotten, unless it runs again (a retry, whose
    ``once`` returns them). When the store fails to forget them, they expire. A store whose
    commit drops them (``StepParts.parts_in_claim_and_commit``) is not asked again."""
    if not parts.some_kept or parts.store.parts_in_claim_and_commit:  # (the commit dropped them)
        return
    if type(transition) is Advance and transition.message.seq == parts.seq:
        return
    try:
        await parts.store.drop_parts(parts.trace_id, parts.seq)
    except Exception as exc:  # (kept parts of a committed step are never read again)
        log.warning(
            "dflow: could not drop the parts of step %r of run %r: %s", parts.key, parts.trace_id, exc
        )
