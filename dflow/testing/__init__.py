"""Test support: the contract suites that every store and transport adapter must pass."""

from __future__ import annotations

from .conformance import MALFORMED_MESSAGES, StoreContract, TransportContract, contract_chain

__all__ = ["MALFORMED_MESSAGES", "StoreContract", "TransportContract", "contract_chain"]
