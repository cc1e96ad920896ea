"""What a Redis store keeps of the runs' data it stepped last (``data_cache``): the data a
commit left, for the steps that commit leads to only, within its bounds."""

from __future__ import annotations

import pytest

from dflow.adapters.redis import data_cache
from dflow.adapters.redis.data_cache import RunDataCache
from dflow.store import Advance, Claim, Fail, Finish, Fork, Wait
from dflow.wire.values import Message


def _claimed(cache: RunDataCache, m: Message, data: dict[str, bytes], ctok: str = "ct") -> Claim:
    claim = Claim(m, "tok", None, b"v", data)
    cache.claimed(claim, ctok)
    return claim


def test_a_commit_s_data_is_known_for_the_next_step_only() -> None:
    cache = RunDataCache()
    m = Message("r", 1, "a")
    claim = _claimed(cache, m, {"x": b"1", "y": b"2"})
    nxt = Message("r", 2, "b")
    now = cache.committed(claim, {"x": None, "z": b"3"}, Advance(None, b"v", nxt))
    assert now == {"y": b"2", "z": b"3"} and claim.data == {"x": b"1", "y": b"2"}, (
        "the claim's stays as it was"
    )
    assert cache.known(nxt) == ("ct", now)
    assert cache.known(Message("r", 2, "b", attempt=1)) == ("", None), "another attempt: read again"
    assert cache.known(Message("r", 3, "c")) == ("", None)
    assert cache.known(m) == ("", None), "the step committed is not claimed again"


def test_a_wait_s_data_serves_its_step_and_the_one_resume_starts() -> None:
    cache = RunDataCache()
    m = Message("r", 4, "ask", attempt=2)
    claim = _claimed(cache, m, {})
    now = cache.committed(claim, {"q": b"1"}, Wait("answer"))
    assert cache.known(m) == ("ct", now) and cache.known(Message("r", 5, "ask", kind=1)) == ("ct", now)


def test_a_fork_s_data_serves_its_join() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("r", 1, "a"), {"x": b"1"})
    join = Message("r", 2, "zip", kind=2)
    cache.committed(claim, {}, Fork("zip", [], join))
    assert cache.known(join) == ("ct", {"x": b"1"})


@pytest.mark.parametrize("end", [Finish(b"r"), Fail({"type": "E"})], ids=["finish", "fail"])
def test_a_run_that_ended_is_forgotten(end: Finish | Fail) -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("r", 1, "a"), {"x": b"1"})
    assert cache.committed(claim, {"x": b"2"}, end) == {"x": b"2"}
    assert cache._kept == {} and cache._bytes == 0


def test_a_run_without_a_create_token_is_not_kept() -> None:
    cache = RunDataCache()
    claim = _claimed(cache, Message("b/1-0", 0, "a"), {"x": b"1"}, ctok="")
    nxt = Message("b/1-0", 1, "b")
    assert cache.committed(claim, {}, Advance(None, b"v", nxt)) == {"x": b"1"}
    assert cache.known(nxt) == ("", None)


def test_the_runs_stepped_last_are_kept_within_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_cache, "MAX_RUNS", 3)
    monkeypatch.setattr(data_cache, "MAX_BYTES", 100)
    monkeypatch.setattr(data_cache, "MAX_RUN_BYTES", 90)
    cache = RunDataCache()
    for t in "abcd":
        _claimed(cache, Message(t, 1, "s"), {"k": b"x" * 10})
    assert list(cache._kept) == ["b", "c", "d"] and cache._bytes == 33
    _claimed(cache, Message("e", 1, "s"), {"k": b"x" * 79})  # over MAX_BYTES with the others
    assert list(cache._kept) == ["d", "e"] and cache._bytes == 91
    _claimed(cache, Message("f", 1, "s"), {"k": b"x" * 90})  # larger than a run may keep
    assert "f" not in cache._kept and cache._bytes == 91
