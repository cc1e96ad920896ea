"""Where the Redis adapters' keys live: one server, or the shards of a Redis Cluster.

DESIGN (Redis Cluster). A step is one script call that reads and writes a run's hash, its
data, its step records, the listings and the timer, lease and outbox sets, and adds the next
step message to a stream. On a cluster every key one script touches must be in one hash
slot. So the keys are split into **buckets**: ``streams`` of them, each with its own hash tag
(``{tag}``), its own copy of every index (``P:{tag}:ix``, ``P:{tag}:timers``,
``P:{tag}:leases``, ``P:{tag}:outbox``, ...), its own blobs (``P:{tag}:b:<ref>``) and its own
stream (``<stream>:{tag}``). A run belongs to the bucket its **root** trace id hashes to
(CRC-32 of the id before the first ``/``), so a zip/any branch (``<parent>/<seq>-<i>``) shares
its parent's slot and the join protocol stays one script, as on one server. Which buckets'
tags fall where is chosen so that bucket ``i`` hashes into the ``i``-th of ``streams`` equal
ranges of the 16,384 slots: a cluster whose masters hold equal slot ranges (as ``redis-cli
--cluster create`` makes them) gets an equal share of the buckets, and no index is a
cluster-wide hot key. Timers, leases and expiries are scanned bucket by bucket.

A run tree lives on one shard: a run with 10,000 branches loads that shard alone. Blobs (the
flows built at run time) are written to each bucket that uses them, so one chain may be
stored up to ``streams`` times.

On one server (``redis://``) with ``streams=1`` (the default) there is one bucket with no
tag: the keys are those of earlier releases, ``P:r:<trace>`` and ``<stream>``.
"""

from __future__ import annotations

import zlib

from redis.crc import key_slot

from dflow.errors import ConfigurationError

__all__ = ["Keyspace"]

SLOTS = 16384
MAX_STREAMS = 1024


def _tag(i: int, n: int) -> str:
    """A hash tag whose slot is in the ``i``-th of ``n`` equal ranges of the slots."""
    lo, hi = i * SLOTS // n, (i + 1) * SLOTS // n
    j = 0
    while True:
        tag = f"{i}" if j == 0 else f"{i}.{j}"
        if lo <= key_slot(f"{{{tag}}}".encode()) < hi:
            return tag
        j += 1


class Keyspace:
    """The buckets: ``n`` of them, with hash tags (``tagged``) on a cluster or with more
    than one. ``names(base)`` is a name's copy in each bucket, ``index(trace)`` a run's
    bucket (by its root id)."""

    __slots__ = ("n", "tagged", "tags")

    def __init__(self, streams: int = 1, *, cluster: bool = False) -> None:
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= MAX_STREAMS:
            raise ConfigurationError(f"streams is a whole number from 1 to {MAX_STREAMS}, got {streams!r}")
        self.n = streams
        self.tagged = cluster or streams > 1
        self.tags = tuple(_tag(i, streams) for i in range(streams)) if self.tagged else ("",)

    def names(self, base: str, what: str) -> tuple[str, ...]:
        """``base`` in each bucket: ``base:{tag}``, or ``base`` itself untagged."""
        if not self.tagged:
            return (base,)
        if "{" in base or "}" in base:
            raise ConfigurationError(
                f"the {what} {base!r} contains '{{' or '}}': on a Redis Cluster, or with more than one stream, "
                "dflow adds each key's hash tag itself; choose a name without braces"
            )
        return tuple(f"{base}:{{{t}}}" for t in self.tags)

    def index(self, trace_id: str) -> int:
        """The bucket of run ``trace_id`` (a branch's is its root's)."""
        if self.n == 1:
            return 0
        return zlib.crc32(trace_id.partition("/")[0].encode()) % self.n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyspace) and (self.n, self.tagged) == (other.n, other.tagged)

    def __hash__(self) -> int:
        return hash((self.n, self.tagged))
