"""The notes the Redis store keeps on its runs (``dflow.run_notes``): fields of each run's
hash ``P:r:<trace>`` (in the run's bucket, so one slot on a Redis Cluster), which expire with
it; one Lua script a write, so a check and the write it decides are one. The scripts run
through the store's ``ScriptCalls``: with the store's ``wait``, a note is acknowledged once
that many replicas have it, as the store's other writes (``StoreError`` otherwise).

A business key is the field ``bkey``, indexed in ``P:bk:<key>`` of the run's bucket (a sorted
set of trace ids by creation time, beside the other indexes of the bucket). A finished run
with a key waits for its keys to expire in ``P:expiryp`` with an entry that names the key
(``listed.lua``), and the store's DUE pass takes it out of the index then, as out of the
listings: the index lives as long as the runs it names, and goes with the last. A search
reads the index of each bucket in the order asked, in batches, with the runs it names, until
it has ``limit`` runs that pass its filters (or the index ends), and drops the entries of
runs it finds gone (expired before DUE saw them, or whose id a new run took)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from dflow.context import RunInfo, RunStatus
from dflow.errors import RunNotFoundError
from dflow.run_notes import (
    MAX_KEYED_RUNS,
    MAX_RERUNS,
    UNCREATED_AFTER,
    KeySearch,
    RunNotes,
    check_key_search,
)
from dflow.run_pages import ANY_TIME, StartedWindow

from .calls import ScriptCalls
from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["SCRIPTS", "RedisRunNotes"]

#: the scripts, by the name of their file (``business_key`` after the fragment ``listed``)
SCRIPTS = ("rerun_note", "rerun_drop", "business_key")
#: how many entries of an index a search with filters reads at a time (at least)
FILTERED_BATCH = 100
READ_AT_ONCE = 16  #: runs a search reads at once


class RedisRunNotes(RunNotes):
    """``RunNotes`` in Redis, beside a ``RedisStore``: its client, ``prefixes`` (each
    bucket's key prefix), ``bucket_of`` (the bucket of a run), ``get_run`` (its read of a
    run) and ``calls`` (how its writes reach Redis, waiting for replicas with ``wait``)."""

    def __init__(
        self,
        client: Client,
        prefixes: Sequence[str],
        bucket_of: Callable[[str], int],
        get_run: Callable[[str], Awaitable[RunInfo | None]],
        calls: ScriptCalls,
    ) -> None:
        self.redis = client
        self._prefixes = tuple(prefixes)
        self._bucket_of = bucket_of
        self._get_run = get_run
        self._calls = calls
        self._note = client.register_script(_read("rerun_note"))
        self._drop = client.register_script(_read("rerun_drop"))
        self._key = client.register_script("\n".join((_read("listed"), _read("business_key"))))

    def _prefix_of(self, trace_id: str) -> str:
        return self._prefixes[self._bucket_of(trace_id)]

    def _run_key(self, trace_id: str) -> str:
        return f"{self._prefix_of(trace_id)}:r:{trace_id}"

    async def note_rerun(
        self,
        trace_id: str,
        rerun: str,
        *,
        again: bool = False,
        replacing: str | None = None,
        older_than: float = UNCREATED_AFTER,
    ) -> str | None:
        args = [rerun, "1" if again else "0", MAX_RERUNS, replacing or "", repr(float(older_than))]
        got = await self._calls.call(
            self._note, [self._run_key(trace_id)], args, at=self._bucket_of(trace_id)
        )
        if int(got[0]) == 0:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )
        return None if int(got[0]) == 1 else bytes(got[1]).decode()

    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        await self._calls.call(self._drop, [self._run_key(trace_id)], [rerun], at=self._bucket_of(trace_id))

    async def set_business_key(self, trace_id: str, key: str) -> None:
        at = self._bucket_of(trace_id)
        p = self._prefixes[at]
        done = await self._calls.call(
            self._key,
            [self._run_key(trace_id), f"{p}:bk:{key}", f"{p}:expiry", f"{p}:expiryp"],
            [key, p, trace_id, MAX_KEYED_RUNS, time.time()],
            at=at,
        )
        if int(done) == 0:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )

    async def find_by_business_key(
        self,
        key: str,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        window: StartedWindow = ANY_TIME,
        oldest_first: bool = False,
    ) -> list[RunInfo]:
        search = check_key_search(
            key, limit, status=status, pipeline=pipeline, window=window, oldest_first=oldest_first
        )
        found = await asyncio.gather(*(self._keyed_in(f"{p}:bk:{key}", search) for p in self._prefixes))
        return search.first(r for bucket in found for r in bucket)

    async def _keyed_in(self, index: str, search: KeySearch) -> list[RunInfo]:
        """The first ``search.limit`` runs of one bucket's index of the key that ``search``
        finds, in its order (an index's order within one score is by trace id, as a search's).
        The index is read in batches by score (the runs' creation times, within the search's
        window), each from the last score read on: an entry added or taken out meanwhile moves
        no run out of the reads, and a run read once is not read again."""
        found: list[RunInfo] = []
        gone: list[bytes] = []
        seen: set[bytes] = set()
        batch = max(search.limit, FILTERED_BATCH) if search.filtered else search.limit
        edge, end = _bounds(search)
        at_edge = 0  # entries of score ``edge`` read already
        with store_errors():
            while len(found) < search.limit:
                rows = await self._batch(index, search.oldest_first, (edge, end), at_edge, batch)
                fresh = [(t, score) for t, score in rows if t not in seen]
                if fresh:
                    last = fresh[-1][1]
                    tied = sum(1 for _, score in fresh if score == last)
                    at_edge, edge = (at_edge + tied if last == edge else tied), last
                    seen.update(t for t, _ in fresh)
                    await self._keep_found(fresh, search, found, gone)
                else:
                    at_edge += len(rows)  # (all read already: one was added at the edge meanwhile)
                if len(rows) < batch:
                    break
            if gone:
                await self.redis.zrem(index, *gone)
        return found

    async def _keep_found(
        self, rows: list[tuple[bytes, float]], search: KeySearch, found: list[RunInfo], gone: list[bytes]
    ) -> None:
        """Add to ``found`` the runs of ``rows`` the search finds; to ``gone``, the entries of
        runs that are no more (expired, or their id taken by a new run)."""
        infos = await self._runs([bytes(t).decode() for t, _ in rows])
        for (t, _), info in zip(rows, infos, strict=True):
            if info is None or info.business_key != search.key:
                gone.append(t)
            elif len(found) < search.limit and search.finds(info):
                found.append(info)

    async def _batch(
        self, index: str, oldest_first: bool, span: tuple[float | str, float | str], skip: int, batch: int
    ) -> list[tuple[bytes, float]]:
        """Up to ``batch`` entries of ``index``, with their scores, from score ``span[0]`` to
        ``span[1]`` in the search's order, past the first ``skip``."""
        if oldest_first:
            rows = await self.redis.zrangebyscore(index, *span, start=skip, num=batch, withscores=True)
        else:
            rows = await self.redis.zrevrangebyscore(index, *span, start=skip, num=batch, withscores=True)
        return cast("list[tuple[bytes, float]]", rows)

    async def _runs(self, ids: list[str]) -> list[RunInfo | None]:
        """The runs ``ids``, read a few at a time (so a search holds few of the pool's
        connections, which the steps of this process share)."""
        out: list[RunInfo | None] = []
        for i in range(0, len(ids), READ_AT_ONCE):
            out += await asyncio.gather(*(self._get_run(t) for t in ids[i : i + READ_AT_ONCE]))
        return out


def _bounds(search: KeySearch) -> tuple[float | str, float | str]:
    """The scores a search reads from and to, in its order: its window's bounds a
    millisecond wider (the window itself, by the millisecond, is the filter's), or the ends."""
    w = search.window
    low: float | str = "-inf" if w.after is None else w.after - 0.001
    high: float | str = "+inf" if w.before is None else w.before + 0.001
    return (low, high) if search.oldest_first else (high, low)
