"""Re-running a run from a step (``Run.rerun_from``, ``dflow rerun``): how one recovers a run
that failed at step 40 of 50 once the bug is fixed.

A rerun is a *new* run (a fresh trace id) of the same pipeline with the same parameter. It
replays the steps before the rerun point ``SEQ`` from the original's step records and
executes the rest with the code deployed now:

- It starts where the original started (the pipeline is named by the head key of the
  original's first record, its parameter is the original's ENTRY record), with the
  original's data *as it is now* (see the caveat below), and under the reserved data key
  :data:`RERUN_KEY` the link ``{"trace_id": original, "seq": SEQ, ...}``, which
  ``Run.tree()`` and ``dflow inspect`` show; the original names its reruns in the
  store's run notes, and is rerun once unless asked ``again`` (``rerun_links``).
- Each step the rerun reaches with a sequence number below ``SEQ`` takes the original's
  recorded result (same seq, same key; done, or recovered by an ``on_error_return``)
  instead of calling its function: a ``map`` is not called, a ``zip``/``any`` starts no
  branch (its join's result is taken), a ``delay`` does not sleep, a ``from_call`` takes
  the answer it got (its ``on_init`` does not run). A ``flat_map`` *does* run its function
  again: it builds the flow the run continues with, which no record holds. Keep side
  effects (and model calls) out of flat_map functions for them to be replayed.
- From ``SEQ`` on the steps run for real, zip/any branches included.

Sequence numbers line up because a run that goes through the same steps numbers them the
same way; a replayed step checks that it gets the input the original's step got, and that
the original went on with the step the rerun goes on with (seq and key). When it does not
(the fix changed the flow before ``SEQ``: ids added, renamed or removed; or a flat_map
built another flow, or passed on another value: one that asks a model, say), the rerun
fails at that step with a ``BuildError`` saying where they part, rather than feed recorded
results to steps they do not belong to. Step keys name every step after them: the fix may
change what steps do, not the flow's shape. A rerun of a rerun replays from the records of
the runs that really executed each step (the link keeps them), so those runs must not
have expired.

What a step wrote with ``ctx.put`` is not in its record: the rerun starts with the
original's data as it is now (its own link replaced), which holds the writes of the
replayed steps, and also those of the steps from ``SEQ`` on that ran in the original (none
when it failed at ``SEQ``, the common case): those steps see their earlier writes until
they write again. The original's compensations (``DFlow.compensate``) do not carry over:
a rerun that fails compensates the steps it ran itself, not the replayed ones; a run whose
compensations ran is rerun from its first step only (what it did was undone).

Refused, with an error saying why: an unknown run, one still going (cancel it first), a
``zip``/``any`` branch run (rerun its parent from the zip's step), a ``direct_run`` (its
flow was built at run time), ``SEQ`` outside the steps the run took, or the second half of
a step (a zip's join, a delay's or a wait's end): rerun from the step that started it.
Cost: an ordinary run pays one dict lookup per step (the link in the claimed data); a
rerun's worker reads the records once per rerun (cached, a few runs at most).
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import msgpack

from ..context import ContextStack, RunInfo, StepRecord, StepStatus
from ..errors import BuildError, RunError, RunNotFoundError, StoreError
from ..model import interpret as interp
from ..model.calls import call_step, error_info
from ..model.chains import ChainCodec
from ..model.nodes import Frame, Kind, Node, compile_flow
from ..model.registry import static_ref
from ..observe import kept_pipeline
from ..store import COMPENSATING, SAGA_PREFIX, Claim, Fail, Finish, Frames, NewRun, Store
from ..wire.values import NONE, Message, decode
from .rerun_links import RERUN_KEY, RerunLink, describe, failed_creation, link_of, noted, replayed_until

__all__ = ["RERUN_KEY", "RerunLink", "describe", "link_of", "replay", "replayed_until", "start_rerun"]

# the head key of every DFlow.direct_run run (model/direct_run.py)
_DIRECT_RUN_HEAD = "direct_run>direct_run.build"
_TWO_SEQ = (StepStatus.FORKED, StepStatus.SLEEPING, StepStatus.WAITING)  # completed at the next seq
_HALF = {
    StepStatus.FORKED: "the join of the zip/any",
    StepStatus.SLEEPING: "the end of the delay",
    StepStatus.WAITING: "the answer to the from_call",
}
_CACHE_RUNS = 8  # reruns whose replay records a worker keeps at once

Index = dict[int, list[StepRecord]]  #: records by seq


# -- starting a rerun ---------------------------------------------------------------------


async def start_rerun(
    store: Store, chains: ChainCodec, original: str, seq: int, *, again: bool = False
) -> tuple[str, list[Message]]:
    """Create the rerun of run ``original`` from step ``seq`` (see the module); return its
    trace id and the messages to publish. ``RunNotFoundError`` for no such run, ``RunError``
    saying why for a run or a step that cannot be rerun, ``AlreadyRerunError`` for a run
    rerun already (unless ``again``), ``TypeError`` for a ``seq`` that is no int."""
    if type(seq) is not int:
        raise TypeError(f"a rerun starts from a step's seq, an int; got {type(seq).__qualname__}")
    info = await _ended_run(store, original)
    own = await store.get_steps(original)
    first, last = _steps_taken(original, own)
    _check_rerun_point(original, info, seq, first, last)
    data = await _carried_data(store, original)
    parent = link_of(data.get(RERUN_KEY))
    sources = _sources(
        parent if parent is not None and parent.run == original else None, original, info.created, seq
    )
    try:  # (from the first step nothing is replayed: no run's records are needed)
        index = await _load(store, sources, {original: own}) if seq > first else {}
    except _Gone as exc:
        raise RunError(
            f"run {original!r} cannot be rerun from step {seq}: {exc}", trace_id=original
        ) from None
    _check_whole_step(original, own, index, seq)
    trace_id = uuid.uuid4().hex
    data[RERUN_KEY] = RerunLink(original, seq, trace_id, sources).encode()
    new = _rerun_at(chains, trace_id, own, first, data, info.pipeline)
    await noted(store, original, trace_id, again=again)  # (refused here: nothing was created)
    try:
        publish = await store.create_run(new)
    except BaseException as exc:  # (forgotten if it surely was not created: see rerun_links)
        await failed_creation(store, original, trace_id, exc)
        raise
    if info.business_key is not None:  # (the rerun is about what the original is about)
        await store.run_notes.set_business_key(trace_id, info.business_key)
    return trace_id, publish


async def _ended_run(store: Store, original: str) -> RunInfo:
    """The run to rerun: one that exists, is no branch of a zip/any, and has ended."""
    info = await store.get_run(original)
    if info is None:
        raise RunNotFoundError(
            f"no run with trace id {original!r} (never started, or expired)", trace_id=original
        )
    if info.parent is not None or "/" in original:
        raise RunError(
            f"run {original!r} is a branch of a zip/any of run {info.parent or original.split('/')[0]!r}: "
            "rerun that run from the zip's step",
            trace_id=original,
        )
    if not info.status.finished:
        raise RunError(
            f"run {original!r} is still {info.status.value}: a rerun would race it. Cancel it first "
            "(Run.cancel, dflow cancel) or wait for it to end",
            trace_id=original,
        )
    return info


def _steps_taken(original: str, own: list[StepRecord]) -> tuple[int, int]:
    """The first and the last seq of the steps run ``original`` took that a rerun may start
    from (its records ``own``): after its entry call, if one started it; refused for a run
    with no such steps, or one whose flow was built at run time."""
    if not own or own[0].seq != 0:
        raise RunError(
            f"run {original!r} has no record of its first step: nothing to rerun", trace_id=original
        )
    head = own[0]
    if head.key == _DIRECT_RUN_HEAD:
        raise RunError(
            f"run {original!r} was started by direct_run: its flow was built at run time and is not "
            "kept, so it cannot be rerun; start it again with direct_run",
            trace_id=original,
        )
    first = 1 if head.status == StepStatus.ENTRY else 0  # (an entry's record holds the run's parameter)
    last = max(r.seq for r in own)
    if last < first:
        raise RunError(
            f"run {original!r} took no step after the entry call that started it: nothing to rerun",
            trace_id=original,
        )
    return first, last


def _check_rerun_point(original: str, info: RunInfo, seq: int, first: int, last: int) -> None:
    """Refuse a ``seq`` outside the steps the run took, and a later step than its first of a
    run whose compensations undid what its steps did."""
    if seq < first or seq > last:
        raise RunError(
            f"run {original!r} has no step {seq} to rerun from: its steps are {first} to {last}"
            + (" (0 is the entry call that started it)" if seq == 0 and first else ""),
            trace_id=original,
        )
    undone = (info.error or {}).get("compensated")
    if seq > first and isinstance(undone, list) and undone:
        raise RunError(
            f"run {original!r} was compensated: what its steps did was undone, so their results cannot be "
            f"replayed; rerun it from its first step ({first})",
            trace_id=original,
        )


async def _carried_data(store: Store, original: str) -> dict[str, bytes]:
    """The original's data as the rerun starts with it: without its compensations (signed
    for it, they are not the rerun's: it undoes the steps it runs)."""
    return {
        k: v
        for k, v in (await store.get_data(original)).items()
        if not k.startswith(SAGA_PREFIX) and k != COMPENSATING
    }


