"""A rate-limited step takes a token of its bucket before it runs (see ``dflow.rate_limits``).

Before a worker runs a step whose node has a ``rate_limit``, it reserves the bucket's next
token. When the token is free now, the step runs. Otherwise the step does not run: the worker
commits the step again, one attempt on, due when its token is free (a timer in the store, as
a retry's backoff: no worker waits), with a ``THROTTLED`` record saying which bucket it waits
for and how long. The run's data notes that the step holds its token (``RATE_KEY``: the
run and the step's sequence number, how many times it waited, and the attempt that holds
the token; a zip/any branch, which starts with a copy of the data, is another run), so that
the attempt the timer delivers runs without asking again. Any later attempt (a retry, a
step run again after its worker died) takes a token anew; the step's retry policy counts
its attempts without the waits. A bucket that cannot be reached (``StoreError``) does not
fail the step: it waits ``UNREACHABLE_WAIT`` seconds, holding no token, and asks again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..context import ContextStack, StepStatus
from ..errors import SerializationError, StoreError
from ..model import interpret as interp
from ..rate_limits import RateLimit
from ..store import Claim, Store
from ..wire.values import RUN, Message, decode, encode

__all__ = ["RATE_KEY", "rate_waits", "throttled"]

#: the data key noting the rate-limit waits of the run's current step:
#: ``[trace_id, seq, waits, the attempt that holds the token]``
RATE_KEY = "dflow/rate"
#: seconds a step waits before it asks a bucket that could not be reached again
UNREACHABLE_WAIT = 1.0


def _note(data: Mapping[str, bytes], msg: Message) -> tuple[int, bool]:
    """How many times the step of ``msg`` waited for a token, and whether it holds one now."""
    raw = data.get(RATE_KEY)
    if raw is None:
        return 0, False
    try:
        trace_id, seq, waits, holder = decode(raw)
    except (SerializationError, ValueError, TypeError):  # not ours: none (the step takes a token anew)
        return 0, False
    if trace_id != msg.trace_id or seq != msg.seq or not isinstance(waits, int):
        return 0, False
    return waits, holder == msg.attempt


def rate_waits(data: Mapping[str, bytes], msg: Message) -> int:
    """How many of the attempts of ``msg``'s step were waits for a token (not runs)."""
    return _note(data, msg)[0]


async def throttled(
    store: Store, limit: RateLimit, ctx: ContextStack, claim: Claim, now: float
) -> tuple[interp.Outcome, StepStatus, bytes] | None:
    """``None`` when the step of ``claim`` may run now (it holds a token, or took a free one);
    else the outcome that has it wait for its token: the step again, one attempt on, due
    when the token is free, and what its ``THROTTLED`` record shows."""
    msg = claim.message
    waits, held = _note(claim.data, msg)
    if held:
        return None
    again = Message(msg.trace_id, msg.seq, msg.key, msg.attempt + 1, RUN)
    holder = again.attempt
    shown: dict[str, Any] = {"rate_limit": limit.name}
    try:
        wait = await store.token_bucket.reserve(limit)
    except StoreError as exc:  # (the commit may reach the store yet: then the step asks again later)
        wait, holder = UNREACHABLE_WAIT, -1
        shown["error"] = f"the bucket could not be reached: {exc}"
    if wait <= 0.0:
        return None
    ctx._changes[RATE_KEY] = encode([msg.trace_id, msg.seq, waits + 1, holder])
    shown.update(wait=round(wait, 6), until=round(now + wait, 6))
    return interp.Go(None, claim.value, again, at=now + wait), StepStatus.THROTTLED, encode(shown)
