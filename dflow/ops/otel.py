"""OpenTelemetry traces of runs and their steps (the ``otel`` extra).

    dflow.otel.instrument()      # this process's runtime: its steps, and the runs it starts

``dflow worker --otel`` does this in a worker (with the tracer provider its modules set,
or one made from the standard ``OTEL_*`` variables: see ``setup``).

What is traced: starting a run makes a span ``dflow run <pipeline>``, a child of the span
current in the caller (``entry.call()`` inside your request's span), which lasts as long
as the run's creation. Every step makes a span ``dflow step <id>`` (``<label>`` for a
node given one) with the attributes ``dflow.run`` (the run's trace id), ``dflow.pipeline``,
``dflow.step.key``,
``dflow.step.seq``, ``dflow.step.attempt``, ``dflow.worker`` and ``dflow.step.status``
(done, failed, retrying, waiting, sleeping, forked; ``lease_lost``; ``aborted``); a step that
raised has an error status and an exception event. The steps of a run are children of its
run span, whichever worker runs them; the steps of a zip/any branch are children of the
step that forked it. While a step runs, its span is the current span: spans your step
function makes (an HTTP client's, say) are its children.

How the context travels: the carrier is the run itself, not the step message (messages
are also made by the stores' scripts: timers, resumes, joins, which could not carry it).
When a run is created with tracing on, the W3C trace context (``traceparent``, and
``tracestate`` if any) of its run span goes into the run's data under ``TRACE_KEY``;
every claim hands a run's data to the worker, so each step finds its parent there at no
extra cost in messages. Branch runs start with a copy of their parent's data (the Redis
store copies it in its commit script, with the forking step's changes), so a step that
forks records its own span's context as a change of its run, under ``FORKS_KEY``: a map
from each forking run of its lineage to (the common prefix of its branches' ids,
``<run>/<seq>-``, and the step's context). A step whose run is a branch of such a fork
(the longest prefix that matches) nests under that fork's step; the other steps of the
run, under its run span. The map
keeps only the forks of the writing run's ancestors and its own, so it stays as small as
the nesting is deep (a zip's join may merge a branch's map into its parent: it is read by
run id, so that changes nothing there).

Runs started without tracing have no ``TRACE_KEY``: their steps are parented under a
span context derived from the run's trace id (the run's id itself when it is 32 hex
digits, as dflow's are; sampled), so that they still make one trace per run, with a parent
span that no one exported.

Cost: nothing when no runtime has a ``Tracing`` observer (no key is written, no span code
runs). With it: a span per step, and the parent context parsed once per run and worker.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import TYPE_CHECKING, Any

from ..context import StepRecord, StepStatus
from ..errors import ConfigurationError
from ..model.running import runner
from ..observe import StepObserver
from ..store import Claim, NewRun
from ..wire.values import decode, encode

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ImportError("dflow.otel needs OpenTelemetry: pip install 'dflow-runtime[otel]'") from exc

if TYPE_CHECKING:
    from ..runtime.worker import Runtime

__all__ = ["FORKS_KEY", "TRACE_KEY", "Tracing", "derived_context", "flush", "instrument", "setup"]

log = logging.getLogger("dflow.otel")

TRACE_KEY = "dflow/trace"  #: the run data key of the W3C trace context its steps nest under
FORKS_KEY = "dflow/trace-forks"  #: the run data key of the forks its branch runs' steps nest under
_W3C = TraceContextTextMapPropagator()
_ERRORS = (StepStatus.FAILED, StepStatus.RETRYING)
_PARENTS_MAX = 1024  #: parsed parent contexts kept (by their stored bytes); emptied when full
#: the stored bytes of a parent context kept at most: more is no context dflow wrote (a user's
#: ``ctx.put`` of its key, or forks nested past reason), parsed again at each step
_PARENT_BYTES = 8192


class Tracing(StepObserver):
    """Makes the spans of the runs a runtime starts and of the steps it runs (see the
    module), with ``tracer_provider`` (default: the global one, as set when a span is made)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("dflow", _version(), tracer_provider=tracer_provider)
        self._parents: dict[tuple[str, bytes | None, bytes | None], otel_context.Context] = {}

    # -- runs started here -----------------------------------------------------------------

    def run_starting(self, trace_id: str, pipeline: str, data: dict[str, bytes]) -> Any:
        span = self._tracer.start_span(
            f"dflow run {pipeline}",
            kind=trace.SpanKind.PRODUCER,
            attributes={"dflow.run": trace_id, "dflow.pipeline": pipeline},
        )
        carrier = _carrier(span)
        if carrier is not None:
            data[TRACE_KEY] = carrier
        return span

    def run_started(self, token: Any, error: BaseException | None) -> None:
        span: trace.Span = token
        if error is not None:
            span.record_exception(error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        span.end()

    # -- steps -----------------------------------------------------------------------------

    def started(self, claim: Claim, pipeline: str, step: str) -> Any:
        msg = claim.message
        span = self._tracer.start_span(
            f"dflow step {step}",
            context=self._parent(msg.trace_id, claim.data),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "dflow.run": msg.trace_id,
                "dflow.pipeline": pipeline,
                "dflow.step.key": msg.key,
                "dflow.step.seq": msg.seq,
                "dflow.step.attempt": msg.attempt,
            },
        )
        return span, otel_context.attach(trace.set_span_in_context(span)), claim

    def forking(self, token: Any, children: list[NewRun], changes: dict[str, bytes | None]) -> None:
        span, _, claim = token
        carrier = _carrier(span)
        if carrier is None:
            return
        run = claim.message.trace_id
        forks = {r: v for r, v in _forks(claim.data.get(FORKS_KEY)).items() if run.startswith(r + "/")}
        first = children[0].trace_id  # (a branch's id: <run>/<seq>-<index>, see wire.ids.branch_id)
        forks[run] = (first[: first.rindex("-") + 1], carrier)
        raw = encode(forks)
        changes[FORKS_KEY] = raw
        for child in children:
            child.data[FORKS_KEY] = raw

    def finished(self, token: Any, records: list[StepRecord], applied: bool) -> None:
        span: trace.Span = token[0]
        otel_context.detach(token[1])
        own = records[0]
        span.set_attribute("dflow.worker", own.worker)
        if not applied:
            span.set_attribute("dflow.step.status", "lease_lost")
        else:
            span.set_attribute("dflow.step.status", own.status.value)
            if own.status in _ERRORS:
                err = own.error or {}
                kind, message = str(err.get("type", "")), str(err.get("message", ""))
                span.add_event(
                    "exception",
                    {
                        "exception.type": kind,
                        "exception.message": message,
                        "exception.stacktrace": str(err.get("traceback", "")),
                    },
                )
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"{kind}: {message}"))
        span.end()

    def aborted(self, token: Any, error: BaseException) -> None:
        span: trace.Span = token[0]
        otel_context.detach(token[1])
        span.set_attribute("dflow.step.status", "aborted")
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"handed back: {type(error).__name__}: {error}"))
        span.end()

    def _parent(self, run: str, data: Mapping[str, bytes]) -> otel_context.Context:
        """The context the steps of ``run`` nest under (see the module); cached."""
        forks, own = data.get(FORKS_KEY), data.get(TRACE_KEY)
        key = (run, forks, own)
        hit = self._parents.get(key)
        if hit is None:
            best = ""
            for prefix, carrier in _forks(forks).values():
                if len(prefix) > len(best) and run.startswith(prefix):
                    hit, best = _extract(carrier), prefix
            if hit is None and own is not None:
                hit = _extract(own)
            if hit is None:
                hit = derived_context(run)
            if len(forks or b"") + len(own or b"") <= _PARENT_BYTES:  # (else a user's data: not kept)
                if len(self._parents) >= _PARENTS_MAX:
                    self._parents.clear()
                self._parents[key] = hit
        return hit


