"""Transports and stores from URLs: ``redis://``, ``rediss://``, ``kafka://``.

dflow's own settings ride in the query string and are taken out before the rest goes to
the client library: ``redis://h:6379/0?stream=dflow:steps&group=workers`` for the Redis
Streams transport, ``?prefix=dflow`` for the Redis store, ``redis+cluster://h1:7000,h2:7001/?
streams=16&wait=1`` for a Redis Cluster (step messages over 16 streams, each write waiting for
one replica), ``kafka://h1:9092,h2:9092?
topic=dflow-steps&group=workers&security_protocol=SASL_SSL&sasl_mechanism=PLAIN&
sasl_plain_username=..&sasl_plain_password=..`` for Kafka.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigurationError, DFlowError
from ..model.queues import DEFAULT_QUEUE, check_queue
from ..store import Store
from ..transport import Transport
from ..wire.urls import query_items, redact_url
from .queues import QueueTransport

_TRANSPORT_KEYS = {
    "stream",
    "group",
    "consumer",
    "dead_letters",
    "redeliver_after",
    "prefetch",
    "dead_letters_max",
    "streams",
}
_STORE_KEYS = {"prefix", "ttl", "redispatch_after", "blob_ttl", "streams", "wait", "wait_timeout"}
_FLOATS = {"redeliver_after", "ttl", "redispatch_after", "blob_ttl", "wait_timeout"}
_INTS = {"prefetch", "partitions", "dead_letters_max", "streams", "wait"}
_REDIS = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_BOOLS: set[str] = set()


def _split(url: str, ours: set[str]) -> tuple[str, dict[str, Any]]:
    parts = urlsplit(url)
    mine: dict[str, Any] = {}
    rest = []
    for k, v in query_items(parts.query):
        if k in ours:
            mine[k] = _setting(k, v)
        else:
            rest.append((k, v))
    return urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), mine


def _setting(name: str, text: str) -> Any:
    try:
        if name in _FLOATS:
            return float(text)
        if name in _INTS:
            return int(text)
    except ValueError:
        raise ConfigurationError(f"the URL setting {name}={text!r} is not a number") from None
    if name in _BOOLS:
        flag = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(
            text.lower()
        )
        if flag is None:
            raise ConfigurationError(f"the URL setting {name}={text!r} is not a flag: use 1 or 0")
        return flag
    return text


def _adapter(name: str) -> Any:
    """An adapter class, through ``dflow.adapters``' lazy import (which names the missing extra)."""
    from .. import adapters

    try:
        return getattr(adapters, name)
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from exc


def transport_from_url(url: str, **options: Any) -> Transport:
    """A transport for ``url``; ``options`` override the URL's settings."""
    scheme = urlsplit(url).scheme
    if scheme in _REDIS:
        base, mine = _split(url, _TRANSPORT_KEYS)
        return _adapter("RedisStreamsTransport")(base, **{**mine, **options})  # type: ignore[no-any-return]
    if scheme == "kafka":
        return _adapter("KafkaTransport").from_url(url, **options)  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"unknown transport URL {redact_url(url)!r}: use redis://, rediss://, redis+cluster:// or kafka:// "
        "(local mode needs no URL)"
    )


def queue_transport_from_url(url: str, queues: list[str]) -> QueueTransport:
    """The transport of a worker serving ``queues`` at ``url``: the default queue on the URL's
    stream (Redis) or topic (Kafka) itself, queue ``q`` on ``<stream>:q:<q>`` or on
    ``<topic>.q.<q>`` (consumer group ``<group>.q.<q>``)."""
    for q in queues:
        check_queue(q)
    base = transport_from_url(url)
    kafka = urlsplit(url).scheme == "kafka"

    def make(queue: str) -> Transport:
        if queue == DEFAULT_QUEUE:
            return base
        if kafka:
            topic, group = getattr(base, "topic"), getattr(base, "group")  # noqa: B009 (a KafkaTransport's)
            return transport_from_url(url, topic=f"{topic}.q.{queue}", group=f"{group}.q.{queue}")
        return transport_from_url(url, stream=f"{getattr(base, 'stream')}:q:{queue}")  # noqa: B009

    return QueueTransport(queues, make)


def store_from_url(url: str, *, transport: Transport | None = None, **options: Any) -> Store:
    """A store for ``url``; ``options`` override the URL's settings. With ``transport`` (the
    one the runtime consumes), a Redis store on the same server and database as a Redis
    Streams transport writes step messages to it itself (one script call a step)."""
    scheme = urlsplit(url).scheme
    if scheme in _REDIS:
        base, mine = _split(url, _STORE_KEYS)
        if transport is not None and "transport" not in options:
            from ..adapters.redis import fusable

            if fusable.fusable(base, transport):
                options["transport"] = transport
        return _adapter("RedisStore")(base, **{**mine, **options})  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"unknown store URL {redact_url(url)!r}: use redis://, rediss:// or redis+cluster://"
    )


async def check_reachable(
    transport: Transport, store: Store, *, transport_url: str | None = None, store_url: str | None = None
) -> None:
    """Ping the store, then the transport: ``ConfigurationError`` saying which one does not
    answer (its URL redacted, when given) and why."""
    for what, url, thing in (("store", store_url, store), ("transport", transport_url, transport)):
        try:
            await thing.ping()
        except DFlowError as exc:
            where = redact_url(url) if url else type(thing).__name__
            raise ConfigurationError(f"cannot reach the {what} {where}: {exc}") from exc
