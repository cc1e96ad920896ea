"""The steps of a plan as a planner writes them: a text, or an object that also names the
agent that carries the step out, the tools it should use and whether it may run at the
same time as its neighbours.

``{"step": "find flights", "agent": "search", "tools": ["fetch"], "parallel": true}`` is
one step; ``"find flights"`` is the same step with no agent (its ``[TYPE]`` tag, or the
default executor, decides), no tools named and not parallel. Consecutive steps marked
``parallel`` run together, as a zip of their executors (:class:`~dflow_agents.PlanningFlow`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

import dflow

__all__ = [
    "MAX_PLAN_STEPS",
    "MAX_STEP_CHARS",
    "PlanningError",
    "StepDetail",
    "check_step_items",
    "executor_key",
    "routing_problem",
    "shown",
    "step_flow",
    "step_tag",
]

MAX_PLAN_STEPS = 100  #: steps a plan may have
MAX_STEP_CHARS = 2_000
_TAG = re.compile(r"\s*\[([A-Za-z0-9_-]{1,64})\]\s*")
_STEP_KEYS = ("step", "agent", "tools", "parallel")


class PlanningError(ValueError):
    """A planning command that cannot be carried out; the message says what to change."""


class StepDetail(BaseModel):
    """Who carries out a step, with what, and whether it runs beside its neighbours."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent: str | None = None  #: the name (or tag) of the flow's agent that does it; None: its tag decides
    tools: tuple[str, ...] = ()  #: the tools it should use, by name; empty: any of its agent's
    parallel: bool = False  #: consecutive parallel steps run together

    def text(self) -> str:
        """What the plan's text shows after the step: `` (agent: a, tools: t, parallel)``."""
        parts = [f"agent: {self.agent}"] if self.agent else []
        parts += [f"tools: {', '.join(self.tools)}"] if self.tools else []
        parts += ["parallel"] if self.parallel else []
        return f" ({'; '.join(parts)})" if parts else ""


dflow.register_model(StepDetail)


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut at ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_step_items(steps: object) -> tuple[list[str], list[StepDetail]]:
    """The texts and details of ``steps`` (1 to ``MAX_PLAN_STEPS`` texts or step objects),
    else :class:`PlanningError` saying which step is wrong and how."""
    if isinstance(steps, str) or not isinstance(steps, Sequence) or not steps:
        raise PlanningError(
            f"steps must be a non-empty list of texts, one per step, got {shown(steps)}: "
            'for example ["Find the flights", "Book a hotel"]'
        )
    if len(steps) > MAX_PLAN_STEPS:
        raise PlanningError(
            f"the plan has {len(steps)} steps; a plan has at most {MAX_PLAN_STEPS}: merge some"
        )
    texts, details = [], []
    for i, item in enumerate(steps):
        text, detail = _item(i, item)
        texts.append(text)
        details.append(detail)
    return texts, details


def _item(i: int, item: object) -> tuple[str, StepDetail]:
    detail = StepDetail()
    if isinstance(item, Mapping):
        unknown = sorted(str(k) for k in item if k not in _STEP_KEYS)
        if unknown:
            raise PlanningError(
                f"step {i} has the keys {', '.join(unknown)}, which a step does not take: "
                f"a step is a text or an object with {', '.join(_STEP_KEYS)}"
            )
        detail = _detail(i, {k: v for k, v in item.items() if k != "step" and v is not None})
        item = item.get("step")
    if not isinstance(item, str) or not item.strip():
        raise PlanningError(f"step {i} is {shown(item)}; every step is a non-empty text")
    if len(item) > MAX_STEP_CHARS:
        raise PlanningError(f"step {i} is {len(item)} characters long; make it at most {MAX_STEP_CHARS}")
    return item.strip(), detail


def _detail(i: int, fields: dict[str, Any]) -> StepDetail:
    tools = fields.get("tools", ())
    if isinstance(tools, str) or not isinstance(tools, Sequence):
        raise PlanningError(f"the tools of step {i} are {shown(tools)}: give a list of tool names")
    try:
        return StepDetail.model_validate({**fields, "tools": tuple(tools)}, strict=False)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise PlanningError(
            f"step {i} is not accepted ({wrong}): agent is a name, tools a list of names, parallel true or false"
        ) from None


def step_tag(step: str) -> tuple[str | None, str]:
    """The ``[TYPE]`` tag at the start of a step's text (lowercased) and the text without it:
    ``step_tag("[SEARCH] find flights") == ("search", "find flights")``."""
    found = _TAG.match(step)
    if found is None:
        return None, step
    return found.group(1).lower(), step[found.end() :]


def executor_key(text: str, detail: StepDetail, agents: Mapping[str, Any], default: str) -> str:
    """The key of the agent that carries out a step: the agent it names, else the agent
    its ``[TYPE]`` tag names, else ``default``."""
    if detail.agent is not None:
        return detail.agent.lower()
    tag, _ = step_tag(text)
    return tag if tag is not None and tag in agents else default


def step_flow(agent: Any, prompt: str, detail: StepDetail, session: str | None) -> Any:
    """The flow of ``agent`` carrying out a step (told by ``prompt``): offered only the
    tools the step names, when it names some (a call of another is an error it reads)."""
    if not detail.tools:
        return agent.flow(prompt, session=session)
    return agent.flow(prompt, session=session, tools=list(detail.tools))


def routing_problem(
    texts: Sequence[str], details: Sequence[StepDetail], agents: Mapping[str, Any], default: str
) -> str | None:
    """What is wrong with the agents and tools the steps name, given the flow's ``agents``
    (by lowercased key) and the key of its default agent; ``None`` when every name is known."""
    for i, (text, detail) in enumerate(zip(texts, details)):
        key = executor_key(text, detail, agents, default)
        agent = agents.get(key)
        if agent is None:
            return (
                f"step {i} ({text[:60]!r}) names the agent {shown(detail.agent, 66)}, which is not one "
                f"of the agents: {', '.join(agents)}"
            )
        known = list(getattr(agent, "tools", {}) or {})
        unknown = [t for t in detail.tools if t not in known]
        if unknown:
            return (
                f"step {i} ({text[:60]!r}) names the tools {', '.join(shown(t, 66) for t in unknown)}, "
                f"which the agent {key!r} does not have: its tools are {', '.join(known) or 'none'}"
            )
    return None
