"""A list that steps can append to from a flow: declared shared, it travels by name.

Local mode runs the copies of flows built at run time that a worker would run, so a step
appending to a list it captured appends to a copy. Tests that count what steps did
record it here instead, as a user would with any object the steps must not copy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import dflow


class Recorder:
    """What the steps of a test did, in order."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def append(self, item: Any) -> None:
        self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        return self.items == other

    def __repr__(self) -> str:
        return f"Recorder({self.items!r})"


def recorder() -> Recorder:
    """A fresh recorder, shared under a name of its own."""
    return dflow.shared(Recorder(), f"test-recorder-{uuid.uuid4().hex}")
