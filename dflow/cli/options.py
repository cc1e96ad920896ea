"""What the commands share: the options naming the store and the transport, the value types
of the command line, and the check that a required URL was given."""

from __future__ import annotations

import argparse
import os

from ..errors import ConfigurationError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("dflow-runtime")
    except PackageNotFoundError:  # (a checkout on sys.path, not installed)
        return "(not installed)"


def add_store(parser: argparse.ArgumentParser) -> None:
    """``--store URL``, from ``DFLOW_STORE`` when not given."""
    parser.add_argument(
        "--store",
        default=os.environ.get("DFLOW_STORE"),
        metavar="URL",
        help="the store: redis://..., redis+cluster://... (default: $DFLOW_STORE)",
    )


def add_transport(parser: argparse.ArgumentParser, why: str = "") -> None:
    """``--transport URL``, from ``DFLOW_TRANSPORT`` when not given."""
    parser.add_argument(
        "--transport",
        default=os.environ.get("DFLOW_TRANSPORT"),
        metavar="URL",
        help=f"the transport: redis://... or kafka://... (default: $DFLOW_TRANSPORT){why}",
    )


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``, one of :data:`LOG_LEVELS`, from ``DFLOW_LOG_LEVEL`` when not given."""
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("DFLOW_LOG_LEVEL", "INFO").upper(),
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default: $DFLOW_LOG_LEVEL, else INFO)",
    )


def add_otel(parser: argparse.ArgumentParser, what: str) -> None:
    """``--otel``, on when ``DFLOW_OTEL`` is 1 or true; ``what`` says what it traces."""
    parser.add_argument(
        "--otel",
        action="store_true",
        default=os.environ.get("DFLOW_OTEL", "") in ("1", "true"),
        help=f"trace {what} with OpenTelemetry (the otel extra; default: on when $DFLOW_OTEL is 1 "
        "or true), exported as the OTEL_* variables say (OTEL_EXPORTER_OTLP_ENDPOINT, ...)",
    )


def count(text: str) -> int:
    """A count of 1 or more, from the command line."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return n


def seconds(text: str) -> float:
    """A number of seconds, 0 or more, from the command line."""
    try:
        n = float(text)
    except ValueError:
        n = -1.0
    if not 0 <= n < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return n


def need(value: str | None, flag: str, env: str) -> str:
    """``value``, or a ``ConfigurationError`` saying that ``flag`` (or ``env``) is required."""
    if not value:
        raise ConfigurationError(f"{flag} is required (or set {env})")
    return value


def store_url(args: argparse.Namespace) -> str:
    return need(args.store, "--store", "DFLOW_STORE")


def transport_url(args: argparse.Namespace) -> str:
    return need(args.transport, "--transport", "DFLOW_TRANSPORT")
