"""The notes the Redis store keeps on its runs (``dflow.run_notes``): fields of each run's
hash ``P:r:<trace>`` (in the run's bucket, so one slot on a Redis Cluster), which expire with
it; one Lua script a write, so a check and the write it decides are one."""

from __future__ import annotations

from typing import Any

from dflow.errors import RunNotFoundError
from dflow.run_notes import MAX_RERUNS, RunNotes

from .client import Client
from .errors import store_errors
from .scripts import _read

__all__ = ["SCRIPTS", "RedisRunNotes"]

#: the scripts, by the name of their file
SCRIPTS = ("rerun_note", "rerun_drop")


class RedisRunNotes(RunNotes):
    """``RunNotes`` in Redis, beside a ``RedisStore``: its client and ``run_key``, the key
    of a run's hash (under the prefix of the run's bucket)."""

    def __init__(self, client: Client, run_key: Any) -> None:
        self.redis = client
        self._run_key = run_key
        self._note = client.register_script(_read("rerun_note"))
        self._drop = client.register_script(_read("rerun_drop"))

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
