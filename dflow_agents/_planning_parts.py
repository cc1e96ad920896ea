"""The parts of a :class:`~dflow_agents.PlanningFlow` checked when it is made: its
executors, planner and finalizer; and what a failed executor's run leaves as its outcome."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from ._plan_summary import Finalizer
from .agent import Agent
from .fallback import as_model
from .function import AIFunction
from .model import ChatModel

__all__ = ["checked_executors", "checked_finalizer", "checked_planner", "executor_failed"]

_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


def checked_planner(planner: object) -> ChatModel | AIFunction[Any] | None:
    planner = as_model(planner)
    if planner is not None and not isinstance(planner, (ChatModel, AIFunction)):
        raise TypeError(f"planner must be a ChatModel or an AIFunction, got {planner!r}")
    return planner


def checked_finalizer(finalizer: Any) -> ChatModel | AIFunction[Any] | Finalizer | None:
    finalizer = as_model(finalizer)
    if not (finalizer is None or callable(finalizer) or isinstance(finalizer, ChatModel)):
        raise TypeError(
            f"finalizer must be a ChatModel, an AIFunction or fn(request, plan, steps), got {finalizer!r}"
        )
    return cast("ChatModel | AIFunction[Any] | Finalizer | None", finalizer)


def executor_failed(error: BaseException) -> dict[str, str]:
    text = f"the executor's run failed: {type(error).__name__}: {error}"
    return {"__error__": text if len(text) <= 500 else text[:500] + "..."}


def checked_executors(executors: object) -> dict[str, Agent]:
    if isinstance(executors, Agent):
        return {"default": executors}
    if not isinstance(executors, Mapping) or not executors:
        raise TypeError(
            f"executors is an agent or a non-empty mapping of tag to agent, got {executors!r:.200}"
        )
    out: dict[str, Agent] = {}
    for key, agent in executors.items():
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            raise ValueError(
                f"executor tag {key!r} is not accepted: use 1-64 letters, digits, _ and - (as in [SEARCH])"
            )
        if not isinstance(agent, Agent):
            raise TypeError(
                f"executor {key!r} is not an agent (ToolCallAgent, ConversationAgentExecutor): {agent!r:.200}"
            )
        if key.lower() in out:
            raise ValueError(
                f"two executors are tagged {key.lower()!r} (tags are matched without regard to case)"
            )
        out[key.lower()] = agent
    return out
