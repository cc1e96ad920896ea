"""``RedisStore``: runs, data, step records, timers, leases and joins in Redis.

Here are its writes, one script call each; what a commit sends and reads back is in
``commits``, its script calls in ``calls``. It hands its reads to a part it owns, ``RunReads``
(``reads``), and its scans of what falls due to another, ``DueScan`` (``due_scan``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from dflow.context import RunInfo, RunStatus, StepRecord
from dflow.errors import (
    RefusedMessageError,
    RunExistsError,
)
from dflow.mailbox import Mailbox
from dflow.parts import StepParts
from dflow.store import (
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    NewRun,
    RunPage,
    Store,
    Transition,
    fused_variant,
)
from dflow.wire.values import Message

from . import commits, scripts
from .calls import ScriptCalls
from .client import (
    connect,
    disconnect,
    is_cluster,
)
from .codec import claimed, encode_transition, resumed
from .data_cache import RunDataCache
from .due_scan import DueScan
from .errors import store_errors
from .fusable import fused_streams
from .keyspace import Keyspace
from .live import RedisLiveFeed
from .notes import RedisRunNotes
from .parts import RedisParts
from .rate_limits import RedisTokenBucket
from .reads import RunReads
from .replica_writes import check_wait
from .schedules import RedisScheduleBook
from .state import RedisStateBackend
from .workers import RedisWorkerBeats

if TYPE_CHECKING:
    from .transport import RedisStreamsTransport

__all__ = ["RedisStore"]

log = logging.getLogger("dflow.redis")

_pack = msgpack.Packer(use_bin_type=True).pack


class RedisStore(Store, StepParts):
    """``Store`` on Redis (redis-py's asyncio client), one server or a Redis Cluster.

    ``url``: ``redis://[user:password@]host:port/db`` or ``rediss://`` for TLS, or
    ``redis+cluster://[user:password@]host1:port1,host2:port2/`` (``rediss+cluster://``) for
    a cluster; other ``options`` go to the client (``ssl_ca_certs``, ``ssl_certfile``, ...).
    ``ttl``: seconds a finished run is kept. ``prefix`` namespaces every key. A flow built
    at run time is kept while a live run references it, then ``blob_ttl`` seconds more.
    ``transport``: a ``RedisStreamsTransport`` on the same server and database (or cluster),
    to write step messages to inside the store's own scripts (then the store is
    ``FusedDispatch``: one script call a step). ``streams``: how many buckets the keys are spread over (see ``keyspace``; 16 by
    default on a cluster, 1 on one server; the same as its transport's). ``wait``:
    each write is acknowledged only once that many replicas have it (``WAIT``), waiting up
    to ``wait_timeout`` seconds, else ``StoreError`` (it may be lost if the primary fails).
    Its ``shared_state`` is a ``RedisStateBackend`` on the same client and prefix, its
    ``schedules`` a ``RedisScheduleBook``.
    """

    keeps_deadlines = True

    def __new__(cls, *args: Any, **options: Any) -> RedisStore:
        fused = options.get("transport") is not None
        return super().__new__(fused_variant(cls) if fused else cls)

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "dflow",
        ttl: float = 7 * 86400,
        redispatch_after: float = 30.0,
        blob_ttl: float = 3600.0,
        transport: RedisStreamsTransport | None = None,
        streams: int | None = None,
        wait: int = 0,
        wait_timeout: float = 1.0,
        **options: Any,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.redispatch_after = redispatch_after
        self.blob_ttl = blob_ttl
        check_wait(wait, wait_timeout)
        self.wait, self.wait_timeout = wait, wait_timeout
        self.redis = connect(url, **options)
        self.cluster = is_cluster(self.redis)
        self._tokens = 0
        self._token_base = f"{os.getpid()}-{os.urandom(6).hex()}-"  # (unique across hosts and containers too)
        self._data = RunDataCache()  # the runs' data a claim need not read again (data_cache)
        keyspace = Keyspace((16 if self.cluster else 1) if streams is None else streams, cluster=self.cluster)
        # The group and consumer this store writes step messages for (fused), if any, and
        # each bucket's stream ('' when not fused).
        self._group = self._consumer = ""
        self._streams: tuple[str, ...] = ("",) * keyspace.n
        if transport is not None:
            self._streams, self._group, self._consumer = fused_streams(self.redis, url, transport, keyspace)
        #: how the keys are spread over buckets (and a cluster's slots)
        self.keyspace = keyspace
        self._prefixes = keyspace.names(prefix, "prefix")
        self._calls = ScriptCalls(
            self.redis,
            self._prefixes,
            self._streams,
            cluster=self.cluster,
            wait=wait,
            wait_timeout=wait_timeout,
            blob_ttl=blob_ttl,
        )
        self._reads = RunReads(
            self.redis,
            self._calls,
            keyspace,
            self._prefixes,
            prefix=prefix,
            ttl=ttl,
            wait=wait,
            wait_timeout=wait_timeout,
        )
        self._due = DueScan(
            self._calls, self._prefixes, self._streams, redispatch_after=redispatch_after, ttl=ttl
        )
        self._state: RedisStateBackend | None = None
        self._live: RedisLiveFeed | None = None
        self._beats: RedisWorkerBeats | None = None
        self._parts = RedisParts(self.redis, ttl, self._p)
        self._buckets: RedisTokenBucket | None = None
        self._notes: RedisRunNotes | None = None
        self._schedules: RedisScheduleBook | None = None

    @property
    def shared_state(self) -> RedisStateBackend:
        """The shared state beside this store (``dflow.State``, ``dflow.Circuit``)."""
        if self._state is None:
            self._state = RedisStateBackend(self.redis, self.prefix)
        return self._state

    @property
    def schedules(self) -> RedisScheduleBook:
        """The schedules beside this store (on its client and prefix)."""
        if self._schedules is None:
            self._schedules = RedisScheduleBook(self.redis, self.prefix)
        return self._schedules

    @property
    def live(self) -> RedisLiveFeed:
        """The live events of this store's runs (``dflow.live``): a stream per run."""
        if self._live is None:
            self._live = RedisLiveFeed(self.redis, self.prefix)
        return self._live

    @property
    def worker_beats(self) -> RedisWorkerBeats:
        """The beats of the workers of this store (``dflow.workers``): a key per worker that expires."""
        if self._beats is None:
            self._beats = RedisWorkerBeats(self.redis, self.prefix)
        return self._beats

    @property
    def token_bucket(self) -> RedisTokenBucket:
        """The token buckets of the steps' rate limits beside this store."""
        if self._buckets is None:
            self._buckets = RedisTokenBucket(self.redis, self.prefix)
        return self._buckets

    @property
    def run_notes(self) -> RedisRunNotes:
        """The notes on this store's runs (their reruns, their business keys): fields of each
        run's hash, and an index of business keys in each bucket."""
        if self._notes is None:
            self._notes = RedisRunNotes(self.redis, self._prefixes, self._at, self.get_run, self._calls)
        return self._notes

    def _at(self, trace_id: str) -> int:
        """The bucket of a run."""
        return self.keyspace.index(trace_id)

    def _p(self, trace_id: str) -> str:
        """The key prefix of a run's bucket."""
        return self._prefixes[self.keyspace.index(trace_id)]

    # -- writing -----------------------------------------------------------------------

    def _keys(self, at: int, trace_id: str | None, refs: Any = ()) -> list[str]:
        """The keys a script on bucket ``at`` declares (see ``ScriptCalls.keys``)."""
        return self._calls.keys(at, trace_id, refs)

    async def _run_script(
        self,
        name: str,
        args: list[Any],
        blobs: dict[str, bytes] | None = None,
        *,
        at: int = 0,
        keys: list[str] | None = None,
        writes: bool = True,
    ) -> Any:
        """Run script ``name`` on bucket ``at`` (see ``ScriptCalls.run``)."""
        return await self._calls.run(name, args, blobs, at=at, keys=keys, writes=writes)

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        frames = run.frames
        at = self._at(run.trace_id)
        keys = self._keys(at, run.trace_id, frames.blobs if frames else ())
        if keys and run.pipeline:
            keys.append(f"{self._prefixes[at]}:ixp:{run.pipeline}")
        args = commits.create_args(self, at, run, time.time())
        reply = await self._run_script("CREATE", args, frames.new_blobs if frames else None, at=at, keys=keys)
        if reply is None:
            raise RunExistsError(
                f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id
            )
        return [Message.decode(m) for m in reply[1]]

    def _token(self) -> str:
        self._tokens += 1
        return self._token_base + str(self._tokens)

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        token = self._token()
        body = message.encode()
        at = self._at(message.trace_id)
        version, data = self._data.known(message)
        args = scripts.CLAIM.args(
            prefix=self._prefixes[at],
            trace=message.trace_id,
            msg=body,
            seq=message.seq,
            attempt=message.attempt,
            key=message.key,
            kind=message.kind,
            now=time.time(),
            lease=lease,
            token=token,
            known=version,
        )
        keys = commits.claim_keys(self, at, message)
        r = await self._run_script("CLAIM", args, at=at, keys=keys, writes=False)
        if r is None:
            return None
        if type(r) is list:  # ['refused', why]; a claim comes packed (bytes)
            raise RefusedMessageError(
                f"the message of step {message.key!r} of run {message.trace_id!r} is refused: {r[1].decode()}"
            )
        claim, version = claimed(message, token, r, data)
        self._data.claimed(claim, version)
        return claim

    async def commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
        *,
        receipt: Any = None,
        take_lease: float | None = None,
    ) -> Committed:
        at = self._at(claim.message.trace_id)
        fused = bool(self._streams[at])
        ack = commits.receipt_here(self, at, receipt) if fused else ""
        take_token = self._token() if fused and take_lease is not None else ""
        encoded = encode_transition(transition, claim)
        if isinstance(transition, Fork):
            await commits.same_bucket(self, at, claim.message.trace_id, transition.children)
        args = commits.commit_args(self, at, claim, records, changes, encoded, ack, take_token, take_lease)
        keys = commits.commit_keys(self, at, claim, encoded)
        reply = await self._run_script("COMMIT", args, encoded.blobs, at=at, keys=keys)
        if reply is None:
            if fused:
                await commits.orphaned(self, at, claim.message)
            return Committed(False, acknowledged=bool(ack))
        if reply[0] == b"exists":
            child = reply[1].decode()
            raise RunExistsError(
                f"a zip/any branch of run {claim.message.trace_id!r} would overwrite the existing run "
                f"{child!r}; nothing was changed",
                trace_id=child,
            )
        _, out, taken, version = reply
        data = self._data.committed(
            claim, changes, version.decode(), ended=isinstance(transition, (Finish, Fail))
        )
        return Committed(
            True,
            [Message.decode(m) for m in out],
            bool(ack),
            commits.read_taken(self, at, taken, take_token, (claim.message.trace_id, data)),
        )

    async def extend(self, claims: list[Claim], lease: float) -> None:
        by: dict[int, list[str]] = {}
        for c in claims:
            by.setdefault(self._at(c.message.trace_id), []).extend((c.message.trace_id, c.token))
        for at, pairs in by.items():
            keys = self._keys(at, None)
            if keys:
                keys += [f"{self._prefixes[at]}:r:{t}" for t in pairs[::2]]
            await self._run_script(
                "EXTEND",
                scripts.EXTEND.args(prefix=self._prefixes[at], now=time.time(), lease=lease, claims=pairs),
                at=at,
                keys=keys,
            )

    async def init_done(self, trace_id: str, seq: int) -> None:
        at = self._at(trace_id)
        await self._run_script(
            "INIT_DONE",
            scripts.INIT_DONE.args(prefix=self._prefixes[at], trace=trace_id, seq=seq),
            at=at,
            keys=self._keys(at, trace_id),
        )

    async def park(
        self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0, claimable: bool = False
    ) -> int:
        msg = claim.message
        at = self._at(msg.trace_id)
        args = scripts.PARK.args(
            prefix=self._prefixes[at],
            trace=msg.trace_id,
            token=claim.token,
            reason=reason,
            now=time.time(),
            msg=msg.encode(),
            base=base,
            cap=cap,
            claimable=int(claimable),
        )
        count = await self._run_script("PARK", args, at=at, keys=self._keys(at, msg.trace_id))
        return int(count or 0)

    async def resume(
        self,
        trace_id: str,
        call_type: str,
        payload: bytes,
        *,
        failed: bool = False,
        seq: int | None = None,
        keep: Mailbox | None = None,
    ) -> list[Message]:
        at = self._at(trace_id)
        r = await self._run_script(
            "RESUME",
            scripts.RESUME.args(
                prefix=self._prefixes[at],
                trace=trace_id,
                call_type=call_type,
                payload=payload,
                failed="1" if failed else "0",
                now=time.time(),
                redispatch=self.redispatch_after,
                seq="" if seq is None else seq,
                stream=self._streams[at],
                per_run="" if keep is None else keep.per_run,
                per_type="" if keep is None else keep.per_type,
            ),
            at=at,
            keys=self._keys(at, trace_id),
        )
        return resumed(r, trace_id, call_type, keep)

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        return await self._due.due(now, limit)

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        error = msgpack.packb({"type": "dflow.RunCancelled", "message": reason, "step": ""})
        at = self._at(trace_id)
        r = await self._run_script(
            "CANCEL",
            scripts.CANCEL.args(
                prefix=self._prefixes[at],
                trace=trace_id,
                now=time.time(),
                ttl_ms=int(self.ttl * 1000),
                redispatch=self.redispatch_after,
                stream=self._streams[at],
                error=error,
            ),
            at=at,
            keys=self._keys(at, trace_id),
        )
        if not r:
            return None, []
        return await self.get_run(trace_id), [Message.decode(m) for m in r[1]]

    # -- StepParts (see dflow.parts) ---------------------------------------------------

    parts_in_claim_and_commit = True  # (claim_step.lua tells, commit.lua drops)

    async def save_part(self, trace_id: str, seq: int, part: str, blob: bytes) -> bytes:
        return await self._parts.save(trace_id, seq, part, blob)

    async def saved_part(self, trace_id: str, seq: int, part: str) -> bytes | None:
        return await self._parts.saved(trace_id, seq, part)

    async def drop_parts(self, trace_id: str, seq: int) -> None:
        await self._parts.drop(trace_id, seq)

    # -- RunReader (see reads) -------------------------------------------------------

    async def get_run(self, trace_id: str) -> RunInfo | None:
        return await self._reads.get_run(trace_id)

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        return await self._reads.get_data(trace_id)

    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        return await self._reads.get_steps(trace_id, start)

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        return await self._reads.watch_steps(trace_id, start, timeout)

    async def get_blob(self, ref: str) -> bytes | None:
        return await self._reads.get_blob(ref)

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        return await self._reads.wait_many(trace_ids, timeout)

    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
        oldest_first: bool = False,
    ) -> RunPage:
        return await self._reads.page_runs(
            limit, status=status, pipeline=pipeline, cursor=cursor, oldest_first=oldest_first
        )

    async def find_runs(self, id_start: str, limit: int = 20) -> list[RunInfo]:
        return await self._reads.find_runs(id_start, limit)

    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        return await self._reads.count_runs(pipeline=pipeline)

    async def ping(self) -> None:
        with store_errors():
            await self.redis.ping()

    async def close(self) -> None:
        await self._reads.close()
        await self._calls.close()
        await disconnect(self.redis)
