"""The flow blobs of the in-memory store: kept while a live run references them, then for
the store's ``blob_ttl``, as the Redis store keeps its own.
"""

from __future__ import annotations

from collections import deque

from ..store import BlobsMissingError, Frames
from .runs import RunState

__all__ = ["BlobTable"]


class BlobTable:
    """Blobs by reference, with the number of live runs referencing each."""

    __slots__ = ("blobs", "expiry", "runs")

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.runs: dict[str, int] = {}  # live runs referencing each blob
        self.expiry: deque[tuple[float, str]] = deque()

    def check(self, frames: list[Frames | None]) -> None:
        """Store the new blobs, then refuse (changing nothing else) a write that names one
        the store has not: the writer believed it stored."""
        missing = []
        for f in frames:
            if f is None:
                continue
            for ref, blob in f.new_blobs.items():
                self.blobs.setdefault(ref, blob)
            missing += [r for r in f.blobs if r not in self.blobs]
        if missing:
            raise BlobsMissingError(missing)

    def hold(self, run: RunState, refs: tuple[str, ...], now: float, ttl: float) -> None:
        """``run`` references ``refs`` now: those it no longer does are kept ``ttl``
        seconds more unless another run references them."""
        if refs == run.blobs:
            return
        counts = self.runs
        for r in refs:
            if r not in run.blobs:
                counts[r] = counts.get(r, 0) + 1
        for r in run.blobs:
            if r not in refs:
                n = counts.get(r, 0) - 1
                if n <= 0:
                    counts.pop(r, None)
                    self.expiry.append((now + ttl, r))
                else:
                    counts[r] = n
        run.blobs = refs

    def expire(self, now: float) -> None:
        """Drop the blobs whose time is up and that no run took up again meanwhile."""
        blob_expiry = self.expiry
        while blob_expiry and blob_expiry[0][0] <= now:
            _, ref = blob_expiry.popleft()
            if ref not in self.runs:  # no run took it up again meanwhile
                self.blobs.pop(ref, None)
