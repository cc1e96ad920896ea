"""What a Redis store keeps of the runs' data it stepped last (``data_cache``): the data a
commit left, with the version the commit gave it, within its bounds."""

from __future__ import annotations

import sys
import tracemalloc

import pytest

from dflow.adapters.redis import data_cache
from dflow.adapters.redis.data_cache import RunDataCache
from dflow.store import Claim
from dflow.wire.values import Message


def _claimed(cache: RunDataCache, m: Message, data: dict[str, bytes], version: str = "v1") -> Claim:
    claim = Claim(m, "tok", None, b"v", data)
    cache.claimed(claim, version)
    return claim


def test_a_commit_s_data_is_kept_with_the_version_the_commit_gave_it() -> None:
    cache = RunDataCache()
    m = Message("r", 1, "a")
    claim = _claimed(cache, m, {"x": b"1", "y": b"2"})
    assert cache.known(Message("r", 2, "b")) == ("v1", claim.data)
    now = cache.committed(claim, {"x": None, "z": b"3"}, "v2", ended=False)
    assert now == {"y": b"2", "z": b"3"} and claim.data == {"x": b"1", "y": b"2"}, (
        "the claim's stays as it was"
    )
    assert cache.known(Message("r", 2, "b")) == ("v2", now)
    assert cache.known(Message("other", 1, "a")) == ("", None)


def test_a_commit_without_changes_keeps_the_same_data_at_its_new_version() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("r", 1, "a"), {"x": b"1"})
    assert cache.committed(claim, {}, "v2", ended=False) is claim.data
    assert cache.known(Message("r", 2, "b")) == ("v2", claim.data)


def test_a_run_that_ended_is_forgotten() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("r", 1, "a"), {"x": b"1"})
    assert cache.committed(claim, {"x": b"2"}, "v2", ended=True) == {"x": b"2"}
    assert cache._kept == {} and cache._bytes == 0


def test_a_run_whose_data_has_no_version_is_not_kept() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("old", 3, "a"), {"x": b"1"}, version="")  # (an earlier release's)
    assert cache.known(claim.message) == ("", None)
    assert cache.committed(claim, {"y": b"2"}, "v2", ended=False) == {"x": b"1", "y": b"2"}
    assert cache.known(claim.message)[0] == "v2", "its first commit of this release gives it one"


def test_the_memory_counted_follows_what_is_kept() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("r", 1, "a"), {"x": b"1" * 100})
    now = cache.committed(claim, {"x": None, "y": b"2" * 50}, "v2", ended=False)
    assert cache._bytes == sys.getsizeof(now) + sys.getsizeof("y") + sys.getsizeof(now["y"])
    cache.forget("r")
    assert cache._bytes == 0


def test_the_runs_stepped_last_are_kept_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    one = sys.getsizeof({"k": b""}) + sys.getsizeof("k") + sys.getsizeof(b"x" * 10)
    monkeypatch.setattr(data_cache, "MAX_RUNS", 3)
    monkeypatch.setattr(data_cache, "MAX_BYTES", 3 * one + 50)
    monkeypatch.setattr(data_cache, "MAX_RUN_BYTES", one + 100)
    cache = RunDataCache()
    for t in "abcd":
        _claimed(cache, Message(t, 1, "s"), {"k": b"x" * 10})
    assert list(cache._kept) == ["b", "c", "d"] and cache._bytes == 3 * one
    _claimed(cache, Message("e", 1, "s"), {"k": b"x" * 70})  # over MAX_BYTES with the others
    assert list(cache._kept) == ["d", "e"]
    _claimed(cache, Message("f", 1, "s"), {"k": b"x" * 200})  # more than a run may take
    assert list(cache._kept) == ["d", "e"]


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
