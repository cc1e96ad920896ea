"""The Kafka transport passes the transport contract, on a real Kafka-protocol broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dflow import Transport
from dflow.adapters.kafka import KafkaTransport
from dflow.testing import TransportContract

from .conftest import kafka_test_settings

# kafka-python 3.0's connection layer sometimes leaves a socket for the garbage collector.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


class TestKafkaTransport(TransportContract):
    exactly_once_delivery = False  # a rebalance may hand an unacknowledged message to another member

    @pytest.fixture
    def make_transports(self, kafka_bootstrap: str) -> Callable[..., list[Transport]]:
        topic = f"t-{uuid.uuid4().hex[:8]}"

        def make(n: int, **opts: Any) -> list[Transport]:
            opts.pop("redeliver_after", None)  # the group's session timeout plays this part
            return [
                KafkaTransport(
                    kafka_bootstrap,
                    topic=topic,
                    group=f"{topic}-g",
                    partitions=4,
                    **kafka_test_settings(),
                    **opts,
                )
                for _ in range(n)
            ]

        return make

    @pytest.fixture
    def crash(self) -> Callable[[Transport], Coroutine[Any, Any, None]]:
        async def crash(t: Transport) -> None:
            assert isinstance(t, KafkaTransport)
            await t.crash()

        return crash