def _carrier(span: trace.Span) -> bytes | None:
    """The W3C trace context of ``span``, as stored in a run's data (``None``: no valid span)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return encode(carrier) if carrier else None


def _forks(raw: bytes | None) -> dict[str, tuple[str, bytes]]:
    """The entries of a ``FORKS_KEY`` value that are well formed (none for a damaged one)."""
    if raw is None:
        return {}
    try:
        forks = decode(raw)
    except Exception:
        return {}
    if not isinstance(forks, dict):
        return {}
    return {
        r: (v[0], v[1])
        for r, v in forks.items()
        if isinstance(r, str)
        and isinstance(v, list)
        and len(v) == 2
        and isinstance(v[0], str)
        and isinstance(v[1], bytes)
    }


def _extract(raw: bytes) -> otel_context.Context | None:
    """The parent context stored as ``raw``; ``None`` when it is not a valid one."""
    try:
        carrier = decode(raw)
    except Exception:
        return None
    if not isinstance(carrier, dict) or not all(isinstance(v, str) for v in carrier.values()):
        return None
    ctx = _W3C.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def derived_context(trace_id: str) -> otel_context.Context:
    """The parent of the steps of a run without a stored trace context: a remote, sampled
    span context whose trace id is the run's trace id (when it is 32 hex digits, else a
    digest of it) and whose span id is a digest of it."""
    digest = hashlib.blake2b(trace_id.encode(), digest_size=24).digest()
    tid = 0
    if len(trace_id) == 32:
        try:
            tid = int(trace_id, 16)
        except ValueError:
            tid = 0
    if tid == 0:
        tid = int.from_bytes(digest[:16], "big") or 1
    sid = int.from_bytes(digest[16:], "big") or 1
    span = trace.NonRecordingSpan(
        trace.SpanContext(tid, sid, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    )
    return trace.set_span_in_context(span)


def instrument(
    runtime: Runtime | None = None, *, tracer_provider: trace.TracerProvider | None = None
) -> Tracing:
    """Trace the steps ``runtime`` runs and the runs it starts (default: this process's
    runtime, as ``configure`` or ``global_init_for_test`` made it: call this after them).
    Returns the observer. ``ConfigurationError`` when the runtime is traced already (each
    span would be made twice)."""
    if runtime is None:
        runtime = runner().runtime()  # (the runtime is above the observers: reached through the port)
    if any(isinstance(o, Tracing) for o in runtime._observers):
        raise ConfigurationError(
            "this runtime is traced already: dflow.otel.instrument() is called once per runtime"
        )
    tracing = Tracing(tracer_provider)
    runtime.add_observer(tracing)
    return tracing


def setup(service_name: str = "dflow-worker") -> trace.TracerProvider:
    """The tracer provider of this process: the one set already (by the modules a worker
    imports, or ``opentelemetry-instrument``), else an SDK provider made from the standard
    variables and set globally: ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (the
    service name defaults to ``service_name``), ``OTEL_TRACES_SAMPLER``, and
    ``OTEL_TRACES_EXPORTER`` (default ``otlp``; ``console``, ``none``, or any exporter an
    installed package registers), each exported in batches."""
    current = trace.get_tracer_provider()
    if not isinstance(current, trace.ProxyTracerProvider):
        return current
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(
            "dflow's tracing setup needs the OpenTelemetry SDK: pip install 'dflow-runtime[otel]'"
        ) from exc
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    provider = TracerProvider(resource=resource)
    for name in (n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")):
        if not name or name == "none":
            continue
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            hint = " (pip install opentelemetry-exporter-otlp)" if name.startswith("otlp") else ""
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides{hint}; set it to "
                "console, none, or an exporter you installed"
            )
        exporter: Callable[[], Any] = found[0].load()
        provider.add_span_processor(BatchSpanProcessor(exporter()))
    trace.set_tracer_provider(provider)
    return provider


def flush(provider: trace.TracerProvider, timeout: float = 5.0) -> None:
    """Export the spans ``provider`` still holds (an SDK provider; others have nothing to do)."""
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(int(timeout * 1000))
        except Exception:  # at shutdown: report, and go on stopping
            log.exception("dflow: exporting the last spans failed")


def _version() -> str | None:
    try:
        return version("dflow-runtime")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return None
