"""How the Redis store's scripts reach Redis: ``ScriptCalls`` runs a script on a bucket's
node, with the blobs it brings written first in the same round trip, waiting for replicas
when the store asks for ``wait``, loading a script a cluster node lacks, and declaring the
keys a cluster routes the call by."""

from __future__ import annotations

from typing import Any

import redis.exceptions as rex

from dflow.errors import StoreError
from dflow.store import BlobsMissingError

from . import scripts
from .client import Client, GatedCluster, execute, ready
from .errors import store_errors
from .replica_writes import NodeWrites

__all__ = ["ScriptCalls"]

#: The scripts that set no timer, lease or outbox entry.
_LOOKS = frozenset({"DUE", "PAGE", "COUNT"})


class ScriptCalls:
    """The store's scripts on ``client``, over the buckets whose key prefixes are
    ``prefixes`` (and streams ``streams``, '' when not fused). ``touched``: the buckets
    written to since ``DUE`` last looked at them."""

    def __init__(
        self,
        client: Client,
        prefixes: tuple[str, ...],
        streams: tuple[str, ...],
        *,
        cluster: bool,
        wait: int,
        wait_timeout: float,
        blob_ttl: float,
    ) -> None:
        self.redis = client
        self.cluster = cluster
        self.wait, self.wait_timeout, self.blob_ttl = wait, wait_timeout, blob_ttl
        self._prefixes = prefixes
        self._scripts = {name: client.register_script(s.source) for name, s in scripts.SCRIPTS.items()}
        self._loaded: set[str] = set()  # scripts loaded on every primary of a cluster
        self._cold = cluster  # a cluster's slot map not loaded yet
        self._node_writes = NodeWrites(client) if isinstance(client, GatedCluster) else None
        #: the calls to one node of a cluster (``None`` when not one): the reads' ``WAIT`` goes there too
        self.node_writes = self._node_writes
        #: each bucket's indexes and stream: the keys every script of the bucket declares
        self._bucket_keys = [
            [
                f"{P}:{k}"
                for k in ("outbox", "timers", "leases", "deadlines", "runs", "expiry", "expiryp", "ix", "ids")
            ]
            + ([st] if st else [])
            for P, st in zip(prefixes, streams)
        ]
        self.touched: set[int] = set()

    def keys(self, at: int, trace_id: str | None, refs: Any = ()) -> list[str]:
        """The keys a script declares: on a cluster, those of the run (and its parent's for
        a branch), of its bucket's indexes and stream, and of the blobs it names; on one
        server none (nothing routes by them). Declared, a call is routed to the shard that
        owns the bucket, and refused (TRYAGAIN, retried) rather than run half while the
        bucket's slot is migrating. Keys a script finds by reading (a run's branches, the
        runs a timer names) are in the same slot but not declared (see ``scripts``)."""
        if not self.cluster:
            return []
        P = self._prefixes[at]
        keys = self._bucket_keys[at].copy()
        t = trace_id
        while t is not None:
            keys += [f"{P}:{k}:{t}" for k in ("r", "d", "s", "c", "j", "js", "ja", "jc", "w", "e", "m")]
            t = t.rpartition("/")[0] if "/" in t else None
        for ref in refs:
            keys += [f"{P}:b:{ref}", f"{P}:bn:{ref}"]
        return keys

    async def run(
        self,
        name: str,
        args: list[Any],
        blobs: dict[str, bytes] | None = None,
        *,
        at: int = 0,
        keys: list[str] | None = None,
        writes: bool = True,
    ) -> Any:
        """Run script ``name`` on bucket ``at``, writing ``blobs`` first (unless stored
        already) in the same round trip, and with ``wait``, waiting for the replicas.
        ``BlobsMissingError`` when the script reports blobs it lacks."""
        keys = keys if keys is not None else self.keys(at, None)
        if name not in _LOOKS:
            self.touched.add(at)  # it may have set a timer, a lease or an outbox entry there: DUE looks
        reply = await self.call(self._scripts[name], keys, args, blobs, at=at, writes=writes)
        if isinstance(reply, list) and reply and reply[0] == b"need":
            raise BlobsMissingError([r.decode() for r in reply[1]])
        return reply

    async def call(
        self,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes] | None = None,
        *,
        at: int = 0,
        writes: bool = True,
    ) -> Any:
        """Run ``script`` (registered on the store's client: one of the store's own, or one
        of the scripts beside them, as the run notes') on bucket ``at`` with ``keys`` (those
        it declares), writing ``blobs`` first, and with ``wait`` (unless it makes no
        ``writes``) waiting for the replicas: ``StoreError`` when too few have it."""
        if self._cold:
            await ready(self.redis)
            self._cold = False
        replicas = self.wait if writes else 0
        with store_errors():
            if replicas and self._node_writes is not None:
                return await self._on_node(script, keys, args, blobs, at, replicas)
            if blobs or replicas:
                return await self._in_pipeline(script, keys, args, blobs, at, replicas)
            return await script(keys=keys, args=args)

    async def _on_node(
        self,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes] | None,
        at: int,
        replicas: int,
    ) -> Any:
        """A cluster's write that waits for replicas: on the connection of the bucket's node."""
        assert self._node_writes is not None
        reply, acked = await self._node_writes.run(
            self._prefixes[at],
            script,
            keys,
            args,
            blobs or {},
            self._prefixes[at],
            max(1, int(self.blob_ttl * 1000)),
            replicas,
            max(1, int(self.wait_timeout * 1000)),
        )
        self._check_wait(acked)
        return reply

    async def _in_pipeline(
        self,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes] | None,
        at: int,
        replicas: int,
    ) -> Any:
        """The script with the blob writes before it and the ``WAIT`` after it, in one round trip."""
        try:
            replies = await self._pipelined(script, keys, args, blobs, at, replicas, False)
        except rex.NoScriptError:  # a cluster node without it (a promoted replica)
            if not self.cluster:
                raise
            replies = await self._pipelined(script, keys, args, blobs, at, replicas, True)
        if replicas:
            self._check_wait(replies[-1])
            return replies[-2]
        return replies[-1]

    async def _pipelined(
        self,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes] | None,
        at: int,
        replicas: int,
        load: bool,
    ) -> list[Any]:
        """The blob writes, the script and the ``WAIT`` in one round trip to the bucket's node.
        A cluster's pipeline cannot load a script a node lacks: with ``load`` (or the first
        time) it is loaded on every primary first."""
        async with self.redis.pipeline(transaction=False) as pipe:
            if blobs:
                px = max(1, int(self.blob_ttl * 1000))
                for ref, blob in blobs.items():
                    pipe.set(f"{self._prefixes[at]}:b:{ref}", blob, px=px, nx=True)
            if self.cluster:
                if load or script.sha not in self._loaded:
                    await self.redis.script_load(script.script)
                    self._loaded.add(script.sha)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            else:
                await script(keys=keys, args=args, client=pipe)
            if replicas:
                self._wait_in(pipe, at)
            return await execute(self.redis, pipe)

    def _wait_in(self, pipe: Any, at: int) -> None:
        """``WAIT`` on the connection that wrote (one server: the same pipeline; a cluster's
        writes that wait go through ``replica_writes``)."""
        pipe.execute_command("WAIT", self.wait, max(1, int(self.wait_timeout * 1000)))

    def _check_wait(self, acked: Any) -> None:
        if int(acked) < self.wait:
            raise StoreError(
                f"the write reached {int(acked)} of the {self.wait} replicas wait= asks for within "
                f"{self.wait_timeout}s: it is on the primary, and lost if the primary fails before it replicates"
            )

    async def close(self) -> None:
        """Release the connections of the writes that wait for replicas."""
        if self._node_writes is not None:
            await self._node_writes.close()
