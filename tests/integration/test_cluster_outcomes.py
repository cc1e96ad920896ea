"""No run ends wrong on a Redis Cluster under faults, with ``dflow worker`` processes on it:
zips of three-step branches joined by their sum, and sagas of three compensable steps
failing at the fourth (``flows.zipsum``, ``flows.saga3``; each compensation applies its
effect once per idempotency key, in its own Redis).

- A master killed after its replica was cut off (so that it had acknowledged writes its
  replica never got), with ``wait=0`` and ``wait=1``: every zip has its parts and sum,
  every saga ends compensated with its three compensations listed and their three effects
  applied once each, newest first. The client's waits see dflow's errors only.
- Workers killed with kill -9 again and again while sagas are being undone, and a worker
  killed at a chosen point of a compensation (before its effect, between its effect and its
  commit): the same.

Each prints its figures: runs right of all, steps run again, the time from the fault to the
last run's end.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

import dflow
from dflow import RunCompensatedError, RunFailedError, RunStatus

from .apps import flows
from .cluster_rig import Rig, kill_busiest_master, rejoin

if TYPE_CHECKING:
    from tests.support.redis_cluster import RedisClusterProcs

#: what a saga3 run ends with: the steps its compensations undid, newest first
SAGA_UNDONE = ["sg3>sg4", "sg2>sg3>sg4", "sg1>sg2>sg3>sg4"]


def outcomes(rig: Rig, runs: list[dflow.Run[Any]], timeout: float) -> dict[str, tuple[str, Any]]:
    """Each run's end, as its client sees it: ("done", result), ("compensated", the steps
    undone), ("failed", error); ("error", ...) for anything a wait raised that is not
    dflow's. Waits that meet a store not available (a failover) wait again."""
    deadline = time.monotonic() + timeout
    out: dict[str, tuple[str, Any]] = {}
    for run in runs:
        while run.trace_id not in out:
            left = deadline - time.monotonic()
            if left <= 0:
                stuck = [r.trace_id for r in runs if r.trace_id not in out][:3]
                pytest.fail(f"runs not ended, e.g. {stuck}\n{rig.workers.output()}")
            try:
                out[run.trace_id] = ("done", run.result(min(left, 5)))
            except RunCompensatedError as exc:
                out[run.trace_id] = ("compensated", exc.error.get("compensated"))
            except RunFailedError as exc:
                out[run.trace_id] = ("failed", exc.error)
            except (dflow.StoreError, dflow.RunTimeoutError):
                time.sleep(0.1)
            except Exception as exc:  # not dflow's: the finding
                out[run.trace_id] = ("error", f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
    return out


class Mix:
    """``zips`` zipsum and ``sagas`` saga3 runs, started together, and how they ended."""

    def __init__(self, rig: Rig, zips: int, sagas: int) -> None:
        self.rig = rig
        self.zips = [flows.zipsum.call(i) for i in range(zips)]
        self.sagas = [flows.saga3.call(i) for i in range(sagas)]

    @property
    def runs(self) -> list[dflow.Run[Any]]:
        return self.zips + self.sagas

    def wrong(self, ended: dict[str, tuple[str, Any]]) -> dict[str, Any]:
        """The runs that ended otherwise than they must (by trace id: what was seen)."""
        wrong: dict[str, Any] = {}
        for i, run in enumerate(self.zips):
            if ended[run.trace_id] != ("done", flows.expected_parts(i)):
                wrong[run.trace_id] = ended[run.trace_id]
        for run in self.sagas:
            effects = [
                x.decode() for x in self.rig.r.lrange(flows.undone_key(run.trace_id, self.rig.prefix), 0, -1)
            ]
            status = run.status()
            seen = (ended[run.trace_id], effects, status)
            if seen != (("compensated", SAGA_UNDONE), ["u3", "u2", "u1"], RunStatus.COMPENSATED):
                wrong[run.trace_id] = seen
        return wrong

    def reexecuted(self) -> tuple[int, int]:
        """(steps run more than once, executions beyond the first) of steps and compensations."""
        counts = Counter[str]()
        for key in (f"{self.rig.prefix}:execs", f"{self.rig.prefix}:undo-execs"):
            counts.update({k.decode(): int(v) for k, v in self.rig.r.hgetall(key).items()})
        again = [n for n in counts.values() if n > 1]
        return len(again), sum(n - 1 for n in again)


def _gather(runs: list[dflow.Run[Any]]) -> Any:
    """``dflow.gather(runs)``, again while the store is not available; what it raised else."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return dflow.gather(runs, timeout=max(1.0, deadline - time.monotonic()))
        except dflow.StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
        except Exception as exc:
            return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"


def _going(rig: Rig, steps: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while rig.executed() < steps:
        assert time.monotonic() < deadline, f"the workers did not get going\n{rig.workers.output()}"
        time.sleep(0.01)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("wait", [0, 1], ids=["wait0", "wait1"])
def test_no_run_ends_wrong_when_a_master_dies_with_writes_its_replica_never_got(
    rig_factory: Any, fresh_redis_cluster: RedisClusterProcs, wait: int
) -> None:
    cluster = fresh_redis_cluster
    t0 = time.monotonic()
    rig: Rig = rig_factory(wait=bool(wait), step_sleep=0.02, concurrency=6)
    rig.workers.start(3)
    mix = Mix(rig, zips=40, sagas=40)  # 40 x 17 zip steps, 40 x (4 + 3) saga steps
    _going(rig, 250)
    # A client waiting for all the zips across the failover: its wait reads ends that the
    # failover then loses (it once returned None for them).
    gathered: list[Any] = []
    waiter = threading.Thread(target=lambda: gathered.append(_gather(mix.zips)), daemon=True)
    waiter.start()
    k = kill_busiest_master(cluster, rig, mix.runs, lagging=True)
    assert k.lost > 0, f"the master had writes its replica never got (it wrote {k.written} B meanwhile)"
    rejoin(cluster, k.victim)
    ended = outcomes(rig, mix.runs, timeout=60)
    waiter.join(30)
    assert gathered == [[flows.expected_parts(i) for i in range(len(mix.zips))]], "what gather returned"
    recovered = time.monotonic() - k.at
    wrong = mix.wrong(ended)
    again, extra = mix.reexecuted()
    print(
        f"\n[wait={wait} master killed, replica cut off] runs right {len(mix.runs) - len(wrong)}/{len(mix.runs)}; "
        f"victim held {k.held}, {k.lost} B lost, runs gone back {k.went_back}; failover {k.failover:.1f}s, "
        f"all ended {recovered:.1f}s after the kill; steps run again {again} ({extra} extra executions); "
        f"test {time.monotonic() - t0:.1f}s"
    )
    assert wrong == {}, "runs that ended wrong"


#: sagas and seconds of the storm (``DFLOW_TEST_STORM=<sagas>,<seconds>`` for a longer one)
STORM = tuple(int(x) for x in os.environ.get("DFLOW_TEST_STORM", "60,6").split(","))


@pytest.mark.timeout(90 + 4 * STORM[1] + STORM[0] // 2)
def test_sagas_are_undone_exactly_while_workers_are_killed_again_and_again(
    rig_factory: Any, fresh_redis_cluster: RedisClusterProcs
) -> None:
    """kill -9 of a worker every 0.5-1 s for 6 s (a new one started each time), while 60
    sagas run and are undone: each kill lands somewhere in a step or a compensation (between
    its effect and its commit, between its commit and the next step). For a longer storm:
    ``DFLOW_TEST_STORM=<sagas>,<seconds>``."""
    n, seconds = STORM
    t0 = time.monotonic()
    rig: Rig = rig_factory(wait=False, step_sleep=0.03, concurrency=8)
    rig.workers.start(3)
    mix = Mix(rig, zips=0, sagas=n)
    sagas = mix.sagas
    _going(rig, 20)
    rng = random.Random(26)
    storm_end = time.monotonic() + seconds
    while time.monotonic() < storm_end:
        rig.workers.kill_one()
        rig.workers.start(1, wait=False)
        time.sleep(rng.uniform(0.5, 1.0))
    storm = time.monotonic()
    ended = outcomes(rig, sagas, timeout=60 + n / 5)
    recovered = time.monotonic() - storm
    wrong = mix.wrong(ended)
    again, extra = mix.reexecuted()
    print(
        f"\n[kill -9 storm, {rig.workers.killed} workers killed] sagas right {len(sagas) - len(wrong)}/{len(sagas)}; "
        f"steps run again {again} ({extra} extra executions); all ended {recovered:.1f}s after the storm; "
        f"test {time.monotonic() - t0:.1f}s"
    )
    assert wrong == {}, "sagas that ended wrong"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("n", "where"), [(2, "before"), (1, "after")], ids=["u2-before-its-effect", "u1-after-its-effect"]
)
def test_a_worker_killed_at_a_compensation_leaves_the_saga_undone_exactly(
    rig_factory: Any, fresh_redis_cluster: RedisClusterProcs, n: int, where: str
) -> None:
    """The worker running compensation ``u<n>`` is killed (kill -9) at a chosen point: just
    before its effect (between the commit of the compensation before it and this one's
    effect), or between its effect and its commit. The step runs again on
    another worker once its lease lapses; the saga ends compensated, each effect applied once,
    newest first."""
    rig: Rig = rig_factory(wait=False, step_sleep=0.0, concurrency=4)
    rig.workers.start(2)
    rig.r.set(f"{rig.prefix}:hold-undo", f"{n}:{where}")
    mix = Mix(rig, zips=0, sagas=3)
    deadline = time.monotonic() + 30
    holding: list[tuple[str, int]] = []
    while not holding:
        assert time.monotonic() < deadline, f"no compensation was held\n{rig.workers.output()}"
        for run in mix.sagas:
            pid = rig.r.lindex(f"{rig.prefix}:holding:{run.trace_id}", 0)
            if pid is not None:
                holding.append((run.trace_id, int(pid)))
        time.sleep(0.02)
    ((trace, pid),) = holding
    (proc,) = [p for p in rig.workers.procs if p.pid == pid]
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    rig.workers.start(1)
    ended = outcomes(rig, mix.sagas, timeout=40)
    recovered = time.monotonic() - killed
    execs = {k.decode(): int(v) for k, v in rig.r.hgetall(f"{rig.prefix}:undo-execs").items()}
    print(
        f"\n[kill at u{n} {where} its effect] sagas right {3 - len(mix.wrong(ended))}/3; the held run's "
        f"compensations ran {sorted(v for k, v in execs.items() if k.startswith(trace))} times; "
        f"ended {recovered:.1f}s after the kill"
    )
    assert mix.wrong(ended) == {}, "sagas that ended wrong"
    assert max(v for k, v in execs.items() if k.startswith(trace + ":")) == 2, "the held one ran again"
