"""A commit of ``RedisStore``, around its COMMIT script (and its CREATE script's arguments):
the arguments and keys it sends, the delivery it acknowledges and the next step it read back
(fused) with the data it already holds (``data_cache``), and what comes before
and after the script: a fork's branches are checked to be in the run's bucket, and after a
refused commit a claim lost with its primary sends its step again. Plain functions taking
the store (``RedisStore.commit`` calls them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from dflow.context import StepRecord
from dflow.errors import RunExistsError, StoreError
from dflow.run_pages import created_ms
from dflow.store import Claim, Compensations, NewRun, Taken, compensations_in, deadline_text
from dflow.wire.values import Message

from . import scripts
from .codec import Encoded, claimed, first_step, parent_link
from .errors import store_errors
from .records import lean_first, pack_records

if TYPE_CHECKING:
    from .store import RedisStore

__all__ = [
    "claim_keys",
    "commit_args",
    "commit_keys",
    "create_args",
    "orphaned",
    "parts_key",
    "read_taken",
    "receipt_here",
    "same_bucket",
]

log = logging.getLogger("dflow.redis")


def receipt_here(store: RedisStore, at: int, receipt: Any) -> Any:
    """The entry to acknowledge on bucket ``at``'s stream: with buckets a receipt is
    (bucket, entry id), acknowledged here only when it is this bucket's."""
    if receipt is None:
        return ""
    if store.keyspace.n > 1:
        return receipt[1] if isinstance(receipt, tuple) and receipt[0] == at else ""
    return receipt


def create_args(store: RedisStore, at: int, run: NewRun, now: float) -> list[Any]:
    """The ``CREATE`` script's arguments for ``run``, in bucket ``at``."""
    frames, msg, parent = run.frames, run.message, run.parent
    flag = compensations_in(run.trace_id, run.data) or Compensations.NONE
    return scripts.CREATE.args(
        prefix=store._prefixes[at],
        trace=run.trace_id,
        now=now,
        redispatch=store.redispatch_after,
        ttl_ms=int(store.ttl * 1000),
        stream=store._streams[at],
        blob_grace_ms=int(store.blob_ttl * 1000),
        blobs=" ".join(frames.blobs) if frames else "",
        frames=frames.record if frames else b"",
        value=run.value,
        **first_step(msg),
        result=run.result if run.result is not None else b"",
        **parent_link(parent),
        pipeline=run.pipeline or "",
        listed_ms=created_ms(now) if parent is None else "",
        token=store._token(),
        compensations=flag.value,
        deadline="" if run.deadline is None else deadline_text(run.deadline),
        records=pack_records(run.records),
        data=[x for kv in run.data.items() for x in kv],
    )


def commit_args(
    store: RedisStore,
    at: int,
    claim: Claim,
    records: list[StepRecord],
    changes: Mapping[str, bytes | None],
    encoded: Encoded,
    ack: Any,
    take_token: str,
    take_lease: float | None,
) -> list[Any]:
    flag = compensations_in(claim.message.trace_id, changes)
    return scripts.COMMIT.args(
        prefix=store._prefixes[at],
        trace=claim.message.trace_id,
        token=claim.token,
        now=time.time(),
        ttl_ms=int(store.ttl * 1000),
        redispatch=store.redispatch_after,
        claim_kind=claim.message.kind,
        stream=store._streams[at],
        group=store._group,
        receipt=ack,
        taker=store._consumer if take_token else "",
        take_token=take_token,
        take_lease=take_lease or 0,
        blob_grace_ms=int(store.blob_ttl * 1000),
        blob_refs=" ".join(sorted(encoded.refs)),
        children=" ".join(encoded.children),
        transition=encoded.kind,
        compensations=flag.value if flag is not None else "",
        lean_record=lean_first(records),
        parts_seq=encoded.parts_seq,
        records=pack_records(records),
        sets=[x for k, v in changes.items() if v is not None for x in (k, v)],
        dels=[k for k, v in changes.items() if v is None],
        fields=encoded.fields,
    )


