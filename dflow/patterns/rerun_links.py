"""The links between a run and its reruns (``Run.rerun_from``, see ``rerun``), and the guard
against rerunning a run twice by mistake.

A rerun's data holds its link to the run it reruns (:data:`RERUN_KEY`); the run it reruns
names its reruns in the store's run notes (``dflow.run_notes``: ``RunInfo.reruns``). Before
a rerun is created, ``noted`` records it there, in the one write that checks the run has no
rerun yet: a second rerun of the same run (a double click, two operators, a retried
script) is refused with ``AlreadyRerunError`` naming the first, so a step that is not
idempotent is not sent twice; ``again=True`` insists. A store that keeps no run notes
reruns without the check.

When the creation fails, the note goes only where the rerun surely was not created (the
store refused it, or it is not there when read again): after an ambiguous failure (the
store unreachable once the write was sent) a rerun that may exist stays noted, and the
next is refused naming it. A note whose run was never created (a crash between the note
and the creation, or a failure after which the store could not be read) does not hold the
run forever: once it is ``UNCREATED_AFTER`` old and its run is not there, the next rerun
takes its place, in the same atomic write as the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import (
    AlreadyRerunError,
    ConfigurationError,
    PayloadRejectedError,
    RunExistsError,
    SerializationError,
)
from ..run_notes import UNCREATED_AFTER, RunNotes
from ..store import Store
from ..wire.values import decode, encode

__all__ = [
    "RERUN_KEY",
    "RerunLink",
    "describe",
    "dropped",
    "failed_creation",
    "link_of",
    "noted",
    "replayed_until",
    "reruns_line",
]

RERUN_KEY = "dflow/rerun"  #: the data key of a rerun's link to the run it reruns


@dataclass(frozen=True, slots=True)
class RerunLink:
    """A rerun's link: ``run`` reruns ``trace_id`` from step ``seq``; ``sources`` say which
    run executed the steps it replays: ``(trace id, created, until)`` each, from seq 0 on,
    the last one up to ``seq``."""

    trace_id: str
    seq: int
    run: str
    sources: tuple[tuple[str, float, int], ...]

    def encode(self) -> bytes:
        return encode(
            {
                "trace_id": self.trace_id,
                "seq": self.seq,
                "run": self.run,
                "sources": [list(s) for s in self.sources],
            }
        )


_links: dict[bytes, RerunLink | None] = {}


def link_of(raw: bytes | None) -> RerunLink | None:
    """The link stored under :data:`RERUN_KEY`, or ``None`` (none, or not one dflow wrote)."""
    if raw is None:
        return None
    if raw in _links:
        return _links[raw]
    link = None
    try:
        v = decode(raw)
        sources = tuple(
            (t, float(c), u)
            for t, c, u in v["sources"]
            if isinstance(t, str) and isinstance(c, (int, float)) and type(u) is int
        )
        if (
            isinstance(v["trace_id"], str)
            and type(v["seq"]) is int
            and isinstance(v["run"], str)
            and sources
            and len(sources) == len(v["sources"])
            and sources[-1][2] == v["seq"]
        ):
            link = RerunLink(v["trace_id"], v["seq"], v["run"], sources)
    except Exception:
        link = None
    if len(_links) >= 1024:
        _links.clear()
    _links[raw] = link
    return link


def describe(data: Mapping[str, bytes], trace_id: str) -> str | None:
    """The line ``dflow inspect`` shows for a rerun, or ``None`` for another run."""
    link = link_of(data.get(RERUN_KEY))
    if link is None or link.run != trace_id:
        return None
    return (
        f"rerun of run {link.trace_id} from step {link.seq} (the steps before it replayed from its records)"
    )


def replayed_until(data: Mapping[str, bytes], trace_id: str) -> int:
    """The rerun point of run ``trace_id`` if it is a rerun (its steps before it replayed), else 0."""
    link = link_of(data.get(RERUN_KEY))
    return link.seq if link is not None and link.run == trace_id else 0


# -- the run a rerun was rerun from names it -----------------------------------------------


def _notes(store: Store) -> RunNotes | None:
    try:
        return store.run_notes
    except ConfigurationError:
        return None


async def noted(store: Store, original: str, rerun: str, *, again: bool) -> None:
    """Record ``rerun`` as a rerun of ``original``; ``AlreadyRerunError`` (nothing
    recorded) when ``original`` has one and not ``again``. A noted rerun whose run is not
    there is replaced once it is ``UNCREATED_AFTER`` old (its creation failed)."""
    notes = _notes(store)
    if notes is None:
        return
    existing = await notes.note_rerun(original, rerun, again=again)
    if existing is None:
        return
    there = await store.get_run(existing) is not None
    if not there:  # (never created, or being created now: the note's age tells)
        existing = await notes.note_rerun(original, rerun, replacing=existing, older_than=UNCREATED_AFTER)
        if existing is None:
            return
        there = await store.get_run(existing) is not None
    follow = (
        f"follow that run (dflow inspect {existing})"
        if there
        else f"its creation is under way or failed (it is forgotten {UNCREATED_AFTER:.0f} s after it was noted)"
    )
    raise AlreadyRerunError(
        f"run {original!r} was rerun already, as run {existing!r}: {follow}, or start another rerun with "
        "again=True (dflow rerun --again; ?again=true on the console's API) if its steps may run once more",
        trace_id=original,
        rerun=existing,
    )


async def dropped(store: Store, original: str, rerun: str) -> None:
    """Forget ``rerun`` among the reruns of ``original`` (its creation failed)."""
    notes = _notes(store)
    if notes is not None:
        await notes.drop_rerun(original, rerun)


#: what a store raises when it refused to create a run, writing nothing
_REFUSED = (RunExistsError, SerializationError, PayloadRejectedError)


async def failed_creation(store: Store, original: str, rerun: str, error: BaseException) -> None:
    """The creation of ``rerun`` failed with ``error``: forget it among the reruns of
    ``original`` when it surely was not created (refused, or not there when read again);
    keep it when it may exist (the store applied the write, then failed to answer) or
    cannot be told (the store cannot be read either: ``noted`` replaces it once it is old)."""
    if not isinstance(error, _REFUSED):
        try:
            if await store.get_run(rerun) is not None:
                return
        except Exception:
            return
    try:
        await dropped(store, original, rerun)
    except Exception:  # (the caller sees the creation's error; the note goes once old, as above)
        return


def key_line(key: str | None) -> str | None:
    """The line ``dflow inspect`` shows for a run with a business key, or ``None``."""
    return None if key is None else f"business key {key}"


def reruns_line(reruns: tuple[str, ...]) -> str | None:
    """The line ``dflow inspect`` shows for a run that was rerun, or ``None``."""
    if not reruns:
        return None
    *before, newest = reruns
    more = f" (and before it {', '.join(reversed(before))})" if before else ""
    return f"rerun as run {newest}{more}"