def _check_whole_step(original: str, own: list[StepRecord], index: Index, seq: int) -> None:
    """Refuse a ``seq`` that is the second half of a step (a join, a delay's end, a call's
    answer) or that the run recorded no step of its own at."""
    before = index.get(seq - 1, [])
    half = next((r for r in before if r.status in _TWO_SEQ), None)
    if half is not None:
        raise RunError(
            f"step {seq} of run {original!r} is {_HALF[half.status]} started at step {seq - 1}: rerun "
            f"from step {seq - 1} to run it again, or from a later step",
            trace_id=original,
        )
    if not any(r.seq == seq for r in own):
        raise RunError(
            f"run {original!r} recorded no step {seq} of its own (it is part of the step before it): "
            "rerun from that step or from a later one",
            trace_id=original,
        )


def _rerun_at(
    chains: ChainCodec,
    trace_id: str,
    own: list[StepRecord],
    first: int,
    data: dict[str, bytes],
    pipeline: str | None,
) -> NewRun:
    """The new run ``trace_id``: at the original's first step (named by its head key), with
    its parameter (the original's ENTRY record, when an entry call started it)."""
    head = own[0]
    first_key = next(r.key for r in own if r.seq == first)  # (there is one: a run records each step it takes)
    record = chains.seal_frames(trace_id, msgpack.packb([[static_ref(head.key), first, "", False]]))
    value = head.raw_output if first and head.raw_output is not None else NONE
    records = [StepRecord(head.key, 0, StepStatus.ENTRY, raw_output=value)] if first else []
    return NewRun(
        trace_id,
        Frames(record),
        value,
        Message(trace_id, first, first_key),
        data=data,
        records=records,
        pipeline=pipeline,
    )


