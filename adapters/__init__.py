"""Transports and stores for real infrastructure (Redis, Kafka).

Each adapter is imported lazily, so that ``import adapters`` works without the extras
installed; none ships yet (the distributed runtime is the next milestone).
"""

from __future__ import annotations

__all__: list[str] = []
