"""Shared rate limits: a ``RateLimit`` on a step, and the ``TokenBucket`` seam that keeps it.

``DFlow.map(fn).id("ask").rate_limit("openai", rate=10, per=1.0, burst=5)`` lets steps
guarded by the bucket ``"openai"`` start at most ``rate`` times every ``per`` seconds, on
every worker together, with up to ``burst`` of them at once after a quiet spell. One bucket
is shared by every step and worker that names it, on the same store.

A ``TokenBucket`` does one thing atomically: ``reserve(limit)`` takes the next token of
bucket ``limit.name`` and says how many seconds from now it is free (0.0: at once). A
token is reserved even when it is not free yet, so that steps waiting for a bucket are
served in the order they asked, each at its own time, and none asks twice. The bucket is
a *generic cell rate* schedule: the time the bucket would be empty again (its ``tat``)
moves on by ``per / rate`` with each token, and a token is free once ``tat`` is at most
``burst`` intervals ahead of now.

A store keeps its buckets as ``store.token_bucket`` (the in-memory store's is
``dflow.memory.rate_limits``, the Redis store's a Lua script, its key hash-tagged by the
bucket's name on a Redis Cluster); ``dflow.testing.TokenBucketContract`` is what one must
do.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .errors import BuildError

__all__ = ["MAX_BURST", "MAX_RATE", "RateLimit", "TokenBucket"]

_NAME = re.compile(r"[A-Za-z0-9_.:@/+\-]{1,200}")
#: the most tokens a second one bucket hands out (an interval of a microsecond), and the
#: largest burst: a bucket schedules in microseconds
MAX_RATE = 1_000_000.0
MAX_BURST = 1_000_000
#: the longest ``per``, and the longest interval between two tokens: a year of seconds
MAX_PER = 86400.0 * 365


def _seconds(value: object, what: str, hint: str, limit: float) -> float:
    """``value`` as a finite number > 0 and at most ``limit``, else ``BuildError`` naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= limit
    ):
        raise BuildError(f"rate_limit {what}= is {hint}, a number > 0 and at most {limit:g}; got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The bucket ``name``: ``rate`` tokens every ``per`` seconds, at most ``burst`` at once.
    Build it with ``RateLimit.build`` (which checks the values), or ``DFlow.rate_limit``."""

    name: str
    rate: float
    per: float
    burst: int

    @classmethod
    def build(cls, name: object, rate: object, per: object = 1.0, burst: object = 1) -> RateLimit:
        """Check the settings and make the limit; ``BuildError`` naming a bad value and its limit."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            shown = name[:60] + ("..." if len(name) > 60 else "") if isinstance(name, str) else name
            raise BuildError(
                f"rate_limit name is 1 to 200 letters, digits or any of _ . : @ / + - (no spaces or braces); "
                f"got {shown!r}"
            )
        r = _seconds(rate, "rate", "how many steps may start every `per` seconds", MAX_RATE)
        p = _seconds(per, "per", "the seconds the rate is counted over", MAX_PER)
        if r / p > MAX_RATE:
            raise BuildError(
                f"rate_limit rate={rate!r} per={per!r} is {r / p:g} steps a second, over the limit of "
                f"{MAX_RATE:g}: a bucket schedules in microseconds"
            )
        if p / r > MAX_PER:
            raise BuildError(
                f"rate_limit rate={rate!r} per={per!r} is one step every {p / r:g} s, over the limit of "
                f"{MAX_PER:g} s (a year)"
            )
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST:
            raise BuildError(
                f"rate_limit burst= is how many steps may start at once, a whole number from 1 to {MAX_BURST}; "
                f"got {burst!r}"
            )
        return cls(name, r, p, burst)

    @property
    def interval(self) -> float:
        """Seconds between two tokens: ``per / rate``."""
        return self.per / self.rate

    def __repr__(self) -> str:
        return f"RateLimit({self.name!r}, rate={self.rate:g}, per={self.per:g}, burst={self.burst})"


class TokenBucket(ABC):
    """Token buckets shared by every worker of a store (see the module)."""

    @abstractmethod
    async def reserve(self, limit: RateLimit) -> float:
        """Take the next token of bucket ``limit.name`` under ``limit``'s settings, atomically;
        the seconds from now until it is free (0.0: it is free now), by the bucket's own clock.
        Every caller of one name should give the same settings: each reserve applies its own."""
