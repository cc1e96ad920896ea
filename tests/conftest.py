from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
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


TESTS = Path(__file__).resolve().parent
#: besides ``tests/integration/``: the tests on real worker processes kept with the tests of their
#: capability, and the console in a real browser
ON_PROCESSES = ("*_workers.py", "test_console_browser.py")
#: the project's tools run over the whole tree: type checkers, linters, the docs site, the wheel
CHECKS = ("test_types.py", "test_lint.py", "test_docs.py", "test_packaging.py")


#: fixtures whose tests run one after another on one process of ``make test`` (``--dist
#: loadgroup``): each starts a Redis Cluster of its own and kills or stops its nodes under load,
#: which two of them at once, or beside each other's load, make a matter of the machine's speed
ONE_AT_A_TIME = {"fresh_redis_cluster": "redis-cluster-faults"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what ``make test-fast`` leaves out (``-m "not integration and not checks and not
    slow"``): the tests under ``tests/integration/`` and those of ``ON_PROCESSES`` are
    ``integration`` tests, those of ``CHECKS`` are ``checks``; and group the tests of
    ``ONE_AT_A_TIME``."""
    for item in items:
        path = item.path
        if TESTS / "integration" in path.parents or any(path.match(p) for p in ON_PROCESSES):
            item.add_marker(pytest.mark.integration)
        elif path.parent == TESTS and path.name in CHECKS:
            item.add_marker(pytest.mark.checks)
        for fixture, group in ONE_AT_A_TIME.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, fail at once if pytest-xdist did not name the groups in the
    node ids, which is how it keeps a group on one process: some pytest and pytest-xdist releases
    together silently stop grouping (pytest 9.2 with pytest-xdist 3.8)."""
    if not session.config.getoption("loadgroup", False):  # (set on the processes of --dist loadgroup only)
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"pytest-xdist did not group {item.nodeid} (its xdist_group is not in its node id):"
                " these pytest and pytest-xdist releases do not work together under --dist"
                " loadgroup; install the pytest the dev extra asks for (pyproject.toml)"
            )
