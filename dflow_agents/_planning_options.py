"""The settings of a :class:`~dflow_agents.PlanningFlow`: its prompts, its default step
prompt and :class:`PlanningOptions` (public from :mod:`dflow_agents.planning`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping

from .options import positive_int
from .plans import Plan, PlanDraft, default_plan, step_tag

__all__ = [
    "DIRECT_ANSWER_PROMPT",
    "FINALIZE_PROMPT",
    "PLANNER_PROMPT",
    "PlanningOptions",
    "StepPrompt",
    "default_step_prompt",
]

#: What the planner is told by default.
PLANNER_PROMPT = (
    "You are a planning assistant. Make a concise plan of clear, actionable steps for the user's "
    "task: the key milestones, not small sub-steps, each one something a single agent can do. "
    "Create it by calling the planning tool with the command 'create', a title and the steps."
)

#: What the planner is also told when it may answer without a plan.
DIRECT_ANSWER_PROMPT = (
    "If the request needs no plan (a greeting, a question you can answer at once), do not call "
    "the planning tool: answer the user directly."
)

#: What the finalizer is told by default.
FINALIZE_PROMPT = (
    "You are a planning assistant. A plan has been carried out for the user's request. From the "
    "plan and the results of its steps, write the answer for the user: the outcome, what was "
    "found or done, and what is still open."
)


StepPrompt = Callable[[str, Plan, int], "str | Awaitable[str]"]


def default_step_prompt(request: str, plan: Plan, index: int) -> str:
    """What an executor is told: the plan as it stands, the request, and the one step to do."""
    _, text = step_tag(plan.steps[index])
    tools = plan.step_details[index].tools
    use = f"Use these tools for it: {', '.join(tools)}. " if tools else ""
    return (
        f"CURRENT PLAN STATUS:\n{plan.text()}\n"
        f"THE USER'S REQUEST (for context):\n{request}\n\n"
        f'YOUR CURRENT TASK:\nYou are now working on step {index}: "{text}"\n\n'
        f"Do only this step, with the tools you have. {use}When it is done, answer with a short summary "
        "of what you did and what you found."
    )


@dataclasses.dataclass(frozen=True)
class PlanningOptions:
    """How a :class:`PlanningFlow` plans, gives out and words its steps.

    Args:
        default_executor: the tag of the executor of untagged steps (default: the first).
        descriptions: what each executor does (by tag), told to the planner so it tags
            the steps.
        planner_prompt / finalize_prompt: the system prompts of those calls.
        step_prompt: ``fn(request, plan, index) -> str`` (sync or async), the executor's task.
        default_plan: ``fn(request) -> PlanDraft``, the plan when the planner makes none.
        plan_attempts: planner replies before the default plan is used (a failed planning
            call goes back to the planner as the observation).
        direct_answer: the planner may answer a request that needs no plan at once: a
            reply without a planning call is then the run's answer (one model call, no
            steps, ``source == "direct"``) instead of the default plan's.
    """

    default_executor: str | None = None
    descriptions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    planner_prompt: str = PLANNER_PROMPT
    finalize_prompt: str = FINALIZE_PROMPT
    step_prompt: StepPrompt = default_step_prompt
    default_plan: Callable[[str], PlanDraft] = default_plan
    plan_attempts: int = 3
    direct_answer: bool = False

    def __post_init__(self) -> None:
        if self.default_executor is not None and not isinstance(self.default_executor, str):
            raise TypeError(
                f"PlanningOptions.default_executor is a tag (str), got {self.default_executor!r:.80}"
            )
        if not isinstance(self.descriptions, Mapping):
            raise TypeError(f"PlanningOptions.descriptions maps tags to text, got {self.descriptions!r:.80}")
        object.__setattr__(
            self, "descriptions", {str(k).lower(): str(v) for k, v in self.descriptions.items()}
        )
        for what in ("step_prompt", "default_plan"):
            if not callable(getattr(self, what)):
                raise TypeError(f"PlanningOptions.{what} must be callable, got {getattr(self, what)!r:.80}")
        positive_int("PlanningOptions.plan_attempts", self.plan_attempts)
        if not isinstance(self.direct_answer, bool):
            raise TypeError(f"PlanningOptions.direct_answer is True or False, got {self.direct_answer!r:.80}")

    def routed(self, executors: Mapping[str, object]) -> str:
        """The tag of the default executor among ``executors``; ``ValueError`` when the
        default or a description names a tag that is not there."""
        unknown = sorted(set(self.descriptions) - set(executors))
        if unknown:
            raise ValueError(f"descriptions name executors that do not exist: {', '.join(unknown)}")
        if self.default_executor is None:
            return next(iter(executors))
        if self.default_executor.lower() not in executors:
            raise ValueError(
                f"default_executor {self.default_executor!r} is not one of the executors' tags: "
                f"{', '.join(executors)}"
            )
        return self.default_executor.lower()
