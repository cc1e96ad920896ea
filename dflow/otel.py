"""OpenTelemetry traces of the runs a runtime starts and the steps it runs: the public home
of what ``dflow.ops.otel`` offers (``pip install 'dflow-runtime[otel]'``)."""

from __future__ import annotations

from .ops.otel import FORKS_KEY, TRACE_KEY, Tracing, derived_context, flush, instrument, setup

__all__ = ["FORKS_KEY", "TRACE_KEY", "Tracing", "derived_context", "flush", "instrument", "setup"]
