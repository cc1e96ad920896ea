"""``KafkaTransport``: step messages on a Kafka topic, consumed by a consumer group.

This module produces (and reads the transport's settings and URL); consuming is the
thread of ``consumer_thread``, which commits an offset only once every message before it
on its partition was acknowledged, i.e. after the step it carried was committed in the
store. Messages are keyed by trace id, so the steps of one run keep their order.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from dflow.errors import ConfigurationError, TransportError
from dflow.transport import Delivery, Transport
from dflow.wire.urls import query_items, redact_url

from .consumer_thread import ConsumerThread

__all__ = ["KafkaTransport"]

log = logging.getLogger("dflow.kafka")

# Settings for fast group joins and failover; callers may override any of them.
_CONSUMER_DEFAULTS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "max_poll_interval_ms": 300_000,
    "fetch_max_wait_ms": 100,
    "metadata_max_age_ms": 30000,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "auto_offset_reset": "earliest",
}
_PRODUCER_DEFAULTS: dict[str, Any] = {"acks": "all", "linger_ms": 0, "retries": 5}
# Which settings each client of kafka-python knows: every setting goes to each client that
# knows it (security settings reach the producer, the consumer and the admin client alike).
_CONSUMER_KEYS = frozenset(KafkaConsumer.DEFAULT_CONFIG)
_PRODUCER_KEYS = frozenset(KafkaProducer.DEFAULT_CONFIG)
_ADMIN_KEYS = frozenset(KafkaAdminClient.DEFAULT_CONFIG)
_OURS = {"topic": str, "group": str, "partitions": int, "prefetch": int}
_SASL = ("SASL_PLAINTEXT", "SASL_SSL")


def _typed(name: str, text: str) -> Any:
    """A URL setting as the type kafka-python expects of it: numbers and flags for the
    settings whose default is one, the text as written for everything else."""
    kind = _OURS.get(name)
    if kind is None:
        default = next(
            (
                d[name]
                for d in (
                    KafkaConsumer.DEFAULT_CONFIG,
                    KafkaProducer.DEFAULT_CONFIG,
                    KafkaAdminClient.DEFAULT_CONFIG,
                )
                if name in d
            ),
            None,
        )
        kind = type(default) if isinstance(default, (bool, int, float)) else str
    try:
        if kind is bool:
            flag = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(
                text.lower()
            )
            if flag is None:
                raise ValueError(text)
            return flag
        return kind(text)
    except ValueError:
        raise ConfigurationError(f"the Kafka URL setting {name}={text!r} is not a {kind.__name__}") from None


class KafkaTransport(Transport):
    """Consumer of group ``group`` on ``topic`` at ``bootstrap_servers``.

    ``options`` go to kafka-python (``security_protocol``, ``sasl_*``, ``ssl_*``, and any
    consumer or producer setting). At most ``prefetch`` messages are held unacknowledged
    at once. Undecodable messages go to ``<topic>.dead`` with the reason in a header.
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str] = "127.0.0.1:9092",
        *,
        topic: str = "dflow-steps",
        group: str = "dflow-workers",
        partitions: int = 8,
        prefetch: int = 64,
        **options: Any,
    ) -> None:
        self.bootstrap = bootstrap_servers
        self.topic = topic
        self.group = group
        self.partitions = partitions
        self.prefetch = prefetch
        unknown = sorted(k for k in options if k not in _CONSUMER_KEYS | _PRODUCER_KEYS | _ADMIN_KEYS)
        if unknown:
            raise ConfigurationError(
                f"unknown Kafka settings: {', '.join(unknown)} (see kafka-python's client options)"
            )
        protocol = str(options.get("security_protocol", "PLAINTEXT"))
        if options.get("sasl_plain_username") is not None and protocol not in _SASL:
            raise ConfigurationError(
                f"a SASL user is given but security_protocol is {protocol}, which would not use it: set "
                "security_protocol=SASL_SSL (or SASL_PLAINTEXT) and sasl_mechanism"
            )
        self.admin_options = {k: v for k, v in options.items() if k in _ADMIN_KEYS}
        self.consumer_options = {
            **_CONSUMER_DEFAULTS,
            **{k: v for k, v in options.items() if k in _CONSUMER_KEYS},
        }
        self.producer_options = {
            **_PRODUCER_DEFAULTS,
            **{k: v for k, v in options.items() if k in _PRODUCER_KEYS},
        }
        self._producer: KafkaProducer | None = None
        self._reader: ConsumerThread | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> KafkaTransport:
        """``kafka://[user:password@]host:9092[,host2:9092]?topic=..&group=..&security_protocol=
        SASL_SSL&sasl_mechanism=PLAIN&...``: the userinfo is the SASL user (percent-encoded);
        values are taken as written (a ``+`` stays one), as numbers or flags only for the
        settings that are numbers or flags."""
        parts = urlsplit(url)
        if parts.scheme != "kafka" or not parts.netloc:
            raise ConfigurationError(
                f"not a Kafka URL: {redact_url(url)!r}; use kafka://host:port[,host:port]?topic=..."
            )
        userinfo, _, hosts = parts.netloc.rpartition("@")
        opts: dict[str, Any] = {}
        for k, v in query_items(parts.query):
            if k in opts:
                raise ConfigurationError(f"the Kafka URL sets {k} twice")
            opts[k] = _typed(k, v)
        if userinfo:
            user, _, password = userinfo.partition(":")
            for key, value in (
                ("sasl_plain_username", unquote(user)),
                ("sasl_plain_password", unquote(password)),
            ):
                if key in opts and opts[key] != value:
                    raise ConfigurationError(
                        f"the Kafka URL's userinfo and its {key} setting disagree; give one"
                    )
                opts[key] = value
        return cls(hosts.split(","), **{**opts, **overrides})

    # -- producing ---------------------------------------------------------------------

    def _get_producer(self) -> KafkaProducer:
        with self._lock:
            if self._producer is None:
                try:
                    self._producer = KafkaProducer(bootstrap_servers=self.bootstrap, **self.producer_options)
                except KafkaError as exc:
                    raise TransportError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from exc
            return self._producer

    async def publish(self, body: bytes, key: str) -> None:
        await self.publish_many([(body, key)])

    async def publish_many(self, items: list[tuple[bytes, str]]) -> None:
        await self._send_many([(body, key.encode()) for body, key in items])

    async def _send_many(self, items: list[tuple[bytes, bytes | None]]) -> None:
        producer = self._get_producer()
        loop = asyncio.get_running_loop()
        waits = []
        for body, key in items:
            done: asyncio.Future[None] = loop.create_future()
            try:
                f = producer.send(self.topic, key=key, value=body)
            except KafkaError as exc:
                raise TransportError(f"Kafka refused a message: {exc}") from exc
            f.add_callback(lambda _md, d=done: loop.call_soon_threadsafe(_settle, d, None))
            f.add_errback(lambda exc, d=done: loop.call_soon_threadsafe(_settle, d, exc))
            waits.append(done)
        try:
            await asyncio.gather(*waits)
        except KafkaError as exc:
            raise TransportError(f"publishing to Kafka failed: {exc}") from exc

    # -- consuming ---------------------------------------------------------------------

    def _start_reader(self) -> ConsumerThread:
        if self._reader is None:
            self._reader = ConsumerThread(self, asyncio.get_running_loop())
            self._reader.start()
        return self._reader

    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        reader = self._start_reader()
        if reader.error is not None:  # start a fresh consumer next time; unacked messages come back
            self._reader = None
            reader.stop(False)
            raise TransportError(f"the Kafka consumer failed, restarting it: {reader.error}")
        q = reader.deliveries
        if q.empty():
            try:
                first = await asyncio.wait_for(q.get(), timeout)
            except asyncio.TimeoutError:
                return []
            out = [first]
        else:
            out = []
        while len(out) < max_messages and not q.empty():
            out.append(q.get_nowait())
        return out

    async def ack(self, delivery: Delivery) -> None:
        if self._reader is not None:
            self._reader.acks.put(delivery.tag)

    async def nack(self, delivery: Delivery) -> None:
        _, _, key = delivery.tag
        await self._send_many([(delivery.body, key)])
        await self.ack(delivery)

    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Copy the record to ``<topic>.dead`` with its original key, and the reason, the
        partition and the offset in headers; then acknowledge it. A record that cannot be
        copied (the dead-letter topic refuses it) is logged and acknowledged all the same:
        it must never hold its partition back."""
        tp, offset, key = delivery.tag
        headers = [
            ("reason", reason.encode()),
            ("topic", tp.topic.encode()),
            ("partition", str(tp.partition).encode()),
            ("offset", str(offset).encode()),
        ]
        try:
            producer = self._get_producer()
            fut = producer.send(f"{self.topic}.dead", key=key or b"", value=delivery.body, headers=headers)
            await asyncio.get_running_loop().run_in_executor(None, fut.get, 10)
        except Exception as exc:
            log.error(
                "dflow: could not dead-letter the record at %s[%d]@%d (%s: %s); dropping it: %s",
                tp.topic,
                tp.partition,
                offset,
                type(exc).__name__,
                exc,
                reason,
            )
        await self.ack(delivery)

    async def ping(self) -> None:
        def check() -> None:
            servers = [self.bootstrap] if isinstance(self.bootstrap, str) else list(self.bootstrap)
            reachable = False
            for server in servers:
                host, _, port = server.rpartition(":")
                try:
                    socket.create_connection((host or server, int(port or 9092)), timeout=3).close()
                    reachable = True
                    break
                except OSError:
                    continue
            if not reachable:
                raise TransportError(
                    f"cannot reach Kafka at {', '.join(servers)}: connection refused or timed out"
                )
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap, **{"request_timeout_ms": 5000, **self.admin_options}
                )
            except KafkaError as exc:
                raise TransportError(f"cannot reach Kafka at {self.bootstrap}: {exc}") from exc
            try:
                admin.create_topics([NewTopic(self.topic, self.partitions, 1)])
            except TopicAlreadyExistsError:
                pass
            except KafkaError as exc:
                log.info("dflow: could not create topic %s (%s); assuming it exists", self.topic, exc)
            finally:
                admin.close()

        await asyncio.get_running_loop().run_in_executor(None, check)

    async def lag(self) -> int | None:
        """Messages not yet acknowledged on the partitions this consumer holds: each one's
        high watermark (as its last fetch saw it) less its first unacknowledged offset. The
        consumer's thread measures it when asked: this returns what the previous call asked
        for (``None`` at first). Summed over the group's consumers, it is the group's lag."""
        reader = self._reader
        if reader is None:
            return None
        reader.lag_wanted = True
        return reader.lag

    async def crash(self) -> None:
        """Stop consuming without committing or handing anything back, as a killed process
        would (for tests): the group gives this consumer's partitions to the others."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await asyncio.get_running_loop().run_in_executor(None, reader.stop, False)

    async def close(self) -> None:
        """Commit what was acknowledged, leave the group, flush the producer."""
        reader, self._reader = self._reader, None
        loop = asyncio.get_running_loop()
        if reader is not None:
            await loop.run_in_executor(None, reader.stop, True)
        producer, self._producer = self._producer, None
        if producer is not None:
            await loop.run_in_executor(None, producer.close, 5)


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
