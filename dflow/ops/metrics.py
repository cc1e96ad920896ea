"""Prometheus metrics of a runtime's steps (``prometheus-client``: the ``metrics`` extra).

    metrics = Metrics()                     # registers in prometheus_client's default registry
    runtime = Runtime(transport, store, observers=[metrics])   # or runtime.add_observer(metrics)
    serve_metrics(9464)                     # GET http://127.0.0.1:9464/metrics

``dflow worker --metrics-port N`` does this. The series (``pipeline`` and ``step`` are the
labels of ``dflow.observe``: the pipeline's name and the node's label or id, of bounded variety):

- ``dflow_steps_started_total{pipeline,step}``: steps that started running here;
- ``dflow_steps_committed_total{pipeline,step}``: of those, steps whose outcome was
  committed (whatever it was: done, failed, retrying, waiting, forked, ...);
- ``dflow_steps_failed_total{pipeline,step}``: committed steps that raised, and whose
  error went on to an error handler or failed the run;
- ``dflow_steps_retried_total{pipeline,step}``: committed steps that raised and were
  scheduled again under their retry policy;
- ``dflow_lease_losses_total{pipeline,step}``: steps whose commit was refused because
  their lease had lapsed (another worker took the step over) or their run was cancelled
  meanwhile: the result was dropped;
- ``dflow_steps_aborted_total{pipeline,step}``: steps handed back uncommitted (the store
  or transport failed, or the worker stopped): they run again;
- ``dflow_step_duration_seconds{pipeline,step}``: a histogram of the time each committed
  step ran (its function, or its join), as its step record says;
- ``dflow_steps_in_flight``: steps claimed by this process and not yet finished;
- ``dflow_steps_parked_total``: steps set aside because their code is missing here;
- ``dflow_steps_rejected_total``: steps whose flow could not be loaded (their run failed);
- ``dflow_dead_letters_total``: messages that were no step message, set aside;
- ``dflow_deadlocks_total``: deadlocks this process's detector broke (``dflow.deadlock``:
  runs waiting for each other; each broken wait is logged with its cycle);
- ``dflow_transport_lag``: messages published and not yet acknowledged, sampled every
  ``lag_interval`` seconds (``Transport.lag``; NaN when the transport cannot tell);
- ``dflow_circuit_state{circuit}``: each circuit breaker used lately (``Circuit.known``), 0
  closed, 1 half-open, 2 open, and ``dflow_circuit_failures{circuit}``, the failures in its
  window, sampled from the store every ``lag_interval`` seconds;
- ``dflow_circuit_fast_failures_total{circuit}``: calls this process's circuits refused at once.

So started = committed + lease losses + aborted + in flight. Cost per step: a few dict
lookups and integer additions. The per-step series are kept as plain counts, per thread
(one writer each: a runtime's loop), and handed to prometheus-client by a collector when
scraped, rather than as its ``Counter`` children, whose every increment takes a lock (four
increments and a histogram cost a worker several microseconds a step; these, well under
one). In flight and lag cost nothing per step. Past ``max_series`` distinct (pipeline,
step) pairs in one thread, further steps count under ``("(other)", "(other)")``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..context import StepRecord, StepStatus
from ..errors import ConfigurationError
from ..observe import StepObserver
from ..patterns.circuit import _fast_failure_counts
from ..shared_state import KnownCircuit, backend_for
from ..store import Claim

try:
    import prometheus_client as prom
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError("dflow.metrics needs prometheus-client: pip install 'dflow-runtime[metrics]'") from exc

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ..patterns.deadlock import Deadlock
    from ..runtime.worker import Runtime

__all__ = ["Metrics", "MetricsServer", "serve_metrics"]

log = logging.getLogger("dflow.metrics")

#: seconds; from sub-millisecond steps to LLM calls of minutes
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
OTHER = "(other)"  #: the labels of steps past ``max_series``
_LABELS = ("pipeline", "step")
#: (attribute of _Step, series name, help) of the per-step counters
_COUNTERS = (
    ("started", "dflow_steps_started", "Steps that started running"),
    ("committed", "dflow_steps_committed", "Steps whose outcome was committed"),
    ("failed", "dflow_steps_failed", "Committed steps that raised (not retried)"),
    ("retried", "dflow_steps_retried", "Committed steps that raised, to run again"),
    ("lost", "dflow_lease_losses", "Commits refused: the step's lease had lapsed or its run was cancelled"),
    ("aborted", "dflow_steps_aborted", "Steps handed back uncommitted"),
)
_DURATION = ("dflow_step_duration_seconds", "Time committed steps ran")
_FAILED, _RETRYING = StepStatus.FAILED, StepStatus.RETRYING  # (a global is read faster than an enum member)


class _Step:
    """The counts of one (pipeline, step) in one thread."""

    __slots__ = ("aborted", "buckets", "committed", "failed", "lost", "retried", "started", "sum")

    def __init__(self, buckets: int) -> None:
        self.started = self.committed = self.failed = self.retried = self.lost = self.aborted = 0
        self.buckets = [0] * (buckets + 1)  # the last: above every bound
        self.sum = 0.0


class _StepSeries(Collector):
    """The per-step series of a ``Metrics``, summed over its threads' counts when collected."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        out: list[Metric] = [CounterMetricFamily(name, text, labels=_LABELS) for _, name, text in _COUNTERS]
        out.append(HistogramMetricFamily(*_DURATION, labels=_LABELS))
        return out

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        totals: dict[tuple[str, str], list[Any]] = {}
        for table in list(m._tables.values()):
            for key, s in list(table.items()):  # (list(): atomic copies; the owner thread may be adding)
                t = totals.get(key)
                if t is None:
                    t = totals[key] = [0, 0, 0, 0, 0, 0, [0] * len(s.buckets), 0.0]
                for i, (attr, _, _) in enumerate(_COUNTERS):
                    t[i] += getattr(s, attr)
                t[6] = [a + b for a, b in zip(t[6], s.buckets)]
                t[7] += s.sum
        for i, (_, name, text) in enumerate(_COUNTERS):
            family = CounterMetricFamily(name, text, labels=_LABELS)
            for key, t in totals.items():
                family.add_metric(key, t[i])
            yield family
        hist = HistogramMetricFamily(*_DURATION, labels=_LABELS)
        bounds = [*(repr(b) for b in m.buckets), "+Inf"]  # ("0.5", "1.0": as prometheus-client writes them)
        for key, t in totals.items():
            cumulative, running = [], 0
            for bound, n in zip(bounds, t[6]):
                running += n
                cumulative.append((bound, float(running)))
            hist.add_metric(key, cumulative, sum_value=t[7])
        yield hist


