"""The observers of a runtime's step path (``dflow.observe``), as the parts of the runtime
that call them see them: one combined observer, or ``None`` when there is none."""

from __future__ import annotations

from collections.abc import Sequence

from ..observe import StepObserver, combine

__all__ = ["Observers"]


class Observers:
    """The observers a runtime was made with and those added since; ``current`` is them
    combined (each isolated), ``None`` for none: the one test a hook site pays."""

    __slots__ = ("all", "current")

    def __init__(self, observers: Sequence[StepObserver] = ()) -> None:
        self.all: list[StepObserver] = list(observers)
        self.current: StepObserver | None = combine(self.all)

    def add(self, observer: StepObserver) -> None:
        """Watch the step path with ``observer`` too."""
        self.current = combine([*self.all, observer])  # (checks it)
        self.all.append(observer)
