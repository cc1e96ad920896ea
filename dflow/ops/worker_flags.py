"""What the observability flags of ``dflow worker`` set up: ``--metrics-port`` (Prometheus,
``dflow.metrics``), ``--log-format json`` (``ops.logs``) and ``--otel`` (``dflow.otel``).

Each optional dependency is imported only when its flag is given, and a flag whose extra
is missing stops the worker with the command to install it (``ImportError``, which the
command line reports). Bad values are ``ConfigurationError``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..runtime.worker import Runtime

__all__ = ["WorkerObservability"]

log = logging.getLogger("dflow.worker")

LOG_FORMATS = ("text", "json")


class WorkerObservability:
    """The metrics server, JSON logs and tracing of one worker (or ``dflow serve``) process,
    as its flags say."""

    def __init__(
        self,
        *,
        metrics_port: int = 0,
        metrics_host: str = "127.0.0.1",
        log_format: str = "text",
        otel: bool = False,
        service: str = "dflow-worker",
    ) -> None:
        port = metrics_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigurationError(
                f"--metrics-port is a port number (1-65535; 0: no metrics), got {metrics_port!r}"
            )
        if log_format not in LOG_FORMATS:
            raise ConfigurationError(f"--log-format is one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.log_format = log_format
        self.otel = otel
        self.service = service  #: the service name of the spans, unless OTEL_SERVICE_NAME says
        self._server: Any = None
        self._provider: Any = None

    def start_logs(self) -> None:
        """Switch the process's log lines to JSON now, if asked (before the MODULEs load)."""
        if self.log_format == "json":
            from .logs import use_json_logs

            use_json_logs()

    def install(self, runtime: Runtime) -> None:
        """Give ``runtime`` its observers and start serving metrics (before it starts)."""
        if self.log_format == "json":
            from .logs import StepLogContext, use_json_logs

            use_json_logs({"worker": runtime.worker_id})
            runtime.add_observer(StepLogContext())
        if self.otel:
            from . import otel

            self._provider = otel.setup(self.service)
            runtime.add_observer(otel.Tracing(self._provider))
        if self.metrics_port:
            from . import metrics

            observer = metrics.Metrics()
            try:
                self._server = metrics.serve_metrics(self.metrics_port, self.metrics_host)
            except OSError as exc:
                raise ConfigurationError(f"{exc.strerror or exc}; give --metrics-port a free port") from exc
            runtime.add_observer(observer)
            log.info("dflow worker %s: metrics on %s", runtime.worker_id, self._server.url)

    def close(self) -> None:
        """Stop serving metrics; export the spans still held."""
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._provider is not None:
            from . import otel

            otel.flush(self._provider)
            self._provider = None