_CIRCUIT_STATE = ("dflow_circuit_state", "State of the circuit breaker: 0 closed, 1 half-open, 2 open")
_CIRCUIT_FAILURES = ("dflow_circuit_failures", "Failures counted in the circuit breaker's window")
_FAST_FAILURES = ("dflow_circuit_fast_failures", "Calls refused at once by an open circuit breaker, here")
_STATE_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


class _CircuitSeries(Collector):
    """The circuits' series: their state as last sampled, and the fast failures here."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return [
            GaugeMetricFamily(*_CIRCUIT_STATE, labels=["circuit"]),
            GaugeMetricFamily(*_CIRCUIT_FAILURES, labels=["circuit"]),
            CounterMetricFamily(*_FAST_FAILURES, labels=["circuit"]),
        ]

    def collect(self) -> Iterator[Metric]:
        seen = {c.name: c.snapshot for known in list(self.metrics._circuits.values()) for c in known}
        state = GaugeMetricFamily(*_CIRCUIT_STATE, labels=["circuit"])
        failures = GaugeMetricFamily(*_CIRCUIT_FAILURES, labels=["circuit"])
        for name, snap in sorted(seen.items()):
            state.add_metric([name], _STATE_VALUES.get(snap.state, math.nan))
            failures.add_metric([name], float(snap.failures))
        fast = CounterMetricFamily(*_FAST_FAILURES, labels=["circuit"])
        for name, n in sorted(_fast_failure_counts().items()):
            fast.add_metric([name], float(n))
        yield from (state, failures, fast)


class Metrics(StepObserver):
    """Counts the steps of the runtimes it observes (see the module for the series).

    ``registry``: where the series are registered (default: prometheus-client's global
    registry, which ``serve_metrics`` serves). ``lag_interval``: seconds between samples
    of the transport's lag and of the circuits' states. ``max_series``: distinct (pipeline, step) label pairs at most.
    ``buckets``: the upper bounds of the step duration histogram, in seconds.
    """

    def __init__(
        self,
        *,
        registry: prom.CollectorRegistry | None = None,
        lag_interval: float = 5.0,
        max_series: int = 1000,
        buckets: tuple[float, ...] = DURATION_BUCKETS,
    ) -> None:
        interval = lag_interval
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not 0 < interval < math.inf
        ):
            raise ValueError(f"lag_interval is a number of seconds above 0, got {lag_interval!r}")
        if isinstance(max_series, bool) or not isinstance(max_series, int) or max_series < 1:
            raise ValueError(f"max_series is an int above 0, got {max_series!r}")
        if not buckets or list(buckets) != sorted(set(buckets)) or not all(math.isfinite(b) for b in buckets):
            raise ValueError(f"buckets are finite upper bounds in increasing order, got {buckets!r}")
        self.registry = registry if registry is not None else prom.REGISTRY
        self.lag_interval = float(lag_interval)
        self.max_series = max_series
        self.buckets = tuple(float(b) for b in buckets)
        self._tables: dict[int, dict[tuple[str, str], _Step]] = {}  # by thread: one writer each
        self._runtimes: list[Runtime] = []
        self._samplers: dict[int, asyncio.Task[None]] = {}
        self._circuit_samplers: dict[int, asyncio.Task[None]] = {}
        self._circuits: dict[int, list[KnownCircuit]] = {}  # by runtime: as last sampled
        reg = self.registry
        try:
            reg.register(_StepSeries(self))
            reg.register(_CircuitSeries(self))
            self.steps_in_flight = prom.Gauge(
                "dflow_steps_in_flight", "Steps claimed here and not finished", registry=reg
            )
            self.steps_parked = prom.Counter(
                "dflow_steps_parked", "Steps parked: their code is missing here", registry=reg
            )
            self.steps_rejected = prom.Counter(
                "dflow_steps_rejected", "Steps whose flow could not be loaded", registry=reg
            )
            self.dead_letters = prom.Counter(
                "dflow_dead_letters", "Messages set aside as no step message", registry=reg
            )
            self.deadlocks = prom.Counter(
                "dflow_deadlocks", "Deadlocks broken: runs waiting for each other", registry=reg
            )
            self.transport_lag = prom.Gauge(
                "dflow_transport_lag", "Messages published, not yet acknowledged", registry=reg
            )
        except ValueError as exc:  # Duplicated timeseries
            raise ValueError(
                f"dflow's metrics are registered in this registry already ({exc}): share one Metrics between "
                "runtimes, or give each its own registry=prometheus_client.CollectorRegistry()"
            ) from exc
        self.steps_in_flight.set_function(self._count_in_flight)
        self.transport_lag.set(math.nan)

    def _count_in_flight(self) -> float:
        return float(sum(len(rt._inflight) for rt in list(self._runtimes)))

    def _step(self, pipeline: str, step: str) -> _Step:
        table = self._tables.get(threading.get_ident())
        if table is None:
            table = self._tables.setdefault(threading.get_ident(), {})
        key = (pipeline, step)
        s = table.get(key)
        if s is None:
            if len(table) >= self.max_series:
                key = (OTHER, OTHER)
                s = table.get(key)
            if s is None:
                s = table[key] = _Step(len(self.buckets))
        return s

    # -- the observer --------------------------------------------------------------------

    def attach(self, runtime: Runtime) -> None:
        self._runtimes.append(runtime)
        self._samplers[id(runtime)] = asyncio.get_running_loop().create_task(self._sample_lag(runtime))
        self._circuit_samplers[id(runtime)] = asyncio.get_running_loop().create_task(
            self._sample_circuits(runtime)
        )
        if runtime.deadlocks is not None:
            runtime.deadlocks.listeners.append(self._deadlock)

    async def detach(self, runtime: Runtime) -> None:
        if runtime in self._runtimes:
            self._runtimes.remove(runtime)
        if runtime.deadlocks is not None and self._deadlock in runtime.deadlocks.listeners:
            runtime.deadlocks.listeners.remove(self._deadlock)
        for samplers in (self._samplers, self._circuit_samplers):
            task = samplers.pop(id(runtime), None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._circuits.pop(id(runtime), None)

    async def _sample_lag(self, runtime: Runtime) -> None:
        while True:
            try:
                lag = await runtime.transport.lag()
            except Exception as exc:
                log.debug("dflow: sampling the transport's lag failed: %s", exc)
                lag = None
            self.transport_lag.set(math.nan if lag is None else float(lag))
            await asyncio.sleep(self.lag_interval)

    async def _sample_circuits(self, runtime: Runtime) -> None:
        try:
            backend = backend_for(runtime.store)
        except ConfigurationError:
            return  # a store that keeps no circuits
        while True:
            try:
                self._circuits[id(runtime)] = await backend.circuit_list()
            except Exception as exc:
                log.debug("dflow: sampling the circuits failed: %s", exc)
            await asyncio.sleep(self.lag_interval)

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        s = self._step(pipeline, step)
        s.started += 1
        return s

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        s: _Step = token
        if not applied:
            s.lost += 1
            return
        s.committed += 1
        own = records[0]
        status = own.status
        if status is _FAILED:
            s.failed += 1
        elif status is _RETRYING:
            s.retried += 1
        d = own.duration
        s.buckets[bisect_left(self.buckets, d)] += 1
        s.sum += d

    def aborted(self, token: Any, error: BaseException) -> None:
        s: _Step = token
        s.aborted += 1

    def parked(self, claim: Claim, reason: str, count: int) -> None:
        self.steps_parked.inc()

    def rejected(self, claim: Claim, reason: str) -> None:
        self.steps_rejected.inc()

    def dead_lettered(self, reason: str) -> None:
        self.dead_letters.inc()

    def _deadlock(self, deadlock: Deadlock) -> None:
        self.deadlocks.inc()


class MetricsServer:
    """The HTTP server ``serve_metrics`` started: ``url`` of its ``/metrics``; ``close()``."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.host = str(host)
        self.port = int(port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(
    port: int, host: str = "127.0.0.1", *, registry: prom.CollectorRegistry | None = None
) -> MetricsServer:
    """Serve ``registry`` (default: prometheus-client's global one) in Prometheus' text
    format on ``http://host:port/metrics``, from a daemon thread. ``host`` defaults to this
    machine only; give ``0.0.0.0`` for a scraper elsewhere. ``port`` 0 takes a free port
    (see ``MetricsServer.port``)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"a metrics port is an int from 0 to 65535, got {port!r}")
    try:
        server, thread = prom.start_http_server(port, host, prom.REGISTRY if registry is None else registry)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
    return MetricsServer(server, thread)
