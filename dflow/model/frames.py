"""A run's frames as the stores keep them: serialized and signed by the core.

A run's frames say where it stands: which chain, at which node, and where each enclosing
``flat_map`` returns to. The store keeps them as a *record*: the chains' references (a
pipeline's ``p:`` name, or a run-time chain's content address ``h:<sha256>``), positions
and key suffixes, packed and signed for that run, so that no store writer can point a run
at another run's code. The chains built at run time travel as signed blobs that the store
keeps while a live run refers to them.

``dump`` also swaps each run-time chain for its loaded copy: a run always continues with
the copy any worker would load, so what a flow captured behaves the same wherever it runs.
A record this process sealed is remembered with its frames for a while: the next step of
a run usually comes back to the worker that committed it (always in local mode), and then
nothing is unpacked or checked again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from ..errors import PayloadRejectedError
from ..store import Frames
from .chains import ChainCodec
from .nodes import Frame

__all__ = ["FrameCodec"]

_pack = msgpack.Packer(use_bin_type=True).pack
_ARRAYS = frozenset(bytes([b]) for b in (*range(0x90, 0xA0), 0xDC, 0xDD))  # how a msgpack array starts


class FrameCodec:
    """Serializes runs' frames for a store, and reads them back, with ``chains``'s keys.

    ``legacy``: also accept the unsigned frames records of runs started by dflow 0.1,
    while a deployment with such runs in flight upgrades (an unsigned record could point a
    run at any step: leave it off otherwise)."""

    def __init__(self, chains: ChainCodec, *, legacy: bool = False, cache_size: int = 1024) -> None:
        self.chains = chains
        self.legacy = legacy
        self._cache_size = cache_size
        self._stored: OrderedDict[str, None] = OrderedDict()  # blobs this process believes stored
        self._bytes: OrderedDict[str, bytes] = OrderedDict()  # blobs dumped lately, to send again
        self._sealed: dict[tuple[str, bytes], tuple[Frame, ...]] = {}  # oldest first

    def dump(self, trace_id: str, frames: tuple[Frame, ...]) -> tuple[Frames, tuple[Frame, ...]]:
        """The record of ``frames`` for run ``trace_id``, with the blobs it refers to, and
        the frames the run goes on with (run-time chains swapped for their loaded copies).
        Raises ``BuildError`` naming what a chain captured that cannot be stored."""
        chains = self.chains
        if len(frames) == 1:  # the common case: one frame of a pipeline's own chain
            f = frames[0]
            ref = chains.ref(f.chain)[0]
            if ref[0] == "p":
                record = chains.seal_frames(trace_id, _pack(((ref, f.pos, f.suffix, f.returning),)))
                self._seal(trace_id, record, frames)
                return Frames(record), frames
        entries = []
        refs: list[str] = []
        new: dict[str, bytes] = {}
        out: list[Frame] | None = None
        for i, f in enumerate(frames):
            ref, blob = chains.ref(f.chain)
            if ref[:2] == "h:":
                head = chains.blob_of(ref)
                if head not in refs:
                    refs.append(head)
                if blob is not None:
                    if head not in self._stored:
                        new[head] = blob
                    if head not in self._bytes:
                        self._bytes[head] = blob
                        if len(self._bytes) > 1000:
                            self._bytes.popitem(last=False)
                copy = chains.runnable(f.chain)
                if copy is not f.chain:
                    if out is None:
                        out = list(frames)
                    out[i] = Frame(copy, f.pos, f.suffix, f.returning)
            entries.append((ref, f.pos, f.suffix, f.returning))
        for head in new:
            self._stored[head] = None
        while len(self._stored) > 100_000:
            self._stored.popitem(last=False)
        record = chains.seal_frames(trace_id, _pack(entries))
        runnable = frames if out is None else tuple(out)
        self._seal(trace_id, record, runnable)
        refs.sort()
        return Frames(record, tuple(refs), new), runnable

    def _seal(self, trace_id: str, record: bytes, frames: tuple[Frame, ...]) -> None:
        sealed = self._sealed
        sealed[(trace_id, record)] = frames
        if len(sealed) > self._cache_size:
            del sealed[next(iter(sealed))]  # the oldest

    def forget(self, refs: list[str]) -> None:
        """These blobs are not stored after all (the store said so): send them next time."""
        for ref in refs:
            self._stored.pop(ref, None)

    def reseal(self, frames: Frames) -> Frames:
        """``frames`` carrying again the blobs it refers to that this process has (after
        the store said it lacks some)."""
        new = {**frames.new_blobs, **{r: self._bytes[r] for r in frames.blobs if r in self._bytes}}
        return Frames(frames.record, frames.blobs, new)

    def sealed(self, trace_id: str, record: bytes) -> tuple[Frame, ...] | None:
        """The frames of a record this process sealed lately (and forgets it), or ``None``."""
        return self._sealed.pop((trace_id, record), None)

    async def load(
        self, trace_id: str, record: bytes, get_blob: Callable[[str], Awaitable[bytes | None]]
    ) -> tuple[Frame, ...]:
        """The frames of run ``trace_id`` from its ``record``, checked; blobs this process
        has not loaded yet come from ``get_blob``. ``PayloadRejectedError`` when the record
        or a blob fails its check, ``UnknownStepError`` when code is missing here."""
        frames = self._sealed.pop((trace_id, record), None)
        if frames is not None:
            return frames
        try:
            payload = self.chains.open_frames(trace_id, record)
        except PayloadRejectedError:
            if not (self.legacy and record[:1] in _ARRAYS):
                raise
            payload = record  # written unsigned by dflow 0.1: accepted while the deployment upgrades
        out = []
        for ref, pos, suffix, returning in _entries(payload, trace_id):
            chain = self.chains.cached(ref)
            if chain is None:
                head = self.chains.blob_of(ref)
                chain = self.chains.load(ref, await get_blob(head))
                self._stored[head] = None
            out.append(Frame(chain, pos, suffix, returning))
        return tuple(out)


def _entries(payload: bytes, trace_id: str) -> list[Any]:
    try:
        entries = msgpack.unpackb(payload, raw=False)
        if isinstance(entries, list) and all(
            isinstance(e, list)
            and len(e) == 4
            and isinstance(e[0], str)
            and type(e[1]) is int
            and isinstance(e[2], str)
            and isinstance(e[3], bool)
            for e in entries
        ):
            return entries
    except Exception:
        pass
    raise PayloadRejectedError(f"the frames record of run {trace_id!r} is not one dflow writes")
