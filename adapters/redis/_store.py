"""``RedisStore``: runs, data, step records, timers, leases and joins in Redis."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import msgpack
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster

from dflow._codec import JOIN, Message
from dflow._runpage import created_ms
from dflow._urls import redact_url
from dflow.context import RunInfo, RunStatus, StepRecord
from dflow.errors import (
    ConfigurationError,
    NotWaitingError,
    RefusedMessageError,
    RunExistsError,
    RunNotFoundError,
    StoreError,
)
from dflow.memory import not_waiting
from dflow.store import (
    Advance,
    BlobsMissingError,
    BranchResult,
    Claim,
    Committed,
    Fail,
    Finish,
    Fork,
    NewRun,
    Store,
    Taken,
    Transition,
    Wait,
)

from . import _scripts
from ._errors import (
    GatedCluster,
    connect,
    disconnect,
    execute,
    is_cluster,
    ready,
    store_errors,
)
from ._keyspace import Keyspace
from ._reads import RunReads, _s, _unpack
from ._same import same_cluster, same_server
from ._waited import NodeWrites
from ._watch import FinishWatch

if TYPE_CHECKING:
    from ._transport import RedisStreamsTransport

__all__ = ["RedisStore"]

log = logging.getLogger("dflow.redis")

_pack = msgpack.Packer(use_bin_type=True).pack


def _record(r: StepRecord) -> bytes:
    return _pack(
        [r.key, r.seq, r.status.value, r.attempt, r.worker, r.started, r.duration, r.raw_input, r.raw_output,
         r.error, r.name]
    )


#: The scripts that set no timer, lease or outbox entry.
_LOOKS = frozenset({"DUE", "PAGE", "COUNT"})


class RedisStore(RunReads, Store):
    """``Store`` on Redis (redis-py's asyncio client), one server or a Redis Cluster.

    ``url``: ``redis://[user:password@]host:port/db`` or ``rediss://`` for TLS, or
    ``redis+cluster://[user:password@]host1:port1,host2:port2/`` (``rediss+cluster://``) for
    a cluster; other ``options`` go to the client (``ssl_ca_certs``, ``ssl_certfile``, ...).
    ``ttl``: seconds a finished run is kept. ``prefix`` namespaces every key. A flow built
    at run time is kept while a live run references it, then ``blob_ttl`` seconds more.
    ``transport``: a ``RedisStreamsTransport`` on the same server and database (or cluster),
    to write step messages to inside the store's own scripts (fused: one script call a
    step). ``streams``: how many buckets the keys are spread over (see ``_keyspace``; 16 by
    default on a cluster, 1 on one server; the same as its transport's). ``wait``:
    each write is acknowledged only once that many replicas have it (``WAIT``), waiting up
    to ``wait_timeout`` seconds, else ``StoreError`` (it may be lost if the primary fails).
    """

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
        if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0 or not wait_timeout > 0:
            raise ConfigurationError(f"wait is a number of replicas (0 for none) and wait_timeout a positive number "
                                     f"of seconds; got wait={wait!r}, wait_timeout={wait_timeout!r}")
        self.wait, self.wait_timeout = wait, wait_timeout
        self.redis = connect(url, **options)
        self.cluster = is_cluster(self.redis)
        self._scripts = {name: self.redis.register_script(s.source) for name, s in _scripts.SCRIPTS.items()}
        self._loaded: set[str] = set()  # scripts loaded on every primary of a cluster
        self._cold = self.cluster  # a cluster's slot map not loaded yet
        self._node_writes = NodeWrites(self.redis) if isinstance(self.redis, GatedCluster) else None
        self._tokens = 0
        self._token_base = f"{os.getpid()}-{os.urandom(6).hex()}-"  # (unique across hosts and containers too)
        keyspace = Keyspace((16 if self.cluster else 1) if streams is None else streams, cluster=self.cluster)
        # The group and consumer this store writes step messages for (fused), if any, and
        # each bucket's stream ('' when not fused).
        self._group = self._consumer = ""
        self._streams: tuple[str, ...] = ("",) * keyspace.n
        if transport is not None:
            mine, theirs = self.redis, transport.redis
            if isinstance(mine, RedisCluster) or isinstance(theirs, RedisCluster):
                same = same_cluster(url, transport.url)
            else:
                same = same_server(mine, theirs)
            if not same:
                raise ConfigurationError(
                    "a Redis store writes step messages itself only to a stream on its own server and database "
                    f"as its own user; {redact_url(transport.url)!r} is not on {redact_url(url)!r}"
                )
            if transport.keyspace != keyspace:  # (the same URL must name the same keys, transport or not)
                raise ConfigurationError(
                    f"the store spreads its keys over streams={keyspace.n} buckets and its transport over "
                    f"{transport.keyspace.n}: give the store URL and the transport URL the same streams="
                )
            self._streams, self._group, self._consumer = transport.streams, transport.group, transport.consumer
            self.fused = True
        #: how the keys are spread over buckets (and a cluster's slots)
        self.keyspace = keyspace
        self._prefixes = keyspace.names(prefix, "prefix")
        #: each bucket's indexes and stream: the keys every script of the bucket declares
        self._bucket_keys = [
            [f"{P}:{k}" for k in ("outbox", "timers", "leases", "runs", "expiry", "expiryp", "ix")] + ([st] if st else [])
            for P, st in zip(self._prefixes, self._streams)
        ]
        # DUE: each bucket's soonest entry as last seen, the buckets written to since, and
        # where the round of the others is
        self._due_at = [0.0] * keyspace.n
        self._touched: set[int] = set()
        self._turn = 0
        self._watch: FinishWatch | None = None

    def _at(self, trace_id: str) -> int:
        """The bucket of a run."""
        return self.keyspace.index(trace_id)

    def _p(self, trace_id: str) -> str:
        """The key prefix of a run's bucket."""
        return self._prefixes[self.keyspace.index(trace_id)]

    # -- writing -----------------------------------------------------------------------

    def _keys(self, at: int, trace_id: str | None, refs: Any = ()) -> list[str]:
        """The keys a script declares: on a cluster, those of the run (and its parent's for
        a branch), of its bucket's indexes and stream, and of the blobs it names; on one
        server none (nothing routes by them). Declared, a call is routed to the shard that
        owns the bucket, and refused (TRYAGAIN, retried) rather than run half while the
        bucket's slot is migrating. Keys a script finds by reading (a run's branches, the
        runs a timer names) are in the same slot but not declared (see ``_scripts``)."""
        if not self.cluster:
            return []
        P = self._prefixes[at]
        keys = self._bucket_keys[at].copy()
        t = trace_id
        while t is not None:
            keys += [f"{P}:{k}:{t}" for k in ("r", "d", "s", "c", "j", "js", "ja", "jc", "w", "e")]
            t = t.rpartition("/")[0] if "/" in t else None
        for ref in refs:
            keys += [f"{P}:b:{ref}", f"{P}:bn:{ref}"]
        return keys

    async def _run_script(
        self, name: str, args: list[Any], blobs: dict[str, bytes] | None = None, *, at: int = 0,
        keys: list[str] | None = None, writes: bool = True,
    ) -> Any:
        """Run script ``name`` on bucket ``at``, writing ``blobs`` first (unless stored
        already) in the same round trip, and with ``wait``, waiting for the replicas.
        ``BlobsMissingError`` when the script reports blobs it lacks."""
        if self._cold:
            await ready(self.redis)
            self._cold = False
        script = self._scripts[name]
        keys = keys if keys is not None else self._keys(at, None)
        if name not in _LOOKS:
            self._touched.add(at)  # it may have set a timer, a lease or an outbox entry there: DUE looks
        replicas = self.wait if writes else 0
        with store_errors():
            if replicas and self._node_writes is not None:
                reply, acked = await self._node_writes.run(
                    self._prefixes[at], script, keys, args, blobs or {}, self._prefixes[at],
                    max(1, int(self.blob_ttl * 1000)), replicas, max(1, int(self.wait_timeout * 1000)))
                self._check_wait(acked)
            elif blobs or replicas:
                try:
                    replies = await self._pipelined(script, keys, args, blobs, at, replicas, False)
                except rex.NoScriptError:  # a cluster node without it (a promoted replica)
                    if not self.cluster:
                        raise
                    replies = await self._pipelined(script, keys, args, blobs, at, replicas, True)
                reply = replies[-2] if replicas else replies[-1]
                if replicas:
                    self._check_wait(replies[-1])
            else:
                reply = await script(keys=keys, args=args)
        if isinstance(reply, list) and reply and reply[0] == b"need":
            raise BlobsMissingError([r.decode() for r in reply[1]])
        return reply

    async def _pipelined(
        self, script: Any, keys: list[str], args: list[Any], blobs: dict[str, bytes] | None, at: int,
        replicas: int, load: bool,
    ) -> list[Any]:
        """The blob writes, the script and the ``WAIT`` in one round trip to the bucket's node.
        A cluster's pipeline cannot load a script a node lacks: with ``load`` (or the first
        time) it is loaded on every primary first."""
        async with self.redis.pipeline(transaction=False) as pipe:
            if blobs:
                px = max(1, int(self.blob_ttl * 1000))
                for ref, blob in blobs.items():
                    pipe.set(f"{self._prefixes[at]}:b:{ref}", blob, px=px, nx=True)
            if self.cluster:
                if load or script.sha not in self._loaded:
                    await self.redis.script_load(script.script)
                    self._loaded.add(script.sha)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            else:
                await script(keys=keys, args=args, client=pipe)
            if replicas:
                self._wait_in(pipe, at)
            return await execute(self.redis, pipe)

    def _wait_in(self, pipe: Any, at: int) -> None:
        """``WAIT`` on the connection that wrote (one server: the same pipeline; a cluster's
        writes that wait go through ``_waited``)."""
        pipe.execute_command("WAIT", self.wait, max(1, int(self.wait_timeout * 1000)))

    def _check_wait(self, acked: Any) -> None:
        if int(acked) < self.wait:
            raise StoreError(
                f"the write reached {int(acked)} of the {self.wait} replicas wait= asks for within "
                f"{self.wait_timeout}s: it is on the primary, and lost if the primary fails before it replicates"
            )

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        msg = run.message
        parent = run.parent
        frames = run.frames
        now = time.time()
        at = self._at(run.trace_id)
        args = _scripts.CREATE.args(
            prefix=self._prefixes[at], trace=run.trace_id, now=now, redispatch=self.redispatch_after,
            ttl_ms=int(self.ttl * 1000), stream=self._streams[at], blob_grace_ms=int(self.blob_ttl * 1000),
            blobs=" ".join(frames.blobs) if frames else "", frames=frames.record if frames else b"",
            value=run.value,
            msg=msg.encode() if msg is not None else b"",
            seq=msg.seq if msg is not None else 0,
            key=msg.key if msg is not None else "",
            kind=msg.kind if msg is not None else 0,
            result=run.result if run.result is not None else b"",
            parent_trace=parent.trace_id if parent else "", parent_seq=parent.seq if parent else 0,
            parent_index=parent.index if parent else 0,
            pipeline=run.pipeline or "", listed_ms=created_ms(now) if parent is None else "", token=self._token(),
            records=[_record(r) for r in run.records],
            data=[x for kv in run.data.items() for x in kv],
        )
        keys = self._keys(at, run.trace_id, frames.blobs if frames else ())
        if keys and run.pipeline:
            keys.append(f"{self._prefixes[at]}:ixp:{run.pipeline}")
        reply = await self._run_script("CREATE", args, frames.new_blobs if frames else None, at=at, keys=keys)
        if reply is None:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        return [Message.decode(m) for m in reply[1]]

    def _token(self) -> str:
        self._tokens += 1
        return self._token_base + str(self._tokens)

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        token = self._token()
        body = message.encode()
        at = self._at(message.trace_id)
        args = _scripts.CLAIM.args(
            prefix=self._prefixes[at], trace=message.trace_id, msg=body, seq=message.seq, attempt=message.attempt,
            key=message.key, kind=message.kind, now=time.time(), lease=lease, token=token,
        )
        r = await self._run_script("CLAIM", args, at=at, keys=self._keys(at, message.trace_id), writes=False)
        if r is None:
            return None
        if r[0] == b"refused":
            raise RefusedMessageError(f"the message of step {message.key!r} of run {message.trace_id!r} is refused: "
                                      f"{r[1].decode()}")
        return _claimed(message, token, r)

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
        stream = self._streams[at]
        fused = bool(stream)
        ack = receipt if fused and receipt is not None else ""
        if ack and self.keyspace.n > 1:  # (bucket, entry id): acknowledged here if on this bucket's stream
            ack = ack[1] if isinstance(ack, tuple) and ack[0] == at else ""
        take_token = self._token() if fused and take_lease is not None else ""
        blobs: dict[str, bytes] = {}
        refs: set[str] = set()
        children = ""
        fields: list[Any]
        if isinstance(transition, Advance):
            m = transition.message
            f = transition.frames
            if f is None:
                frames_arg, blob_refs = claim.frames or b"", "="  # the run stays at its frames
            else:
                frames_arg, blob_refs = f.record, " ".join(f.blobs)
                refs.update(f.blobs)
                blobs.update(f.new_blobs)
                if f.blobs == claim.blobs:
                    blob_refs = "="  # it refers to the same blobs as before: nothing to count
            kind = "advance"
            fields = [frames_arg, transition.value, m.encode(), m.seq, m.attempt, m.key, transition.at or 0, m.kind,
                      blob_refs]
        elif isinstance(transition, Wait):
            kind = "wait"
            fields = [transition.call_type, "1" if transition.init_pending else "0"]
        elif isinstance(transition, Fork):
            j = transition.join
            kind = "fork"
            moved = transition.frames
            if moved is None:
                frames_arg, moved_refs = b"", "="  # the run stays at its frames
            else:
                frames_arg, moved_refs = moved.record, " ".join(moved.blobs)
                refs.update(moved.blobs)
                blobs.update(moved.new_blobs)
            fields = [transition.kind, j.encode(), j.seq, j.key, len(transition.children), frames_arg, moved_refs]
            for child in transition.children:
                assert child.message is not None and child.parent is not None and child.frames is not None
                refs.update(child.frames.blobs)
                blobs.update(child.frames.new_blobs)
                fields += [child.trace_id, child.frames.record, child.value, child.message.encode(),
                           child.message.key, child.parent.index, " ".join(child.frames.blobs)]
            children = " ".join(c.trace_id for c in transition.children)
            await self._same_bucket(at, claim.message.trace_id, transition.children)
        elif isinstance(transition, Finish):
            kind, fields = "finish", [transition.result]
        elif isinstance(transition, Fail):
            kind, fields = "fail", [_pack(transition.error), b"compensated" if transition.compensated else b"failed"]
        else:  # pragma: no cover
            raise TypeError(f"unknown transition {transition!r}")
        args = _scripts.COMMIT.args(
            prefix=self._prefixes[at], trace=claim.message.trace_id, token=claim.token, now=time.time(),
            ttl_ms=int(self.ttl * 1000), redispatch=self.redispatch_after, claim_kind=claim.message.kind,
            stream=stream, group=self._group, receipt=ack, taker=self._consumer if take_token else "",
            take_token=take_token, take_lease=take_lease or 0, blob_grace_ms=int(self.blob_ttl * 1000),
            blob_refs=" ".join(sorted(refs)), children=children, transition=kind,
            records=[_record(r) for r in records],
            sets=[x for k, v in changes.items() if v is not None for x in (k, v)],
            dels=[k for k, v in changes.items() if v is None],
            fields=fields,
        )
        keys = self._keys(at, claim.message.trace_id, refs.union(claim.blobs)) if self.cluster else []
        if keys and isinstance(transition, Fork):
            for child in transition.children:
                keys += [f"{self._prefixes[at]}:{k}:{child.trace_id}" for k in ("r", "d", "s", "c", "w", "e")]
        reply = await self._run_script("COMMIT", args, blobs, at=at, keys=keys)
        if reply is None:
            if fused:
                await self._orphaned(at, claim.message)
            return Committed(False, acknowledged=bool(ack))
        if reply[0] == b"exists":
            child = reply[1].decode()
            raise RunExistsError(f"a zip/any branch of run {claim.message.trace_id!r} would overwrite the existing run "
                                 f"{child!r}; nothing was changed", trace_id=child)
        _, out, taken = reply
        messages = [Message.decode(m) for m in out]
        if taken and self.keyspace.n > 1:
            taken = [(at, taken[0]), *taken[1:]]
        if not taken:
            return Committed(True, messages, bool(ack))
        if len(taken) < 3:  # not a step message: the worker sets it aside
            return Committed(True, messages, bool(ack), Taken(taken[1], taken[0], None))
        try:
            next_claim = _claimed(Message.decode(taken[1]), take_token, taken[2])
        except Exception as exc:  # the step stays leased: it runs again when its lease expires
            log.warning("dflow: could not read the next step %r after a commit: %s", taken[1], exc)
            return Committed(True, messages, bool(ack))
        return Committed(True, messages, bool(ack), Taken(taken[1], taken[0], next_claim))

    async def _orphaned(self, at: int, m: Message) -> None:
        """After a refused commit: if the run is still at this very step and no lease is held
        on it, the claim was lost (it had not reached a replica when its primary failed): the
        step's message goes onto the stream again. The refused commit took the delivery off
        the stream, and a fused store keeps no outbox for the timer scan to send again. A
        message that turns out to be a duplicate is dropped at claim."""
        P = self._prefixes[at]
        with store_errors():
            seq, attempt, key, token, status, init = cast("list[bytes | None]", await self.redis.hmget(
                f"{P}:r:{m.trace_id}", ["seq", "attempt", "key", "lease_token", "status", "init_pending"]))
            if token is not None or (seq, attempt, key) != (str(m.seq).encode(), str(m.attempt).encode(),
                                                            m.key.encode()):
                return
            if status in (b"running", b"sleeping") or (status == b"waiting" and init == b"1"):
                log.warning("dflow: the lease of step %s of run %s was lost with its Redis primary; "
                            "sending the step again", m.key, m.trace_id)
                await self.redis.xadd(self._streams[at], {b"m": m.encode()})

    async def _same_bucket(self, at: int, trace_id: str, children: list[NewRun]) -> None:
        """A fork writes its branches in its own bucket: each must belong there (a branch
        id, ``<parent>/<seq>-<index>``, always does)."""
        for child in children:
            if self._at(child.trace_id) != at:
                if await self.get_run(child.trace_id) is not None:
                    raise RunExistsError(f"a zip/any branch of run {trace_id!r} would overwrite the existing run "
                                         f"{child.trace_id!r}; nothing was changed", trace_id=child.trace_id)
                raise StoreError(f"a zip/any branch of run {trace_id!r} is named {child.trace_id!r}, not "
                                 f"'{trace_id}/<seq>-<index>': its keys would be in another bucket; nothing was changed")

    async def extend(self, claims: list[Claim], lease: float) -> None:
        by: dict[int, list[str]] = {}
        for c in claims:
            by.setdefault(self._at(c.message.trace_id), []).extend((c.message.trace_id, c.token))
        for at, pairs in by.items():
            keys = self._keys(at, None)
            if keys:
                keys += [f"{self._prefixes[at]}:r:{t}" for t in pairs[::2]]
            await self._run_script("EXTEND", _scripts.EXTEND.args(
                prefix=self._prefixes[at], now=time.time(), lease=lease, claims=pairs), at=at, keys=keys)

    async def init_done(self, trace_id: str, seq: int) -> None:
        at = self._at(trace_id)
        await self._run_script("INIT_DONE", _scripts.INIT_DONE.args(prefix=self._prefixes[at], trace=trace_id, seq=seq),
                               at=at, keys=self._keys(at, trace_id))

    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        msg = claim.message
        at = self._at(msg.trace_id)
        args = _scripts.PARK.args(prefix=self._prefixes[at], trace=msg.trace_id, token=claim.token, reason=reason,
                                  now=time.time(), msg=msg.encode(), base=base, cap=cap)
        count = await self._run_script("PARK", args, at=at, keys=self._keys(at, msg.trace_id))
        return int(count or 0)

    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> list[Message]:
        at = self._at(trace_id)
        r = await self._run_script("RESUME", _scripts.RESUME.args(
            prefix=self._prefixes[at], trace=trace_id, call_type=call_type, payload=payload,
            failed="1" if failed else "0", now=time.time(), redispatch=self.redispatch_after,
            seq="" if seq is None else seq, stream=self._streams[at],
        ), at=at, keys=self._keys(at, trace_id))
        if r[0] == b"missing":
            raise RunNotFoundError(f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if r[0] == b"not":
            waiting = _s(r[2]) or ("join" if r[3] == b"1" else None)
            info = RunInfo(trace_id, RunStatus(r[1].decode()), 0, 0.0, 0.0, waiting_for=waiting)
            raise NotWaitingError(not_waiting(info, call_type), trace_id=trace_id)
        return [Message.decode(m) for m in r[1]]

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        """The timers, outbox and leases of the buckets worth a look, one script a bucket:
        with up to 4 buckets all of them; with more, those this store wrote to since it last
        looked, those whose soonest entry (as last seen) has come, and a quarter of the rest
        in turn (so an idle worker's scans cost a quarter, and a bucket nobody here writes
        to, where a dead worker left a lease, is seen within four calls)."""
        n = len(self._prefixes)
        if n <= 4:
            look = list(range(n))
        else:
            k = (n + 3) // 4
            turn = {(self._turn + j) % n for j in range(k)}
            self._turn = (self._turn + k) % n
            look = [i for i in range(n) if i in turn or i in self._touched or self._due_at[i] <= now]
        messages: list[Message] = []
        for at in look:
            self._touched.discard(at)  # (before the call: a write meanwhile marks it again)
            self._due_at[at] = float("inf")
            out, nxt, bad = await self._run_script("DUE", _scripts.DUE.args(
                prefix=self._prefixes[at], now=now, limit=limit, redispatch=self.redispatch_after,
                stream=self._streams[at],
            ), at=at)
            if bad:
                log.error("dflow: dropped %d unreadable timer, outbox or lease entries of the Redis store", bad)
            messages += [Message.decode(m) for m in out]
            if nxt:
                self._due_at[at] = min(self._due_at[at], float(nxt))
        soonest = min(self._due_at)
        return messages, (None if soonest == float("inf") else soonest)

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        error = msgpack.packb({"type": "dflow.RunCancelled", "message": reason, "step": ""})
        at = self._at(trace_id)
        r = await self._run_script("CANCEL", _scripts.CANCEL.args(
            prefix=self._prefixes[at], trace=trace_id, now=time.time(), ttl_ms=int(self.ttl * 1000),
            redispatch=self.redispatch_after, stream=self._streams[at], error=error,
        ), at=at, keys=self._keys(at, trace_id))
        if not r:
            return None, []
        return await self.get_run(trace_id), [Message.decode(m) for m in r[1]]

    async def ping(self) -> None:
        with store_errors():
            await self.redis.ping()

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.close()
            self._watch = None
        if self._node_writes is not None:
            await self._node_writes.close()
        await disconnect(self.redis)


def _claimed(message: Message, token: str, reply: list[Any]) -> Claim:
    raw_frames, value, init_only, data_flat, slots, blobs = reply
    data = {data_flat[i].decode(): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
    branches = [_branch(s) for s in slots] if message.kind == JOIN and slots else None
    return Claim(message, token, raw_frames or None, value, data, bool(init_only), branches,
                 tuple(blobs.decode().split()) if blobs else ())


def _branch(slot: bytes) -> BranchResult:
    index, ok, value, error, changes = msgpack.unpackb(slot, raw=True, strict_map_key=False)
    decoded = {}
    if isinstance(changes, dict):
        decoded = {k.decode(): (v if v is not False else None) for k, v in changes.items()}
    return BranchResult(
        int(index), bool(ok), value if value is not False else None,
        _unpack(error) if error not in (False, None) else None, decoded,
    )
