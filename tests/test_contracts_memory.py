"""The in-memory store and transport pass the contracts every adapter must pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dflow import MemoryBroker, MemoryStore, MemoryTransport, Store, Transport
from dflow.testing import FusedStoreContract, StoreContract, TransportContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def make_store(self) -> Callable[..., Store]:
        return lambda **opts: MemoryStore(**opts)


class TestFusedMemoryStore(FusedStoreContract):
    """Local mode's store: it puts step messages on its transport itself."""

    @pytest.fixture
    def make_fused(self) -> Callable[..., tuple[Store, Transport]]:
        def make(**opts: float) -> tuple[Store, Transport]:
            transport = MemoryTransport()
            return MemoryStore(transport=transport, **opts), transport

        return make


class TestMemoryTransport(TransportContract):
    @pytest.fixture
    def make_transports(self) -> Callable[..., list[Transport]]:
        def make(n: int, **opts: float) -> list[Transport]:
            broker = MemoryBroker(**opts)
            return [MemoryTransport(broker) for _ in range(n)]

        return make
