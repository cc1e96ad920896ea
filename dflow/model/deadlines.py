"""Run deadlines: how long a run may take before it ends ``timed_out``, given to
``entry.call(param, deadline=seconds)`` or as a pipeline's default
(``flow.init(name, deadline=seconds)``), and checked here before any run starts.
"""

from __future__ import annotations

import math

__all__ = ["MAX_DEADLINE", "check_deadline"]

#: The longest deadline, in seconds (366 days): a longer one is a unit mistake.
MAX_DEADLINE = 366 * 24 * 3600.0


def check_deadline(value: object, what: str) -> float | None:
    """``value`` (seconds, or ``None``: no deadline) as a float; ``TypeError`` for a value
    that is no number of seconds (a bool, a str), ``ValueError`` for one that is not over
    0, not finite, or over ``MAX_DEADLINE``, naming ``what`` and the value."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is a number of seconds, got {value!r} ({type(value).__qualname__})")
    seconds = float(value)
    if math.isnan(seconds) or not seconds > 0:
        raise ValueError(f"{what} must be over 0 seconds, got {value!r}")
    if seconds > MAX_DEADLINE:
        raise ValueError(
            f"{what} is {value!r} seconds, over the limit of {MAX_DEADLINE:g} seconds (366 days); "
            "give it in seconds"
        )
    return seconds
