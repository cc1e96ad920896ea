"""``RedisStore``: runs, data, step records, timers, leases and joins in Redis."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgpack
import redis.asyncio as aioredis

from dflow._codec import JOIN, Message
from dflow._durable import ChainCodec
from dflow.context import RunInfo, RunStatus, StepRecord, StepStatus
from dflow.errors import (
    DFlowError,
    PayloadRejectedError,
    RefusedMessageError,
    NotWaitingError,
    RunExistsError,
    RunNotFoundError,
    RunTimeoutError,
    StoreError,
)
from dflow.flow import Chain
from dflow.store import Advance, BranchResult, Claim, Fail, Finish, Fork, Frame, NewRun, Store, Transition, Wait
from dflow.transport import Delivery

from . import _scripts
from ._errors import connect, store_errors
from ._watch import FinishWatch, Waiter

__all__ = ["RedisStore"]

log = logging.getLogger("dflow.redis")

_pack = msgpack.Packer(use_bin_type=True).pack
_ARRAYS = {bytes([b]) for b in (*range(0x90, 0xA0), 0xDC, 0xDD)}  # how a msgpack array starts


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _record(r: StepRecord) -> bytes:
    return _pack(
        [r.key, r.seq, r.status.value, r.attempt, r.worker, r.started, r.duration, r.raw_input, r.raw_output,
         r.error, r.name]
    )


def _unrecord(data: bytes) -> StepRecord:
    key, seq, status, attempt, worker, started, duration, inp, out, error, name = _unpack(data)
    return StepRecord(key, seq, StepStatus(status), attempt, worker, started, duration, inp, out, error, name)


def _s(v: bytes | None) -> str | None:
    return None if v is None else v.decode()


class RedisStore(Store):
    """``Store`` on Redis (redis-py's asyncio client).

    ``url``: ``redis://[user:password@]host:port/db`` or ``rediss://`` for TLS; other
    ``options`` go to ``redis.asyncio.Redis.from_url`` (``ssl_ca_certs``, ``ssl_certfile``,
    ...). ``secret`` signs the flows built at run time (default: ``DFLOW_SECRET``).
    ``ttl``: seconds a finished run is kept. ``prefix`` namespaces every key. A flow built
    at run time is kept while a live run references it, then ``blob_ttl`` seconds more.
    ``legacy_frames``: also accept the unsigned frames records of runs started by dflow
    0.1, while a deployment with runs in flight upgrades (off by default: an unsigned record
    could point a run at any step).
    """

    _poll_pause = 0.1  # first pause before a waiter polls every run it waits for

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        secret: str | bytes | None = None,
        prefix: str = "dflow",
        ttl: float = 7 * 86400,
        redispatch_after: float = 30.0,
        blob_ttl: float = 3600.0,
        legacy_frames: bool = False,
        **options: Any,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.redispatch_after = redispatch_after
        self.blob_ttl = blob_ttl
        self.legacy_frames = legacy_frames
        self._secret = secret if secret is not None else os.environ.get("DFLOW_SECRET")
        self._codec: ChainCodec | None = ChainCodec(self._secret) if self._secret else None
        self.redis = connect(url, **options)
        self._scripts = {
            name: self.redis.register_script(getattr(_scripts, name))
            for name in ("CREATE", "CLAIM", "COMMIT", "RESUME", "INIT_DONE", "EXTEND", "PARK", "DUE")
        }
        self._written: OrderedDict[str, None] = OrderedDict()
        # frames records this process signed lately, by run: the fused path takes the next step
        # of the run it just committed, so most come back here
        self._sealed: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._tokens = 0
        self._token_base = f"{os.getpid()}-{id(self):x}-"
        # Set by ``dispatch_via``: the stream, group and consumer this store dispatches onto.
        self._stream = ""
        self._group = ""
        self._consumer = ""
        self._watch: FinishWatch | None = None

    def dispatch_via(self, transport: Any) -> bool:
        """Dispatch onto ``transport`` inside the store's scripts when it is a Redis Streams
        transport on the same server and database: the next step is added to the stream in
        the commit that decides it, the delivery is acknowledged there too, and a commit can
        claim the worker's next step in the same round trip."""
        from ._transport import RedisStreamsTransport

        if not isinstance(transport, RedisStreamsTransport) or not _same_server(self.redis, transport.redis):
            self._stream, self._group, self._consumer = "", "", ""
            return False
        self._stream, self._group, self._consumer = transport.stream, transport.group, transport.consumer
        return True

    # -- encoding --------------------------------------------------------------------

    @property
    def codec(self) -> ChainCodec:
        """Signs and checks the flows and frames this store keeps; made on first use, so
        that reading runs (``dflow inspect``, ``dflow ls``) needs no secret."""
        if self._codec is None:
            self._codec = ChainCodec(self._secret)
        return self._codec

    def prepare_chain(self, chain: Chain) -> None:
        self.codec.ref(chain)

    def _frames(self, trace_id: str, frames: tuple[Frame, ...], blobs: dict[str, bytes]) -> tuple[bytes, str]:
        """The frames record of run ``trace_id``, signed for it, and the blobs it references
        (space-separated); those this process has not written yet go into ``blobs``."""
        out = []
        refs: list[str] = []
        codec = self.codec
        for f in frames:
            ref, blob = codec.ref(f.chain)
            if ref[:2] == "h:":  # for a branch, its parent's blob
                key = codec.blob_of(ref)
                if key not in refs:
                    refs.append(key)
                if blob is not None and key not in self._written:
                    blobs[key] = blob
            out.append((ref, f.pos, f.suffix, f.returning))
        payload = _pack(out)
        record = codec.seal_frames(trace_id, payload)
        self._sealed[(trace_id, record)] = payload  # signed here for this run: no need to check it again
        if len(self._sealed) > 4096:
            self._sealed.popitem(last=False)
        return record, " ".join(sorted(refs))

    def _blob_refs(self, frames: tuple[Frame, ...]) -> str:
        """The blobs ``frames`` reference, as ``_frames`` lists them."""
        refs: list[str] = []
        for f in frames:
            ref = self.codec.ref(f.chain)[0]
            if ref[:2] == "h:":
                key = self.codec.blob_of(ref)
                if key not in refs:
                    refs.append(key)
        return " ".join(sorted(refs))

    async def _load_frames(self, trace_id: str, raw: bytes) -> tuple[Frame, ...]:
        payload = self._sealed.pop((trace_id, raw), None)
        try:
            if payload is None:
                payload = self.codec.open_frames(trace_id, raw)
        except PayloadRejectedError:
            if not (self.legacy_frames and raw[:1] in _ARRAYS):
                raise
            payload = raw  # written unsigned by dflow 0.1: accepted while the deployment upgrades
        frames = []
        for ref, pos, suffix, returning in _unpack(payload):
            chain = self.codec.cached(ref)
            if chain is None:
                key = self.codec.blob_of(ref)
                with store_errors():
                    blob = await self.redis.get(f"{self.prefix}:b:{key}")
                chain = self.codec.load(ref, blob)
                self._wrote({key: b""})  # it is stored: no need to write it again
            frames.append(Frame(chain, pos, suffix, returning))
        return tuple(frames)

    def _blob_writes(self, pipe: Any, blobs: dict[str, bytes]) -> None:
        for ref, blob in blobs.items():
            pipe.set(f"{self.prefix}:b:{ref}", blob, px=max(1, int(self.blob_ttl * 1000)), nx=True)

    def _wrote(self, blobs: dict[str, bytes]) -> None:
        for ref in blobs:
            self._written[ref] = None
        while len(self._written) > 100_000:
            self._written.popitem(last=False)

    async def _run_script(self, name: str, args: list[Any], blobs: dict[str, bytes] | None = None) -> Any:
        script = self._scripts[name]
        with store_errors():
            if blobs:
                async with self.redis.pipeline(transaction=False) as pipe:
                    self._blob_writes(pipe, blobs)
                    await script(args=args, client=pipe)
                    result = (await pipe.execute())[-1]
                self._wrote(blobs)
                return result
            return await script(args=args)

    # -- Store -----------------------------------------------------------------------

    async def _write(self, name: str, build: Any) -> Any:
        """Run script ``name`` with the arguments ``build(blobs)`` returns, writing first
        the blobs it collects; when the script reports blobs missing (this process thought
        them stored, but they expired unreferenced), write those and run it again."""
        for _ in range(3):
            blobs: dict[str, bytes] = {}
            args = build(blobs)
            reply = await self._run_script(name, args, blobs)
            if not (isinstance(reply, list) and reply and reply[0] == b"need"):
                return reply
            for ref in reply[1]:
                self._written.pop(ref.decode(), None)
        raise StoreError(f"the Redis store reports flow blobs missing after writing them: {reply[1]!r}")

    async def create_run(self, run: NewRun) -> list[Message]:
        msg = run.message
        parent = run.parent

        def build(blobs: dict[str, bytes]) -> list[Any]:
            frames, refs = self._frames(run.trace_id, run.frames, blobs)
            return [
                self.prefix, run.trace_id, time.time(), self.redispatch_after, int(self.ttl * 1000), self._stream,
                int(self.blob_ttl * 1000), refs, frames, run.value,
                msg.encode() if msg is not None else b"",
                msg.seq if msg is not None else 0,
                msg.key if msg is not None else "",
                msg.kind if msg is not None else 0,
                run.result if run.result is not None else b"",
                parent.trace_id if parent else "", parent.seq if parent else 0, parent.index if parent else 0,
                len(run.records), *(_record(r) for r in run.records),
                len(run.data), *(x for kv in run.data.items() for x in kv),
            ]

        reply = await self._write("CREATE", build)
        if reply is None:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        return [Message.decode(m) for m in reply[1]]

    def _token(self) -> str:
        self._tokens += 1
        return self._token_base + str(self._tokens)

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        token = self._token()
        body = message.encode()
        args = [self.prefix, message.trace_id, body, message.seq, message.attempt, message.key, message.kind,
                time.time(), lease, token]
        r = await self._run_script("CLAIM", args)
        if r is None:
            return None
        if r[0] == b"refused":
            raise RefusedMessageError(f"the message of step {message.key!r} of run {message.trace_id!r} is refused: "
                                      f"{r[1].decode()}")
        return await self._claimed(message, token, r)

    async def _claimed(self, message: Message, token: str, reply: list[Any]) -> Claim:
        raw_frames, value, init_only, data_flat, slots = reply
        data = {data_flat[i].decode(): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
        branches = None
        if message.kind == JOIN and slots:
            branches = [_branch(s) for s in slots]
        claim = Claim(message, token, (), value, data, bool(init_only), branches)
        try:
            claim.frames = await self._load_frames(message.trace_id, raw_frames) if raw_frames else ()
        except StoreError:
            raise  # Redis is unreachable: the message is handed back, the lease lapses
        except DFlowError as exc:
            claim.problem = exc
        return claim

    async def commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
    ) -> list[Message] | None:
        out, _ = await self._commit(claim, records, changes, transition, None)
        return out

    async def commit_and_take(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
        lease: float,
    ) -> tuple[list[Message] | None, tuple[Delivery, Claim | None] | None]:
        if not self._stream:
            return await self.commit(claim, records, changes, transition), None
        return await self._commit(claim, records, changes, transition, lease)

    async def _commit(
        self,
        claim: Claim,
        records: list[StepRecord],
        changes: Mapping[str, bytes | None],
        transition: Transition,
        take_lease: float | None,
    ) -> tuple[list[Message] | None, tuple[Delivery, Claim | None] | None]:
        sets = [(k, v) for k, v in changes.items() if v is not None]
        dels = [k for k, v in changes.items() if v is None]
        receipt = claim.receipt if self._stream and claim.receipt is not None else ""
        take_token = self._token() if take_lease is not None else ""

        def build(blobs: dict[str, bytes]) -> list[Any]:
            refs: set[str] = set()
            children = ""
            fields: list[Any]
            if isinstance(transition, Advance):
                m = transition.message
                frames, blob_refs = self._frames(m.trace_id, transition.frames, blobs)
                if blob_refs:
                    refs.update(blob_refs.split())
                if blob_refs == self._blob_refs(claim.frames):
                    blob_refs = "="  # the run references the same blobs as before: nothing to count
                fields = ["advance", frames, transition.value, m.encode(), m.seq, m.attempt, m.key,
                          transition.at or 0, m.kind, blob_refs]
            elif isinstance(transition, Wait):
                fields = ["wait", transition.call_type, "1" if transition.init_pending else "0"]
            elif isinstance(transition, Fork):
                j = transition.join
                fields = ["fork", transition.kind, j.encode(), j.seq, j.key, len(transition.children)]
                for child in transition.children:
                    assert child.message is not None and child.parent is not None
                    frames, blob_refs = self._frames(child.trace_id, child.frames, blobs)
                    refs.update(blob_refs.split())
                    fields += [child.trace_id, frames, child.value, child.message.encode(), child.message.key,
                               child.parent.index, blob_refs]
                children = " ".join(c.trace_id for c in transition.children)
            elif isinstance(transition, Finish):
                fields = ["finish", transition.result]
            elif isinstance(transition, Fail):
                fields = ["fail", _pack(transition.error)]
            else:  # pragma: no cover
                raise TypeError(f"unknown transition {transition!r}")
            return [
                self.prefix, claim.message.trace_id, claim.token, time.time(), int(self.ttl * 1000),
                self.redispatch_after, claim.message.kind, self._stream, self._group,
                receipt if claim.receipt is not None else "", self._consumer if take_token else "", take_token,
                take_lease or 0, int(self.blob_ttl * 1000), " ".join(sorted(refs)), children,
                len(records), *(_record(r) for r in records),
                len(sets), *(x for kv in sets for x in kv),
                len(dels), *dels,
                *fields,
            ]

        def once(blobs: dict[str, bytes]) -> list[Any]:
            args = build(blobs)
            claim.receipt = None  # the first call acknowledges the delivery
            return args

        reply = await self._write("COMMIT", once if receipt else build)
        if reply is None:
            return None, None
        if reply[0] == b"exists":
            child = reply[1].decode()
            raise RunExistsError(f"a zip/any branch of run {claim.message.trace_id!r} would overwrite the existing run "
                                 f"{child!r}; nothing was changed", trace_id=child)
        _, out, taken = reply
        messages = [Message.decode(m) for m in out]
        if not taken:
            return messages, None
        delivery = Delivery(taken[1], taken[0])
        if len(taken) < 3:  # not a step message: the worker sets it aside
            return messages, (delivery, None)
        try:
            claim = await self._claimed(Message.decode(taken[1]), take_token, taken[2])
        except Exception as exc:  # the step stays leased: it runs again when its lease expires
            log.warning("dflow: could not prepare the next step %r after a commit: %s", taken[1], exc)
            return messages, None
        return messages, (delivery, claim)

    async def extend(self, claims: list[Claim], lease: float) -> None:
        args: list[Any] = [self.prefix, time.time(), lease]
        for c in claims:
            args += [c.message.trace_id, c.token]
        await self._run_script("EXTEND", args)

    async def init_done(self, trace_id: str, seq: int) -> None:
        await self._run_script("INIT_DONE", [self.prefix, trace_id, seq])

    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        msg = claim.message
        args = [self.prefix, msg.trace_id, claim.token, reason, time.time(), msg.encode(), base, cap]
        count = await self._run_script("PARK", args)
        return int(count or 0)

    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> list[Message]:
        r = await self._run_script(
            "RESUME", [self.prefix, trace_id, call_type, payload, "1" if failed else "0", time.time(),
                       self.redispatch_after, "" if seq is None else seq, self._stream]
        )
        if r[0] == b"missing":
            raise RunNotFoundError(f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if r[0] == b"not":
            from dflow.memory import _not_waiting

            waiting = _s(r[2]) or ("join" if r[3] == b"1" else None)
            info = RunInfo(trace_id, RunStatus(r[1].decode()), 0, 0.0, 0.0, waiting_for=waiting)
            raise NotWaitingError(_not_waiting(info, call_type), trace_id=trace_id)
        return [Message.decode(m) for m in r[1]]

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        out, nxt, bad = await self._run_script("DUE", [self.prefix, now, limit, self.redispatch_after, self._stream])
        if bad:
            log.error("dflow: dropped %d unreadable timer, outbox or lease entries of the Redis store", bad)
        return [Message.decode(m) for m in out], (float(nxt) if nxt else None)

    async def get_run(self, trace_id: str) -> RunInfo | None:
        with store_errors():
            h = await self.redis.hgetall(f"{self.prefix}:r:{trace_id}")
        if not h:
            return None
        return _info(trace_id, h)

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        with store_errors():
            h = await self.redis.hgetall(f"{self.prefix}:d:{trace_id}")
        return {k.decode(): v for k, v in h.items()}

    async def get_steps(self, trace_id: str) -> list[StepRecord]:
        with store_errors():
            raw = await self.redis.lrange(f"{self.prefix}:s:{trace_id}", 0, -1)
        return [_unrecord(r) for r in raw]

    async def wait_finished(self, trace_id: str, timeout: float | None) -> RunInfo:
        return (await self.wait_many([trace_id], timeout))[0]

    async def wait_many(self, trace_ids: list[str], timeout: float | None) -> list[RunInfo]:
        """Wait for runs to finish: woken by the notification each run publishes when it
        ends, and polling every run's status now and then in case one was missed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        done: dict[str, RunInfo] = {}
        ids = list(dict.fromkeys(trace_ids))
        pending = dict.fromkeys(ids)
        if self._watch is None:
            self._watch = FinishWatch(self.redis, self.prefix)
        waiter = Waiter()
        try:
            self._watch.add(ids, waiter)
            check = ids
            pause = self._poll_pause
            next_full = time.monotonic() + pause
            channel: str | None = self._watch.channel
            while True:
                for t, info in zip(check, await self._finished(check, channel)):
                    if info is not None:
                        done[t] = info
                        pending.pop(t, None)
                channel = None  # registered with every run in the first round
                if not pending:
                    break
                check = []
                while not check:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        first = next(iter(pending))
                        what = (
                            f"run {first!r} did not finish"
                            if len(trace_ids) == 1
                            else f"{len(pending)} of {len(trace_ids)} runs did not finish, e.g. {first!r},"
                        )
                        raise RunTimeoutError(f"{what} within {timeout}s; the run goes on", trace_id=first)
                    if now >= next_full:  # in case a notification was lost: look at every run
                        check = list(pending)
                        pause = min(pause * 2, 2.0)
                        next_full = now + pause
                    elif await waiter.sleep(next_full - now if deadline is None else min(next_full, deadline) - now):
                        check = [t for t in waiter.take() if t in pending]
        finally:
            self._watch.remove(ids, waiter)
        return [done[t] for t in trace_ids]

    async def _finished(self, trace_ids: list[str], channel: str | None = None) -> list[RunInfo | None]:
        """The records of the runs among ``trace_ids`` that have finished (``None`` for the
        others); ``RunNotFoundError`` for a run that does not exist. With ``channel``, ask
        each run first to announce its end there."""
        with store_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for t in trace_ids:
                    if channel is not None:
                        pipe.sadd(f"{self.prefix}:w:{t}", channel)
                        pipe.expire(f"{self.prefix}:w:{t}", max(1, int(self.ttl)))
                    pipe.hget(f"{self.prefix}:r:{t}", "status")
                replies = await pipe.execute()
            statuses = replies[2::3] if channel is not None else replies
            out: list[RunInfo | None] = [None] * len(trace_ids)
            for i, st in enumerate(statuses):
                if st is None:
                    t = trace_ids[i]
                    await self.redis.delete(f"{self.prefix}:w:{t}")
                    raise RunNotFoundError(f"no run with trace id {t!r} (never started, or expired)", trace_id=t)
            ended = [i for i, st in enumerate(statuses) if st in (b"done", b"failed")]
            if ended:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for i in ended:
                        pipe.hgetall(f"{self.prefix}:r:{trace_ids[i]}")
                        if channel is not None:  # it had finished already: nobody will announce it
                            pipe.srem(f"{self.prefix}:w:{trace_ids[i]}", channel)
                    replies = await pipe.execute()
                hashes = replies[::2] if channel is not None else replies
                for i, h in zip(ended, hashes):
                    if h:
                        out[i] = _info(trace_ids[i], h)
        return out

    async def list_runs(self, limit: int = 50) -> list[RunInfo]:
        out: list[RunInfo] = []
        start = 0
        with store_errors():
            while len(out) < limit:
                ids = await self.redis.zrevrange(f"{self.prefix}:runs", start, start + limit - 1)
                if not ids:
                    break
                start += len(ids)
                async with self.redis.pipeline(transaction=False) as pipe:
                    for t in ids:
                        pipe.hgetall(f"{self.prefix}:r:{t.decode()}")
                    hashes = await pipe.execute()
                gone = [t for t, h in zip(ids, hashes) if not h]
                if gone:
                    await self.redis.zrem(f"{self.prefix}:runs", *gone)
                    start -= len(gone)
                out += [_info(t.decode(), h) for t, h in zip(ids, hashes) if h]
        return out[:limit]

    async def ping(self) -> None:
        with store_errors():
            await self.redis.ping()

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.close()
            self._watch = None
        await self.redis.aclose(close_connection_pool=True)


def _same_server(a: aioredis.Redis, b: aioredis.Redis) -> bool:
    """Whether two clients talk to the same server and database as the same user."""
    ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    fields = ("host", "port", "path", "db", "username")
    return all(ka.get(f) == kb.get(f) for f in fields)


def _branch(slot: bytes) -> BranchResult:
    index, ok, value, error, changes = msgpack.unpackb(slot, raw=True, strict_map_key=False)
    decoded = {}
    if isinstance(changes, dict):
        decoded = {k.decode(): (v if v is not False else None) for k, v in changes.items()}
    return BranchResult(
        int(index), bool(ok), value if value is not False else None,
        _unpack(error) if error not in (False, None) else None, decoded,
    )


def _info(trace_id: str, h: dict[bytes, bytes]) -> RunInfo:
    status = RunStatus(h[b"status"].decode())
    waiting = _s(h.get(b"waiting"))
    if status is RunStatus.WAITING and waiting is None:
        waiting = "join"
    extra: dict[str, Any] = {}
    if b"parked" in h:
        extra["parked"] = h[b"parked"].decode()
        extra["park_count"] = int(h.get(b"park_count", b"0"))
    if b"lease_token" in h:
        extra["leased_until"] = float(h[b"lease_until"])
    if b"due" in h:
        extra["due"] = float(h[b"due"])
    return RunInfo(
        trace_id=trace_id,
        status=status,
        seq=int(h.get(b"seq", b"0")),
        created=float(h.get(b"created", b"0")),
        updated=float(h.get(b"updated", b"0")),
        waiting_for=waiting,
        raw_result=h.get(b"result"),
        error=_unpack(h[b"error"]) if b"error" in h else None,
        parent=_s(h.get(b"p_trace")),
        extra=extra,
    )
