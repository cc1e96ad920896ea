"""Where a runtime is in its life, as its parts see it: whether it is stopping."""

from __future__ import annotations

__all__ = ["Lifecycle"]


class Lifecycle:
    """Whether a runtime is ``stopping``: its loops end, a fused store takes no next step
    for it, and a cancellation is its own shutdown rather than a step's failure."""

    __slots__ = ("stopping",)

    def __init__(self) -> None:
        self.stopping = False
