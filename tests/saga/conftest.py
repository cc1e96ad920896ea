"""This folder's tests on real worker processes use the integration tests' Redis and Kafka fixtures."""

from tests.integration.conftest import kafka_bootstrap, module_prefix, prefix, redis_url  # noqa: F401 (fixtures)
