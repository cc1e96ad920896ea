"""``dflow.configure()`` finds the store and the transport where the worker does: in
``DFLOW_STORE`` and ``DFLOW_TRANSPORT``, unless given."""

from __future__ import annotations

import pytest

import dflow
from dflow import DFlow

from .conftest import SECRET


def test_configure_reads_the_urls_the_worker_reads(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLOW_TRANSPORT", f"{redis_url}?stream={prefix}:steps")
    monkeypatch.setenv("DFLOW_STORE", f"{redis_url}?prefix={prefix}")
    dflow.configure(secret=SECRET)
    try:
        run = DFlow.direct_run(4, lambda x: DFlow.just(x).map(lambda v: v * 10).id("tens"))
        assert run.result(10) == 40
        assert type(dflow.current_runtime().store).__name__ == "RedisStore"
    finally:
        dflow.shutdown()


def test_configure_without_urls_or_variables_says_which_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DFLOW_TRANSPORT", raising=False)
    monkeypatch.setenv("DFLOW_STORE", "redis://127.0.0.1:6379/0")
    with pytest.raises(dflow.ConfigurationError, match="no transport and DFLOW_TRANSPORT is not set"):
        dflow.configure(secret=SECRET)
    monkeypatch.setenv("DFLOW_TRANSPORT", "redis://127.0.0.1:6379/0")
    monkeypatch.delenv("DFLOW_STORE")
    with pytest.raises(dflow.ConfigurationError, match="no store and DFLOW_STORE is not set"):
        dflow.configure(secret=SECRET)
