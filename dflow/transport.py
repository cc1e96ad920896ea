"""The ``Transport`` seam: how step messages travel between workers.

Delivery is at least once: a message received and not acknowledged (its consumer died,
or handed it back with ``nack``) is delivered again, to this or another consumer.
Messages published with the same ``key`` (the trace id) keep their order for a single
consumer. Bodies are opaque bytes; dflow's step messages are small msgpack records.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

__all__ = ["Delivery", "Transport"]


@dataclass(slots=True)
class Delivery:
    """A received message: its ``body`` and the transport's handle for ``ack``/``nack``."""

    body: bytes
    tag: Any


class Transport(ABC):
    """One consumer's connection to the step queue (a consumer group member)."""

    @abstractmethod
    async def publish(self, body: bytes, key: str) -> None:
        """Send ``body``; ``key`` groups messages whose order must be kept."""

    async def publish_many(self, items: list[tuple[bytes, str]]) -> None:
        """Send several messages; adapters may batch them."""
        for body, key in items:
            await self.publish(body, key)

    @abstractmethod
    async def receive(self, max_messages: int = 1, timeout: float = 1.0) -> list[Delivery]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` seconds for the first."""

    @abstractmethod
    async def ack(self, delivery: Delivery) -> None:
        """The message is done with; it will not be delivered again."""

    @abstractmethod
    async def nack(self, delivery: Delivery) -> None:
        """Hand the message back for redelivery, now."""

    @abstractmethod
    async def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Set an undecodable message aside with ``reason``, and acknowledge it."""

    async def ping(self) -> None:
        """Raise ``TransportError`` when the transport cannot be reached."""

    async def lag(self) -> int | None:
        """How many messages were published and not yet acknowledged (waiting, or being
        processed), as far as this consumer can tell; ``None`` when the transport cannot
        say. For metrics, sampled now and then: it may cost a round trip."""
        return None

    async def close(self) -> None:
        """Leave the group; unacknowledged messages go back to the others."""
