"""State shared by runs and processes, versioned: the public home of ``State`` and
``Version`` (defined in ``dflow.patterns.state``)."""

from __future__ import annotations

from .patterns.state import State, Version

__all__ = ["State", "Version"]
