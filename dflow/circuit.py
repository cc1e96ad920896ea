"""Circuit breakers shared by every worker through the store: the public home of
``Circuit`` and ``CircuitState`` (defined in ``dflow.patterns.circuit``)."""

from __future__ import annotations

from .patterns.circuit import Circuit, CircuitState

__all__ = ["Circuit", "CircuitState"]
