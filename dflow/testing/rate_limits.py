"""What a store's token buckets (``dflow.rate_limits.TokenBucket``, a store's
``token_bucket``) must do: a quiet bucket hands out ``burst`` tokens at once, then one every
``per / rate`` seconds; a token not free yet is reserved, so callers are served in the order
they asked, each at its own time, concurrent callers too; buckets of other names are apart;
a bucket fills again as time passes.

Subclass ``TokenBucketContract`` and give it the fixture ``make_bucket() -> TokenBucket``, a
fresh bucket store (no bucket used yet). Time passes through ``pass_time(bucket, seconds)``:
by default it sleeps; buckets on a ``dflow.testing.FakeClock`` advance it.
``close_bucket(bucket)`` releases its connections after each test. The waits a bucket gives
are compared within ``slack`` seconds (the time the test's own calls take: 0 on a fake clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from ..rate_limits import RateLimit, TokenBucket
from .cases import sync

__all__ = ["TokenBucketContract"]


def _limit(rate: float, per: float = 1.0, burst: int = 1) -> RateLimit:
    return RateLimit.build(f"bucket-{uuid.uuid4().hex[:8]}", rate, per, burst)


class TokenBucketContract:
    """What every store's token buckets must do. Needs ``make_bucket``."""

    #: seconds by which a wait may differ from the schedule (real time passing between calls)
    slack = 0.05

    @pytest.fixture
    def make_bucket(self) -> Callable[[], TokenBucket]:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    async def pass_time(self, bucket: TokenBucket, seconds: float) -> None:
        """Let ``seconds`` pass for ``bucket``."""
        await asyncio.sleep(seconds)

    async def close_bucket(self, bucket: TokenBucket) -> None:
        """Release what ``bucket`` holds (its connections) at the end of a test."""

    @contextlib.asynccontextmanager
    async def opened(self, make_bucket: Callable[[], TokenBucket]) -> AsyncIterator[TokenBucket]:
        """A fresh bucket store, closed after the block."""
        bucket = make_bucket()
        try:
            yield bucket
        finally:
            await self.close_bucket(bucket)

    def assert_near(self, got: float, expected: float, what: str) -> None:
        assert expected - self.slack <= got <= expected + 1e-6, f"{what}: waited {got}, expected {expected}"

    @sync
    async def test_a_quiet_bucket_gives_its_burst_at_once_then_a_token_each_interval(
        self, make_bucket: Callable[[], TokenBucket]
    ) -> None:
        async with self.opened(make_bucket) as bucket:
            limit = _limit(rate=2, per=1.0, burst=3)  # a token every 0.5 s, 3 at once
            waits = [await bucket.reserve(limit) for _ in range(6)]
            assert waits[:3] == [0.0, 0.0, 0.0], f"the burst goes at once: {waits}"
            for i, wait in enumerate(waits[3:], 1):
                self.assert_near(wait, 0.5 * i, f"token {i + 3}")

    @sync
    async def test_a_token_is_reserved_so_each_waiting_caller_gets_its_own_time(
        self, make_bucket: Callable[[], TokenBucket]
    ) -> None:
        async with self.opened(make_bucket) as bucket:
            limit = _limit(rate=1, per=0.5)  # a token every 0.5 s, one at once
            waits = await asyncio.gather(*(bucket.reserve(limit) for _ in range(10)))
            ordered = sorted(waits)
            assert ordered[0] == 0.0, f"the first caller goes at once: {ordered}"
            for before, after in itertools.pairwise(ordered):
                assert after - before >= 0.5 - self.slack, f"two callers share a token's time: {ordered}"
            self.assert_near(ordered[-1], 4.5, "the tenth caller")

    @sync
    async def test_the_rate_is_counted_over_per_seconds(self, make_bucket: Callable[[], TokenBucket]) -> None:
        async with self.opened(make_bucket) as bucket:
            limit = _limit(rate=3, per=6.0)  # 3 every 6 s: a token every 2 s
            waits = [await bucket.reserve(limit) for _ in range(3)]
            assert waits[0] == 0.0
            self.assert_near(waits[1], 2.0, "the second token")
            self.assert_near(waits[2], 4.0, "the third token")

    @sync
    async def test_buckets_of_other_names_do_not_share_tokens(
        self, make_bucket: Callable[[], TokenBucket]
    ) -> None:
        async with self.opened(make_bucket) as bucket:
            first, second = _limit(rate=1, per=10.0), _limit(rate=1, per=10.0)
            assert await bucket.reserve(first) == 0.0
            assert await bucket.reserve(second) == 0.0, "another name has its own tokens"
            self.assert_near(await bucket.reserve(first), 10.0, "the same name's next token")

    @sync
    async def test_a_bucket_fills_again_as_time_passes(self, make_bucket: Callable[[], TokenBucket]) -> None:
        async with self.opened(make_bucket) as bucket:
            limit = _limit(rate=10, per=1.0, burst=2)  # a token every 0.1 s, 2 at once
            assert [await bucket.reserve(limit) for _ in range(2)] == [0.0, 0.0]
            assert await bucket.reserve(limit) > 0.0, "the burst is spent"
            await self.pass_time(bucket, 0.5)  # the reserved token's time and two intervals more
            assert [await bucket.reserve(limit) for _ in range(2)] == [0.0, 0.0], "it filled again"
            assert await bucket.reserve(limit) > 0.0, "but never past its burst"
