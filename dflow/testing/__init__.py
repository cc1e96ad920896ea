"""Test support: the contract suites that every store and transport adapter must pass."""

from __future__ import annotations

from .conformance import MALFORMED_MESSAGES, FusedStoreContract, StoreContract, TransportContract

__all__ = ["FusedStoreContract", "MALFORMED_MESSAGES", "StoreContract", "TransportContract"]