def _sources(
    parent: RerunLink | None, original: str, created: float, seq: int
) -> tuple[tuple[str, float, int], ...]:
    """Which run executed each step before ``seq``: those ``parent`` (the original's own
    link, when it is a rerun) replayed came from its sources; the original executed the rest."""
    out: list[tuple[str, float, int]] = []
    for trace, made, until in parent.sources if parent is not None else ():
        if until >= seq:
            out.append((trace, made, seq))
            return tuple(out)
        out.append((trace, made, until))
    out.append((original, created, seq))
    return tuple(out)


async def _load(
    store: Store,
    sources: Sequence[tuple[str, float, int]],
    known: Mapping[str, list[StepRecord]] | None = None,
) -> Index:
    """The records of steps ``0..seq`` (the last source's ``until``) from ``sources``.
    ``_Gone`` when a source run is no longer there (expired, or another run took its id)."""
    index: Index = {}
    start = 0
    for i, (trace, created, until) in enumerate(sources):
        info = await store.get_run(trace)
        if info is None or info.created != created:
            raise _Gone(
                f"run {trace!r}, which executed the steps {start} to {until - 1} this rerun replays, is gone "
                "(expired): they cannot be replayed"
            )
        records = known[trace] if known is not None and trace in known else await store.get_steps(trace)
        end = until + 1 if i == len(sources) - 1 else until  # the rerun point's own records: to check against
        for r in records:
            if start <= r.seq < end:
                index.setdefault(r.seq, []).append(r)
        start = until
    return index


