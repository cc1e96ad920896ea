"""What a runtime does for the clients of its process: start runs, deliver calls, cancel runs,
and publish step messages. ``Runtime`` has one (see ``worker`` for the worker's loops and
``runtime.step`` for what a step does); these run on the runtime's loop.
"""

from __future__ import annotations

from ..context import RunInfo, StepRecord
from ..errors import ConfigurationError, StoreError, ValueTooLargeError
from ..mailbox import Mailbox
from ..model.frames import FrameCodec
from ..model.nodes import Frame
from ..observe import run_label
from ..store import BlobsMissingError, NewRun, Store
from ..transport import Transport
from ..wire.values import Message
from .observers import Observers

__all__ = ["Dispatcher"]


class Dispatcher:
    """The client side of ``Runtime`` (see the module): it publishes on ``transport``,
    creates and resumes runs in ``store`` with their frames sealed by ``frames``, refuses
    values over ``max_value_bytes``, and tells ``observers`` of the runs it starts."""

    __slots__ = ("frames", "max_value_bytes", "observers", "store", "transport")

    def __init__(
        self,
        transport: Transport,
        store: Store,
        frames: FrameCodec,
        max_value_bytes: int,
        observers: Observers,
    ) -> None:
        self.transport = transport
        self.store = store
        self.frames = frames
        self.max_value_bytes = max_value_bytes
        self.observers = observers

    async def publish(self, messages: list[Message]) -> None:
        """Publish step messages, keyed by trace id. A repeated attempt (a retry, a takeover,
        a parked step) gets another key, so that a keyed transport may route it to another
        consumer: the run waits on this step alone, so its order no longer matters."""
        if len(messages) == 1:
            m = messages[0]
            await self.transport.publish(m.encode(), route(m))
        elif messages:
            await self.transport.publish_many([(m.encode(), route(m)) for m in messages])

    async def start_run(
        self,
        trace_id: str,
        frames: tuple[Frame, ...] | None,
        value: bytes,
        message: Message | None,
        *,
        records: list[StepRecord] | None = None,
        result: bytes | None = None,
        pipeline: str | None = None,
        data: dict[str, bytes] | None = None,
        deadline: float | None = None,
    ) -> None:
        """Create a run at ``frames`` (``None`` and a ``result`` for a run finished at
        creation) and dispatch its first step, ``message``; ``pipeline``: the name of the
        pipeline that starts it (the run is listed under it); ``data``: the run's data from
        its creation (encoded values; the observers add theirs); ``deadline``: seconds after
        which it ends ``timed_out`` (``ConfigurationError`` on a store that keeps none)."""
        if deadline is not None and not self.store.keeps_deadlines:
            raise ConfigurationError(
                f"run {trace_id!r} has a deadline of {deadline:g} s, but the store "
                f"{type(self.store).__qualname__} keeps no deadlines: use the in-memory or the Redis "
                "store, or start the run without a deadline"
            )
        if len(value) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"the parameter of run {trace_id!r} is {len(value)} bytes, over the limit of "
                f"{self.max_value_bytes} bytes"
            )
        obs = self.observers.current
        data = dict(data or {})  # (a copy: the observers write to it)
        seen = None
        if obs is not None:
            label = pipeline
            if label is None:
                label = run_label(frames, None if message is None else message.key)
            seen = obs.run_starting(trace_id, label, data)
        error: BaseException | None = None
        try:
            for _ in range(3):
                sealed = self.frames.dump(trace_id, frames)[0] if frames is not None else None
                new = NewRun(
                    trace_id,
                    sealed,
                    value,
                    message,
                    data=data,
                    records=list(records or ()),
                    result=result,
                    pipeline=pipeline,
                    deadline=deadline,
                )
                try:
                    await self.publish(await self.store.create_run(new))
                    return
                except BlobsMissingError as exc:  # it expired unreferenced: send it again
                    self.frames.forget(exc.refs)
            raise StoreError(f"the store keeps refusing the flow blobs of run {trace_id!r}")
        except BaseException as exc:
            error = exc
            raise
        finally:
            if obs is not None:
                obs.run_started(seen, error)

    async def resume(
        self,
        trace_id: str,
        call_type: str,
        payload: bytes,
        *,
        failed: bool = False,
        seq: int | None = None,
        keep: Mailbox | None = None,
    ) -> None:
        """Deliver a call to a run waiting in ``from_call`` (at step ``seq``, when given);
        with ``keep``, one that comes early is kept in the run's mailbox (``Store.resume``)."""
        if len(payload) > self.max_value_bytes:
            raise ValueTooLargeError(
                f"the payload of call {call_type!r} to run {trace_id!r} is {len(payload)} bytes, over the "
                f"limit of {self.max_value_bytes} bytes"
            )
        await self.publish(
            await self.store.resume(trace_id, call_type, payload, failed=failed, seq=seq, keep=keep)
        )

    async def cancel(self, trace_id: str, reason: str) -> RunInfo | None:
        """End a run CANCELLED (see ``Store.cancel``); its state, ``None`` if there is none."""
        info, publish = await self.store.cancel(trace_id, reason)
        await self.publish(publish)
        return info


def route(m: Message) -> str:
    """The transport key of a step message (see ``Dispatcher.publish``)."""
    return m.trace_id if m.attempt == 0 else f"{m.trace_id}/{m.attempt}"
