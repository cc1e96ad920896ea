"""An agent's conversation for the dflow console (``dflow.server.console_views``).

A run of an agent keeps its conversation in the run's data, under the agent's namespace
(see ``agent.py``): the task (``head``), then for each turn the loop guard's prompt if it
spoke (``nudge/k``), the model's reply with its tool calls (``think/k``) and the tools'
results (``observe/k``). The console calls :meth:`Agent.console_conversation` (an agent is
a shared object) with a run's data; this reads those keys back in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["conversation"]

_MAX_TURNS = 10_000  # read at most: a run stops long before (max_steps)


def _batch(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    return [m for m in value if isinstance(m, dict) and isinstance(m.get("role"), str)]


def conversation(pointer: str, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The messages of the agent whose run key is ``pointer`` in a run's ``data`` (decoded
    values), oldest first; ``None`` when that agent has taken no turn in the run."""
    ns = data.get(pointer)
    if not isinstance(ns, str) or not ns.startswith(pointer + "/"):
        return None
    turns: list[dict[str, Any]] = []
    for k in range(_MAX_TURNS):
        think, nudge = data.get(f"{ns}/think/{k}"), data.get(f"{ns}/nudge/{k}")
        if think is None and nudge is None:
            break
        turns += _batch(nudge) + _batch(think) + _batch(data.get(f"{ns}/observe/{k}"))
    if not turns:
        return None
    return _batch(data.get(f"{ns}/head")) + turns
