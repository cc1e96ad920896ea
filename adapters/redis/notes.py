"""The notes the Redis store keeps on its runs (``dflow.run_notes``): fields of each run's
hash ``P:r:<trace>`` (in the run's bucket, so one slot on a Redis Cluster), which expire with
it; one Lua script a write, so a check and the write it decides are one. The scripts run
through the store's ``ScriptCalls``: with the store's ``wait``, a note is acknowledged once
that many replicas have it, as the store's other writes (``StoreError`` otherwise).

A business key is the field ``bkey``, indexed in ``P:bk:<key>`` of the run's bucket (a sorted
set of trace ids by creation time, beside the other indexes of the bucket): a search reads
the index of each bucket, newest first, and the runs it names, and drops the entries of runs
that expired (or whose id a new run took)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from dflow.context import RunInfo
from dflow.errors import RunNotFoundError
from dflow.run_notes import MAX_KEYED_RUNS, MAX_RERUNS, UNCREATED_AFTER, RunNotes, check_key_search

from .calls import ScriptCalls
from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["SCRIPTS", "RedisRunNotes"]

#: the scripts, by the name of their file
SCRIPTS = ("rerun_note", "rerun_drop", "business_key")


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
        self._key = client.register_script(_read("business_key"))

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
            [self._run_key(trace_id), f"{p}:bk:{key}"],
            [key, f"{p}:bk:", trace_id, MAX_KEYED_RUNS],
            at=at,
        )
        if int(done) == 0:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )

    async def find_by_business_key(self, key: str, limit: int = 50) -> list[RunInfo]:
        check_key_search(key, limit)
        found = await asyncio.gather(*(self._keyed_in(f"{p}:bk:{key}", key, limit) for p in self._prefixes))
        runs = [r for bucket in found for r in bucket]
        runs.sort(key=lambda r: (r.created, r.trace_id), reverse=True)
        return runs[:limit]

    async def _keyed_in(self, index: str, key: str, limit: int) -> list[RunInfo]:
        """The newest ``limit`` runs of one bucket's index of ``key`` that still have it."""
        found: list[RunInfo] = []
        gone: list[bytes] = []
        start = 0
        with store_errors():
            while len(found) < limit:
                ids = cast("list[bytes]", await self.redis.zrevrange(index, start, start + limit - 1))
                if not ids:
                    break
                infos = await asyncio.gather(*(self._get_run(bytes(t).decode()) for t in ids))
                for t, info in zip(ids, infos, strict=True):
                    if info is None or info.business_key != key:  # (expired, or its id taken by a new run)
                        gone.append(t)
                    elif len(found) < limit:
                        found.append(info)
                start += len(ids)
            if gone:
                await self.redis.zrem(index, *gone)
        return found
