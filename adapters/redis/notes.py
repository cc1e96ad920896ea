"""The notes the Redis store keeps on its runs (``dflow.run_notes``): fields of each run's
hash ``P:r:<trace>`` (in the run's bucket, so one slot on a Redis Cluster), which expire with
it; one Lua script a write, so a check and the write it decides are one.

A business key is the field ``bkey``, indexed in ``P:bk:<key>`` of the run's bucket (a sorted
set of trace ids by creation time, beside the other indexes of the bucket). A finished run
with a key waits for its keys to expire in ``P:expiryp`` with an entry that names the key
(``listed.lua``), and the store's DUE pass takes it out of the index then, as out of the
listings: the index lives as long as the runs it names, and goes with the last. A search
reads the index of each bucket, newest first, and the runs it names, and drops the entries of
runs it finds gone (expired before DUE saw them, or whose id a new run took)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from dflow.context import RunInfo
from dflow.errors import RunNotFoundError
from dflow.run_notes import MAX_KEYED_RUNS, MAX_RERUNS, RunNotes, check_key_search

from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["SCRIPTS", "RedisRunNotes"]

#: the scripts, by the name of their file (``business_key`` after the fragment ``listed``)
SCRIPTS = ("rerun_note", "rerun_drop", "business_key")


class RedisRunNotes(RunNotes):
    """``RunNotes`` in Redis, beside a ``RedisStore``: its client, ``prefixes`` (each
    bucket's key prefix), ``prefix_of`` (the prefix of a run's bucket) and ``get_run`` (its
    read of a run)."""

    def __init__(
        self,
        client: Client,
        prefixes: Sequence[str],
        prefix_of: Callable[[str], str],
        get_run: Callable[[str], Awaitable[RunInfo | None]],
    ) -> None:
        self.redis = client
        self._prefixes = tuple(prefixes)
        self._prefix_of = prefix_of
        self._get_run = get_run
        self._note = client.register_script(_read("rerun_note"))
        self._drop = client.register_script(_read("rerun_drop"))
        self._key = client.register_script("\n".join((_read("listed"), _read("business_key"))))

    def _run_key(self, trace_id: str) -> str:
        return f"{self._prefix_of(trace_id)}:r:{trace_id}"

    async def note_rerun(self, trace_id: str, rerun: str, *, again: bool = False) -> str | None:
        with store_errors():
            got = await self._note(
                keys=[self._run_key(trace_id)], args=[rerun, "1" if again else "0", MAX_RERUNS]
            )
        if int(got[0]) == 0:
            raise RunNotFoundError(
                f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id
            )
        return None if int(got[0]) == 1 else bytes(got[1]).decode()

    async def drop_rerun(self, trace_id: str, rerun: str) -> None:
        with store_errors():
            await self._drop(keys=[self._run_key(trace_id)], args=[rerun])

    async def set_business_key(self, trace_id: str, key: str) -> None:
        p = self._prefix_of(trace_id)
        with store_errors():
            done = await self._key(
                keys=[self._run_key(trace_id), f"{p}:bk:{key}", f"{p}:expiry", f"{p}:expiryp"],
                args=[key, p, trace_id, MAX_KEYED_RUNS, time.time()],
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
