"""The data of the runs a ``RedisStore`` stepped last, kept so that a claim need not read the
run's data hash again when nothing can have changed it.

Only a step's commit changes a run's data once the run is created (``commit.lua``), and a
commit always moves the run to another step or attempt, except a wait, which keeps its step
until the call comes (then the step after). So after this store commits a step it knows the
run's data exactly (what it claimed, with the commit's changes), and knows it for the steps
its commit leads to: the next message's step and attempt (an advance, a fork's join), or the
waiting step and the one after (a wait). A claim of one of those steps sends the run's create
token (``ctok``: each run, and each new run of a trace id, has its own), and the script leaves
the data out when the run's token is that one; any other claim reads the whole hash. A commit
taken for this worker inside a commit (fused) of the same run leaves it out too.

Bounded: the runs stepped last, up to ``MAX_RUNS`` and ``MAX_BYTES`` of values in all; a run
whose data is larger than ``MAX_RUN_BYTES`` is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from dflow.store import Advance, Claim, Fork, Transition, Wait
from dflow.wire.values import Message

__all__ = ["MAX_BYTES", "MAX_RUNS", "MAX_RUN_BYTES", "RunDataCache"]

MAX_RUNS = 256
MAX_BYTES = 64 << 20
MAX_RUN_BYTES = 4 << 20


@dataclass(slots=True)
class _Kept:
    ctok: str
    steps: tuple[tuple[int, int], ...]  #: the (seq, attempt) of the claims it serves
    data: Mapping[str, bytes]
    size: int  #: of the keys and values


def _next_steps(message: Message, transition: Transition) -> tuple[tuple[int, int], ...]:
    """The steps whose claims see the data a commit of ``message`` with ``transition`` left."""
    if type(transition) is Advance:
        return ((transition.message.seq, transition.message.attempt),)
    if type(transition) is Fork:
        return ((transition.join.seq, transition.join.attempt),)
    if type(transition) is Wait:  # (its on_init's claim; RESUME's step, the one after)
        return ((message.seq, message.attempt), (message.seq + 1, 0))
    return ()  # the run ended


def _changed(data: Mapping[str, bytes], changes: Mapping[str, bytes | None]) -> Mapping[str, bytes]:
    if not changes:
        return data
    new = dict(data)
    for k, v in changes.items():
        if v is None:
            new.pop(k, None)
        else:
            new[k] = v
    return new


class RunDataCache:
    """The data of the runs stepped last (the least recently stepped go first)."""

    __slots__ = ("_bytes", "_kept")

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0

    def known(self, message: Message) -> tuple[str, Mapping[str, bytes] | None]:
        """The run's create token and data when they are known for ``message``'s step, else
        ``("", None)``: the claim then reads the data."""
        kept = self._kept.get(message.trace_id)
        if kept is None or (message.seq, message.attempt) not in kept.steps:
            return "", None
        return kept.ctok, kept.data

    def claimed(self, claim: Claim, ctok: str) -> None:
        """Keep the data ``claim`` came with (read or known), for its commit."""
        m = claim.message
        if ctok:
            self._keep(m.trace_id, ctok, ((m.seq, m.attempt),), claim.data)
        else:  # a run of an earlier release, or a branch run: no token to check it by
            self.forget(m.trace_id)

    def committed(
        self, claim: Claim, changes: Mapping[str, bytes | None], transition: Transition
    ) -> Mapping[str, bytes]:
        """After ``claim``'s commit was applied: the run's data now, kept for the steps the
        commit leads to (when the claim's was kept)."""
        trace = claim.message.trace_id
        data = _changed(claim.data, changes)
        kept = self._kept.get(trace)
        steps = _next_steps(claim.message, transition)
        if kept is not None and kept.data is claim.data and steps:
            self._keep(trace, kept.ctok, steps, data)
        else:
            self.forget(trace)
        return data

    def forget(self, trace_id: str) -> None:
        kept = self._kept.pop(trace_id, None)
        if kept is not None:
            self._bytes -= kept.size

    def _keep(
        self, trace_id: str, ctok: str, steps: tuple[tuple[int, int], ...], data: Mapping[str, bytes]
    ) -> None:
        old = self._kept.pop(trace_id, None)
        if old is not None:
            self._bytes -= old.size
        size = (
            old.size
            if old is not None and old.data is data
            else sum(len(k) + len(v) for k, v in data.items())
        )
        if size > MAX_RUN_BYTES:
            return
        self._kept[trace_id] = _Kept(ctok, steps, data, size)
        self._bytes += size
        while len(self._kept) > MAX_RUNS or self._bytes > MAX_BYTES:
            _, out = self._kept.popitem(last=False)
            self._bytes -= out.size
