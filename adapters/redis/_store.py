"""``RedisStore``: runs, data, step records, timers, leases and joins in Redis."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import msgpack
import redis.asyncio as aioredis

from dflow._codec import JOIN, Message
from dflow._runpage import check_page, check_pipeline, created_ms, encode_cursor
from dflow._urls import redact_url
from dflow.context import RunInfo, RunStatus, StepRecord, StepStatus
from dflow.errors import (
    ConfigurationError,
    NotWaitingError,
    RefusedMessageError,
    RunExistsError,
    RunNotFoundError,
    RunTimeoutError,
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
    RunPage,
    Store,
    Taken,
    Transition,
    Wait,
)

from . import _scripts
from ._errors import connect, store_errors
from ._watch import FinishWatch, Waiter

if TYPE_CHECKING:
    from ._transport import RedisStreamsTransport

__all__ = ["RedisStore"]

log = logging.getLogger("dflow.redis")

_pack = msgpack.Packer(use_bin_type=True).pack


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


#: The fields of a run's hash that ``_info`` reads (status and pipeline first, as PAGE wants).
_INFO_FIELDS = ("status", "pipeline", "seq", "created", "updated", "waiting", "result", "error", "p_trace",
                "parked", "park_count", "lease_token", "lease_until", "due")
_INFO_KEYS = tuple(f.encode() for f in _INFO_FIELDS)


class RedisStore(Store):
    """``Store`` on Redis (redis-py's asyncio client).

    ``url``: ``redis://[user:password@]host:port/db`` or ``rediss://`` for TLS; other
    ``options`` go to ``redis.asyncio.Redis.from_url`` (``ssl_ca_certs``, ``ssl_certfile``,
    ...). ``ttl``: seconds a finished run is kept. ``prefix`` namespaces every key. A flow
    built at run time is kept while a live run references it, then ``blob_ttl`` seconds
    more. ``transport``: a ``RedisStreamsTransport`` on the same server and database, to
    write step messages to inside the store's own scripts (fused: one script call a step).
    """

    _poll_pause = 0.1  # first pause before a waiter polls every run it waits for

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "dflow",
        ttl: float = 7 * 86400,
        redispatch_after: float = 30.0,
        blob_ttl: float = 3600.0,
        transport: RedisStreamsTransport | None = None,
        **options: Any,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.redispatch_after = redispatch_after
        self.blob_ttl = blob_ttl
        self.redis = connect(url, **options)
        self._scripts = {name: self.redis.register_script(s.source) for name, s in _scripts.SCRIPTS.items()}
        self._tokens = 0
        self._token_base = f"{os.getpid()}-{id(self):x}-"
        # The stream, group and consumer this store writes step messages to (fused), if any.
        self._stream = self._group = self._consumer = ""
        if transport is not None:
            if not same_server(self.redis, transport.redis):
                raise ConfigurationError(
                    "a Redis store writes step messages itself only to a stream on its own server and database "
                    f"as its own user; {redact_url(transport.url)!r} is not on {redact_url(url)!r}"
                )
            self._stream, self._group, self._consumer = transport.stream, transport.group, transport.consumer
            self.fused = True
        self._watch: FinishWatch | None = None

    # -- writing -----------------------------------------------------------------------

    def _blob_writes(self, pipe: Any, blobs: dict[str, bytes]) -> None:
        for ref, blob in blobs.items():
            pipe.set(f"{self.prefix}:b:{ref}", blob, px=max(1, int(self.blob_ttl * 1000)), nx=True)

    async def _run_script(self, name: str, args: list[Any], blobs: dict[str, bytes] | None = None) -> Any:
        """Run script ``name``, writing ``blobs`` first (unless stored already) in the same
        round trip. ``BlobsMissingError`` when the script reports blobs it lacks."""
        script = self._scripts[name]
        with store_errors():
            if blobs:
                async with self.redis.pipeline(transaction=False) as pipe:
                    self._blob_writes(pipe, blobs)
                    await script(args=args, client=pipe)
                    reply = (await pipe.execute())[-1]
            else:
                reply = await script(args=args)
        if isinstance(reply, list) and reply and reply[0] == b"need":
            raise BlobsMissingError([r.decode() for r in reply[1]])
        return reply

    # -- Store -----------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> list[Message]:
        msg = run.message
        parent = run.parent
        frames = run.frames
        now = time.time()
        args = _scripts.CREATE.args(
            prefix=self.prefix, trace=run.trace_id, now=now, redispatch=self.redispatch_after,
            ttl_ms=int(self.ttl * 1000), stream=self._stream, blob_grace_ms=int(self.blob_ttl * 1000),
            blobs=" ".join(frames.blobs) if frames else "", frames=frames.record if frames else b"",
            value=run.value,
            msg=msg.encode() if msg is not None else b"",
            seq=msg.seq if msg is not None else 0,
            key=msg.key if msg is not None else "",
            kind=msg.kind if msg is not None else 0,
            result=run.result if run.result is not None else b"",
            parent_trace=parent.trace_id if parent else "", parent_seq=parent.seq if parent else 0,
            parent_index=parent.index if parent else 0,
            pipeline=run.pipeline or "", listed_ms=created_ms(now) if parent is None else "",
            records=[_record(r) for r in run.records],
            data=[x for kv in run.data.items() for x in kv],
        )
        reply = await self._run_script("CREATE", args, frames.new_blobs if frames else None)
        if reply is None:
            raise RunExistsError(f"a run with trace id {run.trace_id!r} already exists", trace_id=run.trace_id)
        return [Message.decode(m) for m in reply[1]]

    def _token(self) -> str:
        self._tokens += 1
        return self._token_base + str(self._tokens)

    async def claim(self, message: Message, worker: str, lease: float) -> Claim | None:
        token = self._token()
        body = message.encode()
        args = _scripts.CLAIM.args(
            prefix=self.prefix, trace=message.trace_id, msg=body, seq=message.seq, attempt=message.attempt,
            key=message.key, kind=message.kind, now=time.time(), lease=lease, token=token,
        )
        r = await self._run_script("CLAIM", args)
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
        fused = bool(self._stream)
        ack = receipt if fused and receipt is not None else ""
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
        elif isinstance(transition, Finish):
            kind, fields = "finish", [transition.result]
        elif isinstance(transition, Fail):
            kind, fields = "fail", [_pack(transition.error), b"compensated" if transition.compensated else b"failed"]
        else:  # pragma: no cover
            raise TypeError(f"unknown transition {transition!r}")
        args = _scripts.COMMIT.args(
            prefix=self.prefix, trace=claim.message.trace_id, token=claim.token, now=time.time(),
            ttl_ms=int(self.ttl * 1000), redispatch=self.redispatch_after, claim_kind=claim.message.kind,
            stream=self._stream, group=self._group, receipt=ack, taker=self._consumer if take_token else "",
            take_token=take_token, take_lease=take_lease or 0, blob_grace_ms=int(self.blob_ttl * 1000),
            blob_refs=" ".join(sorted(refs)), children=children, transition=kind,
            records=[_record(r) for r in records],
            sets=[x for k, v in changes.items() if v is not None for x in (k, v)],
            dels=[k for k, v in changes.items() if v is None],
            fields=fields,
        )
        reply = await self._run_script("COMMIT", args, blobs)
        if reply is None:
            return Committed(False, acknowledged=bool(ack))
        if reply[0] == b"exists":
            child = reply[1].decode()
            raise RunExistsError(f"a zip/any branch of run {claim.message.trace_id!r} would overwrite the existing run "
                                 f"{child!r}; nothing was changed", trace_id=child)
        _, out, taken = reply
        messages = [Message.decode(m) for m in out]
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

    async def extend(self, claims: list[Claim], lease: float) -> None:
        pairs = [x for c in claims for x in (c.message.trace_id, c.token)]
        await self._run_script("EXTEND", _scripts.EXTEND.args(prefix=self.prefix, now=time.time(), lease=lease,
                                                              claims=pairs))

    async def init_done(self, trace_id: str, seq: int) -> None:
        await self._run_script("INIT_DONE", _scripts.INIT_DONE.args(prefix=self.prefix, trace=trace_id, seq=seq))

    async def park(self, claim: Claim, reason: str, *, base: float = 0.5, cap: float = 30.0) -> int:
        msg = claim.message
        args = _scripts.PARK.args(prefix=self.prefix, trace=msg.trace_id, token=claim.token, reason=reason,
                                  now=time.time(), msg=msg.encode(), base=base, cap=cap)
        count = await self._run_script("PARK", args)
        return int(count or 0)

    async def resume(
        self, trace_id: str, call_type: str, payload: bytes, *, failed: bool = False, seq: int | None = None
    ) -> list[Message]:
        r = await self._run_script("RESUME", _scripts.RESUME.args(
            prefix=self.prefix, trace=trace_id, call_type=call_type, payload=payload, failed="1" if failed else "0",
            now=time.time(), redispatch=self.redispatch_after, seq="" if seq is None else seq, stream=self._stream,
        ))
        if r[0] == b"missing":
            raise RunNotFoundError(f"no run with trace id {trace_id!r} (never started, or expired)", trace_id=trace_id)
        if r[0] == b"not":
            waiting = _s(r[2]) or ("join" if r[3] == b"1" else None)
            info = RunInfo(trace_id, RunStatus(r[1].decode()), 0, 0.0, 0.0, waiting_for=waiting)
            raise NotWaitingError(not_waiting(info, call_type), trace_id=trace_id)
        return [Message.decode(m) for m in r[1]]

    async def due(self, now: float, limit: int = 1000) -> tuple[list[Message], float | None]:
        out, nxt, bad = await self._run_script("DUE", _scripts.DUE.args(
            prefix=self.prefix, now=now, limit=limit, redispatch=self.redispatch_after, stream=self._stream,
        ))
        if bad:
            log.error("dflow: dropped %d unreadable timer, outbox or lease entries of the Redis store", bad)
        return [Message.decode(m) for m in out], (float(nxt) if nxt else None)

    # The client replies with bytes (it does not decode responses); redis-py's annotations
    # cannot say so and give bytes | str: the casts say it.

    async def get_run(self, trace_id: str) -> RunInfo | None:
        with store_errors():
            h = cast("dict[bytes, bytes]", await self.redis.hgetall(f"{self.prefix}:r:{trace_id}"))
        if not h:
            return None
        return _info(trace_id, h)

    async def get_data(self, trace_id: str) -> dict[str, bytes]:
        with store_errors():
            h = cast("dict[bytes, bytes]", await self.redis.hgetall(f"{self.prefix}:d:{trace_id}"))
        return {k.decode(): v for k, v in h.items()}

    async def get_steps(self, trace_id: str, start: int = 0) -> list[StepRecord]:
        with store_errors():
            raw = cast("list[bytes]", await self.redis.lrange(f"{self.prefix}:s:{trace_id}", max(0, start), -1))
        return [_unrecord(r) for r in raw]

    async def watch_steps(
        self, trace_id: str, start: int, timeout: float
    ) -> tuple[list[StepRecord], RunInfo | None]:
        """Woken by the notification each commit of the run publishes to the channels
        registered with it (``P:e:<trace>``), and looking again now and then in case one
        was missed."""
        if self._watch is None:
            self._watch = FinishWatch(self.redis, self.prefix)
        waiter = Waiter()
        deadline = time.monotonic() + timeout
        self._watch.add([trace_id], waiter)
        try:
            register = True
            pause = self._poll_pause
            while True:
                records, info = await self._steps_and_run(trace_id, start, self._watch.channel if register else None)
                register = False
                now = time.monotonic()
                if records or info is None or info.status.finished or now >= deadline:
                    return records, info
                await waiter.sleep(min(pause, deadline - now))
                waiter.take()
                pause = min(pause * 2, 2.0)
        finally:
            self._watch.remove([trace_id], waiter)

    async def _steps_and_run(
        self, trace_id: str, start: int, channel: str | None
    ) -> tuple[list[StepRecord], RunInfo | None]:
        """The records from ``start`` and the run's hash, read in one transaction; with
        ``channel``, registered first to hear of the run's commits."""
        ek = f"{self.prefix}:e:{trace_id}"
        with store_errors():
            async with self.redis.pipeline(transaction=True) as pipe:
                if channel is not None:
                    pipe.sadd(ek, channel)
                    pipe.expire(ek, max(1, int(self.ttl)))
                pipe.lrange(f"{self.prefix}:s:{trace_id}", max(0, start), -1)
                pipe.hgetall(f"{self.prefix}:r:{trace_id}")
                replies = await pipe.execute()
        raw, h = replies[-2], replies[-1]
        if not h:
            return [], None
        return [_unrecord(r) for r in raw], _info(trace_id, h)

    async def cancel(self, trace_id: str, reason: str) -> tuple[RunInfo | None, list[Message]]:
        error = msgpack.packb({"type": "dflow.RunCancelled", "message": reason, "step": ""})
        r = await self._run_script("CANCEL", _scripts.CANCEL.args(
            prefix=self.prefix, trace=trace_id, now=time.time(), ttl_ms=int(self.ttl * 1000),
            redispatch=self.redispatch_after, stream=self._stream, error=error,
        ))
        if not r:
            return None, []
        return await self.get_run(trace_id), [Message.decode(m) for m in r[1]]

    async def get_blob(self, ref: str) -> bytes | None:
        with store_errors():
            blob = cast("bytes | None", await self.redis.get(f"{self.prefix}:b:{ref}"))
        return blob

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
            ended = [i for i, st in enumerate(statuses) if st in (b"done", b"failed", b"cancelled", b"compensated")]
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
                ids = cast("list[bytes]",
                           await self.redis.zrevrange(f"{self.prefix}:runs", start, start + limit - 1))
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

    async def page_runs(
        self,
        limit: int = 50,
        *,
        status: RunStatus | None = None,
        pipeline: str | None = None,
        cursor: str | None = None,
    ) -> RunPage:
        """One script reads the page from the listings (see ``lua/listed.lua``) and each
        run's fields, in O(log N + page) for N listed runs."""
        status, after = check_page(limit, status, pipeline, cursor)
        after_ms, after_trace = after if after is not None else ("", "")
        args = _scripts.PAGE.args(
            prefix=self.prefix, pipeline=pipeline or "", status=status.value if status is not None else "",
            after_ms=after_ms, after_trace=after_trace, limit=limit, fields=_INFO_FIELDS,
        )
        packed, ms, trace = await self._run_script("PAGE", args)
        flat = msgpack.unpackb(packed, raw=True) or ()
        runs = [
            _info(flat[i].decode(), {k: v for k, v in zip(_INFO_KEYS, flat[i + 1]) if v is not False})
            for i in range(0, len(flat), 2)
        ]
        return RunPage(runs, None if trace is None else encode_cursor(int(ms), trace.decode()))

    async def count_runs(self, *, pipeline: str | None = None) -> dict[RunStatus, int]:
        check_pipeline(pipeline)
        r = await self._run_script("COUNT", _scripts.COUNT.args(prefix=self.prefix, pipeline=pipeline or ""))
        return {RunStatus(r[i].decode()): int(r[i + 1]) for i in range(0, len(r), 2)}

    async def ping(self) -> None:
        with store_errors():
            await self.redis.ping()

    async def close(self) -> None:
        if self._watch is not None:
            await self._watch.close()
            self._watch = None
        await self.redis.aclose(close_connection_pool=True)


def _claimed(message: Message, token: str, reply: list[Any]) -> Claim:
    raw_frames, value, init_only, data_flat, slots, blobs = reply
    data = {data_flat[i].decode(): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
    branches = [_branch(s) for s in slots] if message.kind == JOIN and slots else None
    return Claim(message, token, raw_frames or None, value, data, bool(init_only), branches,
                 tuple(blobs.decode().split()) if blobs else ())


def same_server(a: aioredis.Redis, b: aioredis.Redis) -> bool:
    """Whether two clients talk to the same server and database as the same user."""
    return _same(a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs)


def fusable(url: str, transport: object) -> bool:
    """Whether a store at ``url`` can write step messages to ``transport`` itself: a Redis
    Streams transport on the same server and database, as the same user."""
    from ._transport import RedisStreamsTransport

    if not isinstance(transport, RedisStreamsTransport):
        return False
    try:
        kwargs = aioredis.ConnectionPool.from_url(url).connection_kwargs
    except (TypeError, ValueError):
        return False
    return _same(kwargs, transport.redis.connection_pool.connection_kwargs)


def _same(ka: dict[str, Any], kb: dict[str, Any]) -> bool:
    return all(ka.get(f) == kb.get(f) for f in ("host", "port", "path", "db", "username"))


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
        pipeline=_s(h.get(b"pipeline")),
    )
