"""A run's step tree as the console draws it, read from the store a little at a time.

:class:`RunTree` holds a run, its step records and, for each ``zip``/``any`` step, its
branch runs (recursively), as ``Run.tree()`` walks them (``dflow.ops.tree``). ``refresh``
reads only what may have changed: a run that has ended and been read whole is not read
again, and a run's records are read from the first one not yet seen. A long run keeps its
latest ``max_steps`` records; a fork shows its first ``max_branches`` branches; at most
``max_runs`` runs are read in all, ``max_depth`` levels of branches deep. The console's
live page refreshes one per open event stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ...context import RunInfo, RunStatus, StepRecord, StepStatus
from ...ops.tree import branch_runs
from ...store import Store
from ...wire.values import encode

__all__ = ["MAX_KEPT_VALUE", "RunNode", "RunTree", "Wait"]

#: bytes of a step's output the tree keeps to draw (a longer one is shown by its size; the
#: step's panel reads it whole); its input is not kept at all
MAX_KEPT_VALUE = 4096


@dataclass(slots=True)
class RunNode:
    """One run of the tree: its state, its latest records (``records[0]`` is the
    ``first``-th of the run) and its branch runs by the index of the forking record."""

    trace_id: str
    depth: int
    info: RunInfo | None = None
    records: list[StepRecord] = field(default_factory=list)
    first: int = 0
    branches: dict[int, list[RunNode]] = field(default_factory=dict)
    hidden_branches: dict[int, int] = field(default_factory=dict)
    settled: bool = False  #: ended (or gone) and read whole: never read again
    read: bool = False  #: read at least once

    @property
    def count(self) -> int:
        """How many records the run has, as far as read."""
        return self.first + len(self.records)


@dataclass(frozen=True, slots=True)
class Wait:
    """A run of the tree waiting in ``from_call(call_type)``: what the console answers."""

    trace_id: str
    call_type: str
    seq: int


class RunTree:
    """The step tree of run ``trace_id`` in ``store`` (see the module). Its coroutines run
    on the store's event loop."""

    def __init__(
        self,
        store: Store,
        trace_id: str,
        *,
        max_steps: int = 300,
        max_branches: int = 24,
        max_runs: int = 200,
        max_depth: int = 8,
    ) -> None:
        self.store = store
        self.root = RunNode(trace_id, 0)
        self.max_steps = max_steps
        self.max_branches = max_branches
        self.max_runs = max_runs
        self.max_depth = max_depth
        self.truncated = False  #: some branch runs were left out (``max_runs``, ``max_depth``)

    async def refresh(self) -> bool:
        """Read what changed; whether anything did."""
        before = self.fingerprint()
        budget = [self.max_runs]
        self.truncated = False
        await self._refresh(self.root, budget)
        return self.fingerprint() != before

    async def _refresh(self, node: RunNode, budget: list[int]) -> None:
        budget[0] -= 1
        if not node.settled:
            await self._read(node)
        for index, rec in enumerate(node.records):
            ids = branch_runs(rec)
            if not ids:
                continue
            at = node.first + index
            children = node.branches.setdefault(
                at, [RunNode(t, node.depth + 1) for t in ids[: self.max_branches]]
            )
            node.hidden_branches[at] = max(0, len(ids) - self.max_branches)
            for child in children:
                if child.depth > self.max_depth or budget[0] <= 0:
                    self.truncated = True
                    continue
                await self._refresh(child, budget)

    async def _read(self, node: RunNode) -> None:
        info = await self.store.get_run(node.trace_id)
        node.info = info
        if info is None:  # never started, or expired
            node.settled = node.read = True
            return
        if not node.read:  # a long run: from its latest steps (a retry adds records: never fewer)
            node.first = max(0, info.seq + 1 - self.max_steps)
            node.read = True
        fresh = await self.store.get_steps(node.trace_id, node.count)
        node.records += [_light(rec) for rec in fresh]
        extra = len(node.records) - self.max_steps
        if extra > 0:
            dropped = node.records[:extra]
            del node.records[:extra]
            for i in range(len(dropped)):
                node.branches.pop(node.first + i, None)
                node.hidden_branches.pop(node.first + i, None)
            node.first += extra
        node.settled = info.status.finished  # read before the records: they are all there

    # -- what the page shows ----------------------------------------------------------------

    def nodes(self) -> Iterator[RunNode]:
        """Every run of the tree, the root first, depth first."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            for at in sorted(node.branches, reverse=True):
                stack.extend(reversed(node.branches[at]))

    def fingerprint(self) -> tuple[Any, ...]:
        """Equal for two states of the tree that draw alike."""
        out: list[Any] = []
        for n in self.nodes():
            info = n.info
            state = (
                None
                if info is None
                else (info.status, info.seq, info.updated, info.waiting_for, info.extra.get("park_count"))
            )
            out.append((n.trace_id, n.count, state))
        return tuple(out)

    @property
    def live(self) -> bool:
        """Whether a run of the tree may still change."""
        return any(not n.settled for n in self.nodes())

    def waits(self) -> list[Wait]:
        """The runs of the tree that wait in a ``from_call``, with their call types."""
        out = []
        for n in self.nodes():
            info = n.info
            last = n.records[-1] if n.records else None
            if (
                info is not None
                and info.status is RunStatus.WAITING
                and info.waiting_for
                and last is not None
                and last.status is StepStatus.WAITING
            ):
                out.append(Wait(n.trace_id, info.waiting_for, info.seq))
        return out


def _light(rec: StepRecord) -> StepRecord:
    """What the tree keeps of a record: all but its input, and its output only when short
    (a fork's branch ids are); a long output becomes a note of its size."""
    out = rec.raw_output
    if out is not None and len(out) > MAX_KEPT_VALUE and rec.status is not StepStatus.FORKED:
        out = encode(f"<{len(out):,} bytes: select the step to see it>")
    return StepRecord(
        rec.key,
        rec.seq,
        rec.status,
        rec.attempt,
        rec.worker,
        rec.started,
        rec.duration,
        None,
        out,
        rec.error,
        rec.name,
    )
