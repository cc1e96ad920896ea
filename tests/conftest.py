from __future__ import annotations

from collections.abc import Iterator

import pytest

import dflow
from dflow import DFlow


@pytest.fixture
def local() -> Iterator[dflow.Runtime]:
    """Local mode for one test: a fresh in-memory runtime, stopped afterwards."""
    runtime = DFlow.global_init_for_test()
    yield runtime
    dflow.shutdown()
