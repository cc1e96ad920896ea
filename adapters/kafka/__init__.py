"""Kafka adapter: ``KafkaTransport`` (``pip install 'dflow[kafka]'``)."""

from __future__ import annotations

from ._transport import KafkaTransport

__all__ = ["KafkaTransport"]