# -- replaying a step ---------------------------------------------------------------------


class _Diverged(BuildError):
    """The rerun left the original's path (recorded as a ``BuildError``)."""


class _Gone(StoreError):
    """A run whose records are replayed is gone."""


_cache: OrderedDict[tuple[tuple[str, float, int], ...], Index] = OrderedDict()

Replayed = tuple[interp.Outcome, StepStatus, bytes | None]


async def replay(
    store: Store,
    pool: Callable[[], concurrent.futures.ThreadPoolExecutor],
    raw: bytes,
    node: Node,
    ctx: ContextStack,
    claim: Claim,
    frames: tuple[Frame, ...],
) -> Replayed | None:
    """What the step of ``claim`` (a RUN message of a run whose data holds the link ``raw``)
    does in a rerun: ``None`` when it runs for real (at or after the rerun point, or in a
    branch), else its outcome from the records (see the module). A rerun that left the
    original's path, or whose records are gone, fails here."""
    msg = claim.message
    link = link_of(raw)
    if link is None or link.run != msg.trace_id or msg.seq >= link.seq:
        return None
    try:
        index = _cache.get(link.sources)
        if index is None:
            index = await _load(store, link.sources)
            _cache[link.sources] = index
            while len(_cache) > _CACHE_RUNS:
                _cache.popitem(last=False)
        result = await _replayed(index, link, node, ctx, claim, frames, pool)
    except (_Diverged, StoreError) as exc:  # the run fails: no retry, no on_error_return would make it right
        why = f"rerun of run {link.trace_id!r} from step {link.seq}: {exc}"
        error = BuildError(why) if isinstance(exc, _Diverged) else StoreError(why)
        return Fail(error_info(error, msg.key)), StepStatus.FAILED, None
    outcome = result[0]
    if not isinstance(outcome, interp.Go) or outcome.message.seq >= link.seq:
        _cache.pop(link.sources, None)  # the replay is over (for this worker)
    return result


async def _replayed(
    index: Index,
    link: RerunLink,
    node: Node,
    ctx: ContextStack,
    claim: Claim,
    frames: tuple[Frame, ...],
    pool: Callable[[], concurrent.futures.ThreadPoolExecutor],
) -> Replayed:
    msg = claim.message
    seq, key = msg.seq, msg.key
    here = index.get(seq, [])
    if not any(r.key == key for r in here):
        was = ", ".join(sorted({repr(r.key) for r in here})) or "nothing"
        raise _Diverged(
            f"step {seq} is {key!r} now, but was {was} in the run that executed it: the flow changed "
            "before the rerun point (step keys name every step after them); rerun from an earlier step"
        )
    given = next((r.raw_input for r in here if r.key == key and r.raw_input is not None), None)
    if given is not None and given != claim.value:
        raise _Diverged(
            f"step {seq} {key!r} gets another input now than in the run that executed it: what the flow "
            "computed before it differs (a flat_map's function gave another flow or value, or the code "
            "before the rerun point changed), so its recorded result does not fit; rerun from an earlier "
            "step"
        )
    if node._kind == Kind.FLAT_MAP:
        done = next((r for r in here if r.key == key and r.status == StepStatus.DONE), None)
        if done is not None:
            return await _flat_map(index, link, node, ctx, claim, frames, pool)
    at, rec = _completion(index, seq, key)
    outcome = _continued(msg.trace_id, at, frames, rec)
    _check_next(index, link, outcome)
    return outcome, rec.status, rec.raw_output


