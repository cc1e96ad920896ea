"""The parts of steps the in-memory store keeps (see ``dflow.parts``): by run, then by step
and part name; a run's go when the run does."""

from __future__ import annotations

__all__ = ["PartTable"]


class PartTable:
    """Parts kept, by run."""

    __slots__ = ("runs",)

    def __init__(self) -> None:
        #: the runs with kept parts (a claim or commit of a run not in it has none to look up)
        self.runs: dict[str, dict[tuple[int, str], bytes]] = {}

    def save(self, trace_id: str, seq: int, part: str, blob: bytes) -> bytes:
        """Keep ``blob`` unless a part of that name is kept for the step; the one kept."""
        return self.runs.setdefault(trace_id, {}).setdefault((seq, part), blob)

    def saved(self, trace_id: str, seq: int, part: str) -> bytes | None:
        kept = self.runs.get(trace_id)
        return None if kept is None else kept.get((seq, part))

    def has(self, trace_id: str, seq: int) -> bool:
        """Whether a part of step ``seq`` is kept."""
        kept = self.runs.get(trace_id)
        return kept is not None and any(k[0] == seq for k in kept)

    def drop(self, trace_id: str, seq: int) -> None:
        """Forget the parts of step ``seq`` (and the run's entry when none is left)."""
        kept = self.runs.get(trace_id)
        if kept is None:
            return
        for k in [k for k in kept if k[0] == seq]:
            del kept[k]
        if not kept:
            del self.runs[trace_id]

    def forget(self, trace_id: str) -> None:
        """Forget every part of a run (it has gone)."""
        self.runs.pop(trace_id, None)

    def __len__(self) -> int:
        return sum(len(k) for k in self.runs.values())
