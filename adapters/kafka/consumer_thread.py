"""The thread that owns a ``KafkaTransport``'s consumer, and the offsets it commits.

kafka-python's consumer is not thread-safe, so one thread owns it: it polls, hands records
to the event loop, and commits. An offset is committed only once every message before it
on its partition was acknowledged (``PartitionOffsets``), i.e. after the step it carried was
committed in the store. Acknowledgements reach the thread through a queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata, TopicPartition

from dflow.transport import Delivery

from .assignment import AssignmentWatch

if TYPE_CHECKING:
    from .transport import KafkaTransport

__all__ = ["ConsumerThread", "PartitionOffsets"]

log = logging.getLogger("dflow.kafka")


class PartitionOffsets:
    """Offsets of one partition: received and not yet acknowledged, and the commit point."""

    __slots__ = ("committed", "high", "outstanding")

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        self.high = -1
        self.committed: int = -1

    def point(self) -> int:
        return min(self.outstanding) if self.outstanding else self.high + 1


class ConsumerThread(threading.Thread, ConsumerRebalanceListener):
    """The thread that owns the KafkaConsumer."""

    def __init__(self, transport: KafkaTransport, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread.__init__(self, name=f"dflow-kafka-{transport.topic}", daemon=True)
        self.t = transport
        self.loop = loop
        self.deliveries: asyncio.Queue[Delivery] = asyncio.Queue()
        self.acks: queue.SimpleQueue[tuple[TopicPartition, int, str]] = queue.SimpleQueue()
        self.parts: dict[TopicPartition, PartitionOffsets] = {}
        self.inflight = 0
        self.error: Exception | None = None
        self._halt = threading.Event()
        self._commit_on_stop = True
        self.consumer: KafkaConsumer | None = None
        self.lag_wanted = False
        self.lag: int | None = None

    def stop(self, commit: bool) -> None:
        self._commit_on_stop = commit
        self._halt.set()
        self.join(15)

    # ConsumerRebalanceListener. kafka-python calls it on its IO thread, where blocking
    # consumer calls (commit) are refused: forget the partitions; what was acknowledged and
    # not yet committed is delivered again to their next owner, and the store drops it there.
    def on_partitions_revoked(self, revoked: Any) -> None:
        for tp in revoked:
            state = self.parts.pop(tp, None)
            if state is not None:
                self.inflight -= len(state.outstanding)

    def on_partitions_assigned(self, assigned: Any) -> None:
        pass

    def _apply_acks(self) -> None:
        while True:
            try:
                tp, offset, _ = self.acks.get_nowait()
            except queue.Empty:
                return
            state = self.parts.get(tp)
            if state is not None and offset in state.outstanding:
                state.outstanding.discard(offset)
                self.inflight -= 1

    def _commit(self, tps: list[TopicPartition] | None = None, *, wait: bool = True) -> None:
        """Commit each partition up to its first unacknowledged offset. Without ``wait`` the
        commit is sent and the loop goes on polling: a commit that fails is retried with the
        next one, and at worst its messages are delivered again (and dropped at claim)."""
        assert self.consumer is not None
        offsets = {}
        for tp in tps if tps is not None else list(self.parts):
            state = self.parts.get(tp)
            if state is None:
                continue
            point = state.point()
            if point > state.committed:
                offsets[tp] = OffsetAndMetadata(point, "", -1)
        if not offsets:
            return
        if wait:
            try:
                self.consumer.commit(offsets)
            except KafkaError as exc:
                log.warning("dflow: committing Kafka offsets failed (%s); they will be redelivered", exc)
                return
        else:
            self.consumer.commit_async(offsets, callback=self._committed)
        for tp, om in offsets.items():
            if tp in self.parts and om.offset is not None:  # (it is: the points above)
                self.parts[tp].committed = om.offset

    def _committed(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], response: object) -> None:
        if isinstance(response, Exception):
            log.warning("dflow: committing Kafka offsets failed (%s); committing again", response)
            for tp, om in offsets.items():  # commit these again with the next round
                state = self.parts.get(tp)
                if state is not None and om.offset is not None and state.committed <= om.offset:
                    state.committed = min(state.committed, om.offset - 1)

    def _measure_lag(self, consumer: KafkaConsumer) -> int | None:
        """See ``KafkaTransport.lag`` (on this thread: the consumer is not thread-safe)."""
        total = 0
        try:
            for tp in consumer.assignment():
                high = consumer.highwater(tp)
                if high is None:  # not fetched from yet
                    continue
                state = self.parts.get(tp)
                first = state.point() if state is not None else consumer.position(tp, timeout_ms=1000)
                if first is not None:
                    total += max(0, high - first)
        except Exception as exc:
            log.debug("dflow: measuring the Kafka lag failed: %s", exc)
            return None
        return total

    def run(self) -> None:
        t = self.t
        try:
            settings = {
                "client_id": f"dflow-{socket.gethostname()}-{os.getpid()}",
                "max_poll_records": t.prefetch,
                **t.consumer_options,
                # dflow's own: offsets are committed after the step is, for the group named
                "bootstrap_servers": t.bootstrap,
                "group_id": t.group,
                "enable_auto_commit": False,
            }
            self.consumer = KafkaConsumer(**settings)
            self.consumer.subscribe([t.topic], listener=self)
        except Exception as exc:
            self.error = exc
            return
        consumer = self.consumer
        paused = False
        watch, looked = AssignmentWatch(t.topic, t.partitions, time.monotonic()), 0.0
        try:
            while not self._halt.is_set():
                if time.monotonic() - looked >= 1.0:  # (once a second: who holds what changes rarely)
                    looked = time.monotonic()
                    watch.look(len(consumer.assignment()), looked, log)
                self._apply_acks()
                self._commit(wait=False)
                full = self.inflight >= t.prefetch
                if full and not paused:
                    consumer.pause(*consumer.assignment())
                    paused = True
                elif paused and not full:
                    consumer.resume(*consumer.paused())
                    paused = False
                batches = consumer.poll(timeout_ms=50)
                out = []
                for tp, records in batches.items():
                    state = self.parts.setdefault(tp, PartitionOffsets())
                    for rec in records:
                        state.outstanding.add(rec.offset)
                        state.high = max(state.high, rec.offset)
                        self.inflight += 1
                        # the key as it came (bytes, or None): nack and dead_letter send it on
                        out.append(Delivery(rec.value, (tp, rec.offset, rec.key)))
                if out:
                    self.loop.call_soon_threadsafe(_put_all, self.deliveries, out)
                if self.lag_wanted:
                    self.lag_wanted = False
                    self.lag = self._measure_lag(consumer)
            if self._commit_on_stop:
                self._apply_acks()
                self._commit()
        except Exception as exc:
            log.exception("dflow: the Kafka consumer thread failed")
            self.error = exc
        finally:
            consumer.close(autocommit=False)


def _put_all(q: asyncio.Queue[Delivery], items: list[Delivery]) -> None:
    for item in items:
        q.put_nowait(item)
