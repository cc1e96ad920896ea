"""What a Redis store's data cache (``data_cache``) holds against its bound: ``MAX_BYTES``
counts the fields' names and values, but each field a claim decodes is a dict entry, a str
and a bytes object of its own, which the count leaves out; with many small fields the cache
holds many times its bound."""

from __future__ import annotations

import tracemalloc

import pytest

from dflow.adapters.redis import data_cache
from dflow.adapters.redis.data_cache import RunDataCache
from dflow.store import Claim
from dflow.wire.values import Message


def test_the_runs_data_the_cache_keeps_take_no_more_memory_than_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(data_cache, "MAX_BYTES", 1 << 18)
    cache = RunDataCache()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for r in range(64):  # (more than the bound keeps)
            # as a claim decodes a run's data: a str name and a bytes value for each field
            data = {f"f{i:05d}": b"v%d" % i for i in range(1000)}
            cache.claimed(Claim(Message(f"run-{r}", 1, "s"), "tok", None, b"v", data), "ct")
            del data
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache._bytes <= data_cache.MAX_BYTES
    assert held <= 2 * data_cache.MAX_BYTES, (
        f"the cache counts {cache._bytes} bytes of {len(cache._kept)} runs and holds {held}"
    )