async def _flat_map(
    index: Index,
    link: RerunLink,
    node: Node,
    ctx: ContextStack,
    claim: Claim,
    frames: tuple[Frame, ...],
    pool: Callable[[], concurrent.futures.ThreadPoolExecutor],
) -> Replayed:
    """A flat_map's function runs again: it builds the flow the run goes on with. (A zip/any
    that flow starts with is its own step here, replayed next: where the original started
    it in the flat_map's step, it recorded it under the next seq all the same.)"""
    msg = claim.message
    inner = await call_step(node, node._fn, node._ctx_arg, ctx, decode(claim.value), pool)
    chain = compile_flow(inner, f"the flow returned by flat_map step {msg.key!r}")
    outcome = interp.enter(msg, frames, chain)
    if isinstance(outcome, interp.Go):  # (as the step did: a tail call keeps the run's pipeline)
        ctx._changes.update(kept_pipeline(frames, outcome.frames))
    _check_next(index, link, outcome)
    if chain.nodes[0]._kind != Kind.JUST:
        return outcome, StepStatus.DONE, None
    return outcome, StepStatus.DONE, outcome.result if isinstance(outcome, Finish) else outcome.value


def _completion(index: Index, seq: int, key: str) -> tuple[int, StepRecord]:
    """Where and how the step ``key`` at ``seq`` completed: done, or recovered by a handler,
    in that seq, or the next one for a step in two halves (a zip/any, a delay, a wait)."""
    here = index.get(seq, [])
    for at, records in ((seq, here), (seq + 1, index.get(seq + 1, []))):
        for r in records:
            if r.key == key and r.status == StepStatus.DONE:
                return at, r
        for r in records:
            if r.status == StepStatus.RECOVERED:
                return at, r
        if not any(r.key == key and r.status in _TWO_SEQ for r in here):
            break
    raise _Diverged(f"step {seq} {key!r} has no result recorded in the run that executed it")


def _continued(trace_id: str, seq: int, frames: tuple[Frame, ...], rec: StepRecord) -> interp.Go | Finish:
    """The run's next state once the step completed at ``seq`` as ``rec`` says."""
    out = rec.raw_output if rec.raw_output is not None else NONE
    if rec.status == StepStatus.DONE:
        return interp.after(trace_id, seq, frames, out)
    for here, _handler in interp.handlers(frames):
        if here[-1].key == rec.key:
            return interp.after(trace_id, seq, here, out)
    raise _Diverged(
        f"step {seq} was recovered by the on_error_return of {rec.key!r}, which the flow has no more"
    )


def _check_next(index: Index, link: RerunLink, outcome: interp.Outcome) -> None:
    """The original went on with the step the rerun goes on with."""
    if not isinstance(outcome, interp.Go):
        raise _Diverged("the flow ends here, but the run that executed this step went on")
    nxt = outcome.message
    if nxt.seq <= link.seq and not any(r.key == nxt.key for r in index.get(nxt.seq, [])):
        was = ", ".join(sorted({repr(r.key) for r in index.get(nxt.seq, [])})) or "nothing"
        raise _Diverged(
            f"the flow goes on with step {nxt.seq} {nxt.key!r}, but the run that executed it went on "
            f"with {was}: the flow changed before the rerun point (step keys name every step after "
            "them); rerun from an earlier step"
        )
