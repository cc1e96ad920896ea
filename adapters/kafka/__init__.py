"""Kafka adapter: ``KafkaTransport`` (``pip install 'dflow-runtime[kafka]'``)."""

from __future__ import annotations

from .transport import KafkaTransport

__all__ = ["KafkaTransport"]
