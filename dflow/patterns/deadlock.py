"""Deadlock detection: runs that wait for each other in a cycle.

The waits-for graph has two kinds of edges. A run *declares* whom its next wait is
answered by with ``ctx.wait_for(trace_id)`` (in the step before a ``from_call``, or in its
``on_init``); the runtime records the edge in the store's shared-state backend once the
wait is committed and its ``on_init`` has returned (while it runs, the run may still answer
the runs that wait for it); a zip's branches do not inherit it. A run waiting at a zip/any
join waits for its unfinished branches (an agent waiting for its sub-agent, ``agent_tool``);
these edges follow from the branch ids.

Every worker runs a ``DeadlockDetector``; one at a time across all of them (a lease in the
backend) looks every ``interval`` seconds for runs that can never go on: a set of waiting
runs each of which waits only for runs of the set. In each such knot it breaks one
declared wait, chosen by the rule (default ``longest_waiting``): that run is resumed with
a ``DeadlockError`` whose ``error["cycle"]`` lists the runs of the cycle, the broken one
first. ``on_error_return`` (or ``fallback``) can turn it into another way on; the step
record of the wait keeps the error and its cycle, and ``dflow.metrics`` counts it
(``dflow_deadlocks_total``).

A run that merely waits long is never broken. A run waiting for a call nobody declared,
or for a run that is running, sleeping or has ended, can go on; so can every run that
waits for it. A wait declared for several runs, and a join, count as waiting for any one
of them (so a zip whose other branches still run is taken for an ``any``: its deadlock is
found once they have ended). Before it breaks a wait, the detector reads the knot's runs
again: each must still wait at the same step.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..clock import SYSTEM_CLOCK, Clock
from ..context import RunInfo, RunStatus, StepStatus
from ..errors import ConfigurationError, NotWaitingError, RunNotFoundError
from ..shared_state import StateBackend, WaitEdge
from ..store import Store
from ..wire.ids import is_run_id
from ..wire.values import encode

__all__ = [
    "BreakRule",
    "Deadlock",
    "DeadlockDetector",
    "WaitEdge",
    "declare",
    "longest_waiting",
    "newest_waiting",
    "rule_of",
]

log = logging.getLogger("dflow.deadlock")

#: the recorded type of the error a broken wait gets (``dflow.errors.DeadlockError``)
DEADLOCK_TYPE = "dflow.errors.DeadlockError"
MAX_RUNS = 10_000  #: runs one pass explores at most; those beyond count as able to go on
_READS = 64  #: runs read at once

BreakRule = Callable[[Sequence[WaitEdge]], WaitEdge]


def longest_waiting(edges: Sequence[WaitEdge]) -> WaitEdge:
    """The rule that breaks the wait declared first (the default)."""
    return min(edges, key=lambda e: (e.since, e.waiter, e.seq, e.target))


def newest_waiting(edges: Sequence[WaitEdge]) -> WaitEdge:
    """The rule that breaks the wait declared last."""
    return max(edges, key=lambda e: (e.since, e.waiter, e.seq, e.target))


RULES: dict[str, BreakRule] = {"longest": longest_waiting, "newest": newest_waiting}


def rule_of(rule: str | BreakRule) -> BreakRule:
    """The break rule ``rule`` names (``"longest"``, ``"newest"``), or ``rule`` itself: a
    function of the declared waits of a deadlock returning the one to break."""
    if isinstance(rule, str):
        try:
            return RULES[rule]
        except KeyError:
            raise ValueError(
                f"deadlock_rule is one of {', '.join(map(repr, RULES))} or a function choosing "
                f"one WaitEdge of a deadlock; got {rule!r}"
            ) from None
    if not callable(rule):
        raise TypeError(f"deadlock_rule is 'longest', 'newest' or a function, got {type(rule).__qualname__}")
    return rule


def check_interval(interval: float | None) -> float | None:
    """``interval`` as a number of seconds, ``None`` (no detector) for ``None`` or 0."""
    if interval is None or (interval == 0 and not isinstance(interval, bool)):
        return None
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < math.inf:
        raise ValueError(
            f"deadlock_interval is a number of seconds above 0 (0 or None: no detector), got {interval!r}"
        )
    return float(interval)


@dataclass(frozen=True, slots=True)
class Deadlock:
    """A deadlock the detector broke: the runs of its ``cycle`` (each waits for the next, the
    last for the first; the first is the broken one), the ``broken`` wait, and when."""

    cycle: tuple[str, ...]
    broken: WaitEdge
    at: float


class _Resume(Protocol):
    def __call__(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> Awaitable[None]: ...


async def declare(store: Store, waiter: str, seq: int, call_type: str, targets: object) -> None:
    """Record that run ``waiter``, waiting at step ``seq`` for ``call_type``, waits for the
    runs ``targets`` (a list). A failure is logged, not raised: the wait is committed."""
    # (only run ids: the list is run data, which ctx.put may have written anything to)
    runs = [t for t in targets if is_run_id(t)] if isinstance(targets, (list, tuple)) else []
    if not runs:
        return
    try:
        await store.shared_state.waits_add(waiter, seq, call_type, runs)
    except Exception as exc:
        log.warning(
            "dflow: could not declare that run %s waits for %s: %s",
            waiter,
            ", ".join(runs),
            exc,
            extra={"dflow_run": waiter},
        )


class DeadlockDetector:
    """Looks for deadlocks every ``interval`` seconds while it holds the lease (see the
    module), and breaks each by ``rule`` through ``resume`` (the runtime's). ``listeners``
    are called with each ``Deadlock`` broken. It waits and reads the time on ``clock``."""

    def __init__(
        self,
        store: Store,
        resume: _Resume,
        *,
        interval: float,
        rule: str | BreakRule = "longest",
        token: str,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        checked = check_interval(interval)
        if checked is None:
            raise ValueError("a DeadlockDetector needs an interval above 0")
        self.store = store
        self.interval = checked
        self.rule = rule_of(rule)
        self.token = token
        self.clock = clock
        self.listeners: list[Callable[[Deadlock], None]] = []
        self._resume = resume
        self._branches: dict[tuple[str, int], tuple[str, ...]] = {}  # (run, join seq): its branches

    @property
    def lease(self) -> float:
        """Seconds the lease lasts: a detector that died is replaced after this."""
        return max(3 * self.interval, 1.0)

    async def run(self) -> None:
        """Look every ``interval`` seconds while holding the lease, until cancelled."""
        try:
            backend = self.store.shared_state
        except ConfigurationError as exc:
            log.info("dflow: no deadlock detection: %s", exc)
            return
        failing = False
        try:
            while True:
                await self.clock.sleep(self.interval)
                try:
                    # (the lease is taken only while there are waits to look at: idle, a
                    # worker reads one empty hash per interval and writes nothing)
                    if await backend.waits_list() and await backend.waits_lease(self.token, self.lease):
                        await self.detect(backend)
                    failing = False
                except Exception as exc:
                    if not failing:  # once per streak of failures (the store may be down a while)
                        log.warning(
                            "dflow: looking for deadlocks failed (%s: %s); trying again quietly",
                            type(exc).__name__,
                            " ".join(str(exc).split())[:300],
                        )
                        log.debug("dflow: looking for deadlocks failed", exc_info=True)
                    failing = True
        finally:
            try:
                await asyncio.wait_for(backend.waits_lease(self.token, 0), 1.0)
            except (Exception, asyncio.CancelledError):
                pass

    async def detect(self, backend: StateBackend | None = None) -> list[Deadlock]:
        """One look: drop the declared waits that are over, break one wait in each deadlock
        found; the deadlocks broken."""
        backend = backend or self.store.shared_state
        edges = await backend.waits_list()
        if not edges:
            return []
        infos: dict[str, RunInfo | None] = {}
        await self._read(infos, {e.waiter for e in edges})
        stale, live = _sorted_out(edges, infos)
        if stale:
            await backend.waits_drop(stale)
        if not live:
            return []
        waits = await self._explore(infos, live)
        broken = []
        for knot in _knots(waits):
            deadlock = await self._break(backend, knot, waits, live, infos)
            if deadlock is not None:
                broken.append(deadlock)
        if len(self._branches) > MAX_RUNS:
            self._branches.clear()
        return broken

    async def _read(self, infos: dict[str, RunInfo | None], runs: Iterable[str]) -> None:
        missing = [t for t in dict.fromkeys(runs) if t not in infos]
        for i in range(0, len(missing), _READS):
            some = missing[i : i + _READS]
            infos.update(zip(some, await asyncio.gather(*(self.store.get_run(t) for t in some))))

    async def _explore(
        self, infos: dict[str, RunInfo | None], live: dict[str, list[WaitEdge]]
    ) -> dict[str, list[str]]:
        """The runs reachable from the declared waits that wait for others, each with the
        runs it waits for (any one of which may let it go on)."""
        waits: dict[str, list[str]] = {}
        frontier = list(live)
        seen = set(frontier)
        while frontier and len(seen) <= MAX_RUNS:
            await self._read(infos, frontier)
            following: list[str] = []
            for run in frontier:
                targets = await self._waits_of(run, infos, live)
                if targets:
                    waits[run] = targets
                    for t in targets:
                        if t not in seen:
                            seen.add(t)
                            following.append(t)
            frontier = following
        return waits

    async def _waits_of(
        self, run: str, infos: dict[str, RunInfo | None], live: dict[str, list[WaitEdge]]
    ) -> list[str]:
        info = infos[run]
        if info is None or info.status is not RunStatus.WAITING:
            return []  # it runs, sleeps or has ended: it may go on
        if run in live:
            return list(dict.fromkeys(e.target for e in live[run]))
        if info.waiting_for != "join":
            return []  # it waits for a call nobody declared: it may come
        branches = await self._branches_of(run, info.seq)
        await self._read(infos, branches)
        unfinished = []
        for b in branches:
            i = infos[b]
            if i is not None and not i.status.finished:
                unfinished.append(b)
        return unfinished

    async def _branches_of(self, run: str, join_seq: int) -> tuple[str, ...]:
        """The branch runs of the join ``run`` waits at: from the record of its fork step."""
        key = (run, join_seq)
        found = self._branches.get(key)
        if found is None:
            found = ()
            for rec in reversed(await self.store.get_steps(run)):
                if rec.status is StepStatus.FORKED and rec.seq == join_seq - 1:
                    out = rec.output
                    if isinstance(out, list):
                        found = tuple(t for t in out if isinstance(t, str))
                    break
            self._branches[key] = found
        return found

    async def _break(
        self,
        backend: StateBackend,
        knot: set[str],
        waits: dict[str, list[str]],
        live: dict[str, list[WaitEdge]],
        infos: dict[str, RunInfo | None],
    ) -> Deadlock | None:
        """Break one declared wait of ``knot`` (runs each waiting only for runs of it),
        after reading its runs again: each must still wait where it did."""
        candidates = [e for run in sorted(knot) for e in live.get(run, ()) if e.target in knot]
        if not candidates:
            return None  # (joins alone never make a cycle)
        again: dict[str, RunInfo | None] = {}
        await self._read(again, knot)
        for run in knot:
            before, now = infos[run], again[run]
            if (
                now is None
                or before is None
                or (now.status, now.seq, now.waiting_for) != (before.status, before.seq, before.waiting_for)
            ):
                return None  # it moved: look again next time
        chosen = self.rule(candidates)
        if chosen not in candidates:
            raise ValueError(
                f"the deadlock rule {self.rule!r} returned {chosen!r}, which is none of the "
                "waits it was given"
            )
        cycle = (chosen.waiter, *_path(waits, knot, chosen.target, chosen.waiter))
        waited = max(0.0, self.clock.time() - chosen.since)
        shown = " -> ".join((*cycle, chosen.waiter))
        error = {
            "type": DEADLOCK_TYPE,
            "message": f"deadlock: the runs {shown} wait for each other; the wait of run {chosen.waiter!r} "
            f"at step {chosen.seq} (for call {chosen.call_type!r}) was broken after {waited:.1f}s",
            "cycle": list(cycle),
        }
        try:
            await self._resume(chosen.waiter, chosen.call_type, encode(error), failed=True, seq=chosen.seq)
        except (NotWaitingError, RunNotFoundError):
            await backend.waits_drop(live[chosen.waiter])
            return None  # it went on meanwhile
        await backend.waits_drop(live[chosen.waiter])  # (its wait is over; another error: tried again)
        deadlock = Deadlock(cycle, chosen, self.clock.time())
        log.warning("dflow: %s", error["message"], extra={"dflow_run": chosen.waiter})
        for listener in list(self.listeners):
            try:
                listener(deadlock)
            except Exception:
                log.exception("dflow: a deadlock listener failed")
        return deadlock


def _path(waits: dict[str, list[str]], within: set[str], start: str, goal: str) -> list[str]:
    """The runs of a shortest path of waits from ``start`` to ``goal`` in ``within``,
    ``start`` included, ``goal`` not."""
    back: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        run = todo.popleft()
        if run == goal:
            break
        for t in waits.get(run, ()):
            if t in within and t not in back:
                back[t] = run
                todo.append(t)
    path: list[str] = []
    at: str | None = back.get(goal) if goal in back else None
    while at is not None:
        path.append(at)
        at = back[at]
    return path[::-1]


def _knots(waits: dict[str, list[str]]) -> list[set[str]]:
    """The sets of runs that can never go on, each closed (every run of it waits only for
    runs of it) and strongly connected: one wait broken in each frees it."""
    blocked = _blocked(waits)
    # the strongly connected components of the blocked runs with no wait leaving them
    graph = {run: [t for t in waits[run] if t in blocked] for run in blocked}
    return [c for c in _components(graph) if all(t in c for run in c for t in graph[run])]


def _blocked(waits: dict[str, list[str]]) -> set[str]:
    """The runs of ``waits`` that cannot go on: all but those waiting for one that may,
    repeatedly (a run not in ``waits`` may go on)."""
    blocked = set(waits)
    waited_by: dict[str, list[str]] = {}
    for run, targets in waits.items():
        for t in targets:
            waited_by.setdefault(t, []).append(run)
    todo = [run for run, targets in waits.items() if any(t not in blocked for t in targets)]
    while todo:
        run = todo.pop()
        if run in blocked:
            blocked.discard(run)
            todo.extend(w for w in waited_by.get(run, ()) if w in blocked)
    return blocked


def _sorted_out(
    edges: list[WaitEdge], infos: dict[str, RunInfo | None]
) -> tuple[list[WaitEdge], dict[str, list[WaitEdge]]]:
    """The declared waits that are over (the run ended, or went past the step that waited),
    and those still live (the run waits at that step, for that call), by waiting run. A wait
    whose step is yet to commit is in neither."""
    stale: list[WaitEdge] = []
    live: dict[str, list[WaitEdge]] = {}
    for e in edges:
        info = infos[e.waiter]
        if info is None or info.status.finished or info.seq > e.seq:
            stale.append(e)
        elif info.status is RunStatus.WAITING and info.seq == e.seq and info.waiting_for == e.call_type:
            live.setdefault(e.waiter, []).append(e)
    return stale, live


def _components(graph: dict[str, list[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = graph[node]
            if i < len(targets):
                work.append((node, i + 1))
                t = targets[i]
                if t not in index:
                    work.append((t, 0))
                elif t in on_stack:
                    low[node] = min(low[node], index[t])
                continue
            if low[node] == index[node]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == node:
                        break
                out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out
