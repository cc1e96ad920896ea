"""The data of the runs a ``RedisStore`` stepped last, kept so that a claim need not read the
run's data hash again when nothing has changed it.

A run's data has a version in its run hash (``claim_step.lua``): the token of the claim whose
commit wrote the run last (of its create, at first) and the time of that write. Every commit
gives the run a new version, and only a create or a commit writes a run's data. After this
store's commit is applied it knows the run's data exactly (what it claimed, with the commit's
changes) and its version (the commit's reply says it). A claim of the run sends that version,
and the script leaves the data out when it is still the run's; any other claim (another
worker committed since, a commit whose reply was lost, a commit Redis lost in a failover, a
new run of the trace id) reads the whole hash, whose version comes with it. A commit that takes
the worker's next step (fused) of the same run leaves it out too.

Bounded: the runs stepped last, up to ``MAX_RUNS`` and ``MAX_BYTES`` of memory in all (the
dicts, names and values, as ``sys.getsizeof`` counts them); a run whose data takes more than
``MAX_RUN_BYTES`` is not kept.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from dflow.store import Claim
from dflow.wire.values import Message

__all__ = ["MAX_BYTES", "MAX_RUNS", "MAX_RUN_BYTES", "RunDataCache"]

MAX_RUNS = 256
MAX_BYTES = 64 << 20
MAX_RUN_BYTES = 4 << 20

_size = sys.getsizeof


@dataclass(slots=True)
class _Kept:
    version: str
    data: Mapping[str, bytes]
    fields: int  #: the memory of its names and values


def _fields(data: Mapping[str, bytes]) -> int:
    return sum(_size(k) + _size(v) for k, v in data.items())


def _changed(kept: _Kept, changes: Mapping[str, bytes | None]) -> tuple[dict[str, bytes], int]:
    """``kept``'s data with ``changes`` applied, and the memory of its names and values."""
    new = dict(kept.data)
    fields = kept.fields
    for k, v in changes.items():
        old = new.pop(k, None)
        if old is not None:
            fields -= _size(k) + _size(old)
        if v is not None:
            new[k] = v
            fields += _size(k) + _size(v)
    return new, fields


class RunDataCache:
    """The data of the runs stepped last (the least recently stepped go first)."""

    __slots__ = ("_bytes", "_kept")

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0

    def known(self, message: Message) -> tuple[str, Mapping[str, bytes] | None]:
        """The version and data of ``message``'s run that this store holds, else ``("", None)``."""
        kept = self._kept.get(message.trace_id)
        return ("", None) if kept is None else (kept.version, kept.data)

    def claimed(self, claim: Claim, version: str) -> None:
        """Keep the data ``claim`` came with (read, or known at ``version``), for its commit."""
        trace = claim.message.trace_id
        if not version:  # a run no commit of this release wrote: nothing to check it by
            self.forget(trace)
            return
        old = self._kept.get(trace)
        fields = old.fields if old is not None and old.data is claim.data else _fields(claim.data)
        self._keep(trace, _Kept(version, claim.data, fields))

    def committed(
        self, claim: Claim, changes: Mapping[str, bytes | None], version: str, *, ended: bool
    ) -> Mapping[str, bytes]:
        """After ``claim``'s commit was applied, which gave the run's data ``version``: the
        run's data now, kept unless the run ``ended``."""
        trace = claim.message.trace_id
        kept = self._kept.get(trace)
        if kept is None or kept.data is not claim.data:
            kept = _Kept("", claim.data, _fields(claim.data))
        data, fields = _changed(kept, changes) if changes else (claim.data, kept.fields)
        if ended or not version:
            self.forget(trace)
        else:
            self._keep(trace, _Kept(version, data, fields))
        return data

    def forget(self, trace_id: str) -> None:
        kept = self._kept.pop(trace_id, None)
        if kept is not None:
            self._bytes -= _size(kept.data) + kept.fields

    def _keep(self, trace_id: str, kept: _Kept) -> None:
        self.forget(trace_id)
        size = _size(kept.data) + kept.fields
        if size > MAX_RUN_BYTES:
            return
        self._kept[trace_id] = kept
        self._bytes += size
        while self._kept and (len(self._kept) > MAX_RUNS or self._bytes > MAX_BYTES):
            _, out = self._kept.popitem(last=False)
            self._bytes -= _size(out.data) + out.fields
