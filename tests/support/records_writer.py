"""Write the step records of a run as the Redis store of the release this is run with keeps
them (the packed entries of the run's list, as they are on the server), for
tests/test_stored_compat.py:

    python -m tests.support.records_writer REDIS_URL OUT_FILE LABEL

The run goes through the store's own calls (create, claim, commit) with made-up records: an
entry step, steps that pass a value on, a commit of two records, a step whose input is not
the output before it, a short value. ``OUT_FILE`` gets the packed list entries, the input
and output each record was written with, and ``LABEL`` (which release wrote them). The
run's keys are deleted after; nothing else on the server is touched.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import msgpack
import redis

from dflow.adapters.redis import RedisStore
from dflow.context import StepRecord, StepStatus
from dflow.store import Advance, Finish, Frames, NewRun
from dflow.wire.values import Message


def _step(key: str, seq: int, raw_input: bytes | None, raw_output: bytes | None) -> StepRecord:
    return StepRecord(
        key, seq, StepStatus.DONE, 0, "w1", 1765115430.5 + seq, 0.25, raw_input, raw_output, None, key
    )


async def write(url: str, prefix: str) -> tuple[list[bytes], list[list[bytes | None]]]:
    store = RedisStore(url, prefix=prefix)
    a, b, c, d, e = (bytes([65 + i]) * 200 for i in range(5))
    trace = "compat-records"
    new = NewRun(
        trace,
        Frames(b"frames", (), {}),
        b,
        Message(trace, 2, "b"),
        records=[StepRecord("entry", 0, StepStatus.ENTRY, raw_output=a), _step("a", 1, a, b)],
    )
    await store.create_run(new)
    commits = [
        [_step("b", 2, b, c), _step("c", 3, c, d)],
        [_step("d", 4, e, e)],
        [_step("e", 5, e, b"short")],
    ]
    msg = new.message
    assert msg is not None
    for i, records in enumerate(commits):
        claim = await store.claim(msg, "w1", 30)
        assert claim is not None
        nxt = Message(trace, msg.seq + len(records), "x")
        out = records[-1].raw_output or b""
        done = await store.commit(
            claim, records, {}, Finish(out) if i == len(commits) - 1 else Advance(None, out, nxt)
        )
        assert done.applied
        msg = nxt
    await store.close()
    r = redis.Redis.from_url(url)
    packed: list[bytes] = r.lrange(f"{prefix}:s:{trace}", 0, -1)
    keys = list(r.scan_iter(f"{prefix}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()
    expected = [[None, a], [a, b], [b, c], [c, d], [e, e], [e, b"short"]]
    return packed, expected


def main() -> int:
    url, out, label = sys.argv[1:4]
    packed, expected = asyncio.run(write(url, f"compat{uuid.uuid4().hex[:8]}"))
    body = {"written_by": label, "written": time.strftime("%Y-%m-%d"), "packed": packed, "expected": expected}
    Path(out).write_bytes(msgpack.packb(body, use_bin_type=True))
    print(f"{len(packed)} records, {sum(len(p) for p in packed)} bytes -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
