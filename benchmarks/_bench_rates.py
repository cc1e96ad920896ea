"""The flows of bench_rate_limit.py, served by its worker (``dflow worker
benchmarks._bench_rates``): a 10-step chain of trivial steps, plain and with every step behind
a rate limit whose tokens are always free (its cost is the token's, never a wait)."""

from __future__ import annotations

from typing import Any

from dflow import DFlow

#: a bucket no benchmark exhausts: a million tokens a second, a million at once
FREE = {"rate": 1_000_000, "burst": 1_000_000}


def inc(x: int) -> int:
    return x + 1


def chain(length: int, name: str, *, limited: bool) -> Any:
    flow = DFlow.from_call("start")
    for i in range(length):
        flow = flow.map(inc).id(f"s{i}")
        if limited:
            flow = flow.rate_limit("bench", **FREE)
    return flow.init(name)


# two of each, made in the order plain, limited, limited, plain: where in memory a flow's
# objects fall moves a local step by a few µs, either way
plain10 = chain(10, "rates-plain10", limited=False)
limited10 = chain(10, "rates-limited10", limited=True)
limited10b = chain(10, "rates-limited10b", limited=True)
plain10b = chain(10, "rates-plain10b", limited=False)
