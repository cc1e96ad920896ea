"""Per-node retry policy."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import BuildError, SerializationError

__all__ = ["RetryPolicy"]


def exception_classes(on: object) -> tuple[type[BaseException], ...] | None:
    """``on`` (an exception class, or a tuple of them) as a tuple; ``None`` when any of
    it is not an exception class. What ``retry``, ``fallback`` and ``Circuit`` take as ``on=``."""
    kinds: list[type[BaseException]] = []
    for k in on if isinstance(on, tuple) else (on,):
        if not (isinstance(k, type) and issubclass(k, BaseException)):
            return None
        kinds.append(k)
    return tuple(kinds)


# Errors that would fail the same way on every attempt: never retried.
_NEVER_RETRIED: tuple[type[BaseException], ...] = (BuildError, SerializationError)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts in all, exponential backoff with jitter, and which exceptions retry."""

    attempts: int
    backoff: float
    max_backoff: float
    jitter: bool
    on: tuple[type[BaseException], ...]

    @classmethod
    def build(
        cls,
        attempts: int,
        backoff: float,
        max_backoff: float,
        jitter: bool,
        on: type[BaseException] | tuple[type[BaseException], ...],
    ) -> RetryPolicy:
        """Check the arguments and make a policy; raise ``BuildError`` saying what is wrong."""
        if not isinstance(attempts, int) or attempts < 1:
            raise BuildError(f"retry attempts must be an int >= 1 (attempts in all), got {attempts!r}")
        if backoff < 0 or max_backoff < 0:
            raise BuildError(f"retry backoff must be >= 0, got backoff={backoff}, max_backoff={max_backoff}")
        kinds = exception_classes(on)
        if kinds is None:
            raise BuildError(f"retry on= takes exception classes, got {on!r}")
        return cls(attempts, float(backoff), float(max_backoff), bool(jitter), kinds)

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """Whether attempt number ``attempt`` (0-based) that raised ``error`` gets another."""
        return (
            attempt + 1 < self.attempts
            and isinstance(error, self.on)
            and not isinstance(error, _NEVER_RETRIED)
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the attempt after ``attempt`` (0-based)."""
        base: float = min(self.max_backoff, self.backoff * (2**attempt))  # int ** int is Any to checkers
        return base * random.uniform(0.5, 1.0) if self.jitter else base
