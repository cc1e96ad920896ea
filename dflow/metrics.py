"""Prometheus metrics of the steps and runs a runtime handles: the public home of
``Metrics``, ``MetricsServer`` and ``serve_metrics`` (defined in ``dflow.ops.metrics``;
``pip install 'dflow-runtime[metrics]'``)."""

from __future__ import annotations

from .ops.metrics import Metrics, MetricsServer, serve_metrics

__all__ = ["Metrics", "MetricsServer", "serve_metrics"]
