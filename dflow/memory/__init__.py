"""The in-memory store and transport: local mode, tests, and the reference every adapter's
contract suite is held to.

``MemoryStore`` (``store``) keeps runs in dicts, in one process, with the same semantics as
the Redis store: atomic steps, leases, timers, joins, listings; built with its
``MemoryTransport`` (``transport``, on a ``MemoryBroker``) it is fused, as the Redis store is
with a stream on its server. Its parts: the run records (``runs``), the flow blobs
(``blobs``), the endings of runs and branches (``endings``), their deadlines
(``deadlines``), the listings (``listings``), what it refuses (``refusals``), the callers
waiting for runs (``followers``), its timers and outbox (``schedule``) and the shared state of ``dflow.State`` and
``dflow.Circuit`` (``state``). Public: ``MemoryStore``, ``MemoryTransport``,
``MemoryBroker``, also exported by ``dflow``.
"""

from __future__ import annotations

from .store import CANCELLED as CANCELLED  # (where it was)
from .store import MemoryStore
from .store import not_waiting as not_waiting
from .transport import MemoryBroker, MemoryTransport

__all__ = ["MemoryBroker", "MemoryStore", "MemoryTransport"]
