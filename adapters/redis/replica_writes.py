"""Writes that wait for replicas on a Redis Cluster (``?wait=N``).

``WAIT`` counts the replicas that have every write made *on its own connection*: it must
follow the script on the connection that ran it, on the node that owns the bucket's slot.
redis-py's cluster pipeline cannot promise that (a redirected or retried command is sent
again on its own, elsewhere, and the ``WAIT`` answers for another node). So these writes go
through a plain client of the owning node: the blobs, the script and the ``WAIT`` in one
pipeline on one connection. A redirect (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) means the script
did not run: the whole round is sent again to the node the cluster names. A connection lost
mid-round is not retried here (the script may have run): the caller sees ``StoreError``.
``check_wait`` checks a store's ``wait`` and ``wait_timeout``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import ClusterNode

from dflow.errors import ConfigurationError

from .client import GatedCluster

__all__ = ["NodeWrites", "check_wait"]

_PATIENCE = 30.0  # seconds of redirects and CLUSTERDOWN followed before giving up (a failover)


class NodeWrites:
    """One plain client per cluster node, for the writes that wait (each holding a place of
    the cluster client's gate)."""

    def __init__(self, cluster: GatedCluster) -> None:
        self.cluster = cluster
        self._clients: dict[str, aioredis.Redis] = {}

    def _client(self, node: ClusterNode) -> aioredis.Redis:
        client = self._clients.get(node.name)
        if client is None:
            pool = aioredis.ConnectionPool(**node.connection_kwargs)
            client = self._clients[node.name] = aioredis.Redis(connection_pool=pool)
        return client

    async def run(
        self,
        slot_key: str,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes],
        blob_prefix: str,
        blob_px: int,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        """The script's reply and how many replicas acknowledged the round."""
        async with self.cluster.gated():
            return await self._rounds(
                slot_key, script, keys, args, blobs, blob_prefix, blob_px, replicas, timeout_ms
            )

    async def _rounds(
        self,
        slot_key: str,
        script: Any,
        keys: list[str],
        args: list[Any],
        blobs: dict[str, bytes],
        blob_prefix: str,
        blob_px: int,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        asking: ClusterNode | None = None
        pause = 0.05
        deadline = asyncio.get_running_loop().time() + _PATIENCE
        while asyncio.get_running_loop().time() < deadline:
            node = asking or self.cluster.get_node_from_key(slot_key)
            if node is None:  # (no owner known: the slot map is being read again)
                await self.cluster.nodes_manager.initialize()
                continue
            client = self._client(node)
            try:
                async with client.pipeline(transaction=False) as pipe:
                    if asking is not None:
                        pipe.execute_command("ASKING")
                    for ref, blob in blobs.items():
                        pipe.set(f"{blob_prefix}:b:{ref}", blob, px=blob_px, nx=True)
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                    pipe.execute_command("WAIT", replicas, timeout_ms)
                    replies = await pipe.execute(raise_on_error=False)
            except (rex.ConnectionError, rex.TimeoutError):
                # The node may be gone (a failover): read the slots again for the next call;
                # not retried here, the script may have run.
                await self._forget(node)
                raise
            reply, acked = replies[-2], replies[-1]
            asking = None
            if isinstance(reply, rex.NoScriptError):
                await client.script_load(script.script)
            elif isinstance(reply, rex.MovedError):
                await self.cluster.nodes_manager.move_slot(reply)
            elif isinstance(reply, rex.AskError):
                asking = self.cluster.get_node(host=reply.host, port=reply.port) or ClusterNode(
                    reply.host, reply.port, **_kwargs(node)
                )
            elif isinstance(reply, (rex.TryAgainError, rex.ClusterDownError)):
                await asyncio.sleep(pause)  # a migration, or a failover under way
                pause = min(pause * 2, 0.5)
                if isinstance(reply, rex.ClusterDownError):
                    await self.cluster.nodes_manager.initialize()
            elif isinstance(reply, Exception):
                raise reply
            else:
                if isinstance(acked, Exception):
                    raise acked
                return reply, int(acked)
        raise rex.ClusterError(
            f"the slot of {slot_key!r} kept moving or its shard stayed down for {_PATIENCE}s"
        )

    async def _forget(self, node: ClusterNode) -> None:
        client = self._clients.pop(node.name, None)
        if client is not None:
            await client.aclose(close_connection_pool=True)
        try:
            await self.cluster.nodes_manager.initialize()
        except (rex.RedisError, rex.RedisClusterException):
            pass  # the cluster client reads them again itself at its next command

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.aclose(close_connection_pool=True)


def _kwargs(node: ClusterNode) -> dict[str, Any]:
    return {k: v for k, v in node.connection_kwargs.items() if k not in ("host", "port")}


def check_wait(wait: int, wait_timeout: float) -> None:
    """``ConfigurationError`` unless ``wait`` is a number of replicas (0 for none) and
    ``wait_timeout`` a positive number of seconds."""
    if isinstance(wait, bool) or not isinstance(wait, int) or wait < 0 or not wait_timeout > 0:
        raise ConfigurationError(
            f"wait is a number of replicas (0 for none) and wait_timeout a positive number "
            f"of seconds; got wait={wait!r}, wait_timeout={wait_timeout!r}"
        )
