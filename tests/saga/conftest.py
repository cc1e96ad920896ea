"""This folder's tests on real worker processes use the integration tests' Redis fixtures."""

from tests.integration.conftest import module_prefix, prefix, redis_url  # noqa: F401 (fixtures)
