from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import dflow
from dflow import DFlow

if TYPE_CHECKING:
    import httpx  # an extra: imported by the fixture that needs it


@pytest.fixture
def local() -> Iterator[dflow.Runtime]:
    """Local mode for one test: a fresh in-memory runtime, stopped afterwards."""
    runtime = DFlow.global_init_for_test()
    yield runtime
    dflow.shutdown()


@pytest.fixture(scope="module")
def runtime() -> Iterator[dflow.Runtime]:
    """Local mode for the tests of a module: one in-memory runtime, stopped after the last."""
    rt = DFlow.global_init_for_test()
    yield rt
    dflow.shutdown()


@pytest.fixture
def api(url: str) -> Iterator[httpx.Client]:
    """A client of the server at the module's ``url`` fixture (each module starts its own)."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as client:
        yield client