def parts_key(store: RedisStore, at: int, trace_id: str, seq: int) -> str:
    """The key of the parts of step ``seq`` of a run (``RedisParts``), in bucket ``at``."""
    return f"{store._prefixes[at]}:pt:{trace_id}:{seq}"


def claim_keys(store: RedisStore, at: int, message: Message) -> list[str]:
    """The keys a claim declares on a cluster: the run's, and its step's parts (the claim
    says whether they exist)."""
    keys = store._keys(at, message.trace_id)
    if keys:
        keys.append(parts_key(store, at, message.trace_id, message.seq))
    return keys


def commit_keys(store: RedisStore, at: int, claim: Claim, encoded: Encoded) -> list[str]:
    """The keys a commit declares on a cluster: the run's, the blobs', the branches', the
    step's parts when they go."""
    if not store.cluster:
        return []
    m = claim.message
    keys = store._keys(at, m.trace_id, encoded.refs.union(claim.blobs))
    if encoded.parts_seq:
        keys.append(parts_key(store, at, m.trace_id, m.seq))
    for child in encoded.children:
        keys += [f"{store._prefixes[at]}:{k}:{child}" for k in ("r", "d", "s", "c", "w", "e")]
    return keys


def read_taken(
    store: RedisStore, at: int, taken: Any, take_token: str, committed: tuple[str, Mapping[str, bytes]]
) -> Taken | None:
    """The next message the commit read for this worker: its claim, or none when it is
    no step message (the worker sets it aside). ``committed``: the committed run's id and its
    data now, which the claim of its next step comes without."""
    if not taken:
        return None
    if store.keyspace.n > 1:
        taken = [(at, taken[0]), *taken[1:]]
    if len(taken) < 3:
        return Taken(taken[1], taken[0], None)
    try:
        m = Message.decode(taken[1])
        claim, version = claimed(
            m, take_token, taken[2], committed[1] if m.trace_id == committed[0] else None
        )
    except Exception as exc:  # the step stays leased: it runs again when its lease expires
        log.warning("dflow: could not read the next step %r after a commit: %s", taken[1], exc)
        return None
    store._data.claimed(claim, version)
    return Taken(taken[1], taken[0], claim)


async def orphaned(store: RedisStore, at: int, m: Message) -> None:
    """After a refused commit: if the run is still at this very step and no lease is held
    on it, the claim was lost (it had not reached a replica when its primary failed): the
    step's message goes onto the stream again. The refused commit took the delivery off
    the stream, and a fused store keeps no outbox for the timer scan to send again. A
    message that turns out to be a duplicate is dropped at claim."""
    P = store._prefixes[at]
    with store_errors():
        seq, attempt, key, token, status, init = cast(
            "list[bytes | None]",
            await store.redis.hmget(
                f"{P}:r:{m.trace_id}", ["seq", "attempt", "key", "lease_token", "status", "init_pending"]
            ),
        )
        if token is not None or (seq, attempt, key) != (
            str(m.seq).encode(),
            str(m.attempt).encode(),
            m.key.encode(),
        ):
            return
        if status in (b"running", b"sleeping") or (status == b"waiting" and init == b"1"):
            log.warning(
                "dflow: the lease of step %s of run %s was lost with its Redis primary; "
                "sending the step again",
                m.key,
                m.trace_id,
            )
            await store.redis.xadd(store._streams[at], {b"m": m.encode()})


async def same_bucket(store: RedisStore, at: int, trace_id: str, children: list[NewRun]) -> None:
    """A fork writes its branches in its own bucket: each must belong there (a branch
    id, ``<parent>/<seq>-<index>``, always does)."""
    for child in children:
        if store._at(child.trace_id) != at:
            if await store.get_run(child.trace_id) is not None:
                raise RunExistsError(
                    f"a zip/any branch of run {trace_id!r} would overwrite the existing run "
                    f"{child.trace_id!r}; nothing was changed",
                    trace_id=child.trace_id,
                )
            raise StoreError(
                f"a zip/any branch of run {trace_id!r} is named {child.trace_id!r}, not "
                f"'{trace_id}/<seq>-<index>': its keys would be in another bucket; nothing was changed"
            )
