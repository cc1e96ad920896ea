"""The side-by-side benchmarks' shared helpers (benchmarks/_fair.py): rounds that take the
systems in turn, ratios as medians of per-round ratios, and a Redis server of the benchmark's
own that nothing else shares."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable

import pytest

from benchmarks._fair import Load, own_redis, ratio, rounds, spread


def test_each_round_starts_one_system_further_on() -> None:
    calls: list[str] = []

    def system(name: str, figure: float) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return figure

        return run

    load = Load()
    seen = rounds({"a": system("a", 1.0), "b": system("b", 2.0), "c": system("c", 3.0)}, 3, load=load)

    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert seen == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}
    assert len(load.samples) == 4  # before, then after each round


def test_a_ratio_is_the_median_of_the_per_round_ratios_not_the_ratio_of_the_medians() -> None:
    # a busy second round slows both systems: per round, b is twice as fast as a every time
    seen = {"a": [2.0, 20.0, 4.0], "b": [1.0, 10.0, 2.0]}

    assert ratio(seen, "a", "b") == 2.0
    assert ratio(seen, "b", "a") == 0.5
    assert spread([8.0, 10.0, 15.0]) == "-20% / +50%"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
def test_a_benchmark_gets_a_redis_of_its_own_that_is_gone_afterwards() -> None:
    import redis

    with own_redis() as url:
        port = int(url.rsplit(":", 1)[1])
        assert port != 6379
        with redis.Redis.from_url(f"{url}/0") as r:
            assert r.dbsize() == 0  # nobody else's keys
            r.set("k", "v")
            assert r.config_get("save") == {"save": ""}  # nothing written to disk

    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
