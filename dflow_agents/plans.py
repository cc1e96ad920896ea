"""Plans of steps, kept in a run's data, and how a planning run went.

A :class:`Plan` is a title and a list of steps, each with a status (:class:`PlanStepStatus`)
and notes. :class:`PlanBook` keeps the plans of one run in the run's data (one key per plan,
and the id of the active plan), so any worker that runs a later step of the run continues
them, and two runs never see each other's plans; its :meth:`~PlanBook.execute` runs the
commands of the ``planning`` tool (:mod:`dflow_agents.plan_tool`). :func:`format_plan`
renders a plan in OpenManus's text layout (title, progress, status counts, one line per step
with its mark). A :class:`PlanDraft` is a plan to run as it is (from a template, say);
:class:`PlanningResult` and :class:`StepResult` say how a :class:`~dflow_agents.PlanningFlow`
run went.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

import dflow
from dflow import ContextStack

from ._plan_steps import (
    MAX_PLAN_STEPS,
    PlanningError,
    StepDetail,
    check_step_items,
    step_tag,
)
from ._plan_steps import shown as _shown
from .agent import AgentStatus
from .messages import Usage

__all__ = [
    "MAX_PLAN_STEPS",
    "Plan",
    "PlanBook",
    "PlanDraft",
    "PlanStepStatus",
    "PlanningError",
    "PlanningResult",
    "StepDetail",
    "StepResult",
    "default_plan",
    "format_plan",
    "step_tag",
]

MAX_PLANS = 50  # plans a run may hold
MAX_TITLE_CHARS = 500
MAX_NOTE_CHARS = 4_000

_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
_PLAN_KEY = "dflow_agents/plan/"  # + plan id: the plan
_ACTIVE_KEY = "dflow_agents/plan-active"  # the id of the active plan
_COMMANDS = ("create", "update", "list", "get", "set_active", "mark_step", "delete")


class PlanStepStatus(str, Enum):
    """Where a step of a plan stands, and its mark in the plan's text."""

    NOT_STARTED = "not_started"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    BLOCKED = "blocked"

    @property
    def mark(self) -> str:
        """``[ ]``, ``[→]``, ``[✓]`` or ``[!]``."""
        return _MARKS[self]

    @property
    def active(self) -> bool:
        """Whether the step is still to do (not started or in progress)."""
        return self in (PlanStepStatus.NOT_STARTED, PlanStepStatus.IN_PROGRESS)


_MARKS = {
    PlanStepStatus.NOT_STARTED: "[ ]",
    PlanStepStatus.IN_PROGRESS: "[→]",
    PlanStepStatus.COMPLETED: "[✓]",
    PlanStepStatus.BLOCKED: "[!]",
}


class Plan(BaseModel):
    """A plan: an id, a title, and its steps with their statuses, notes and details (who
    does each, with what tools, whether in parallel): lists of the same length. Frozen:
    change one with :meth:`with_step` or ``model_copy``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_id: str
    title: str
    steps: list[str]
    step_statuses: list[PlanStepStatus] = Field(default_factory=list)
    step_notes: list[str] = Field(default_factory=list)
    step_details: list[StepDetail] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _fresh(cls, data: Any) -> Any:
        """A plan given only its steps starts with every step not started, without notes
        (and without details, unless given)."""
        if isinstance(data, dict) and isinstance(data.get("steps"), list):
            n = len(data["steps"])
            if "step_statuses" not in data and "step_notes" not in data:
                data = {**data, "step_statuses": [PlanStepStatus.NOT_STARTED] * n, "step_notes": [""] * n}
            if not data.get("step_details"):
                data = {**data, "step_details": [StepDetail()] * n}
        return data

    @model_validator(mode="after")
    def _same_lengths(self) -> Plan:
        n = len(self.steps)
        if {len(self.step_statuses), len(self.step_notes), len(self.step_details)} != {n}:
            raise ValueError(
                f"a plan has one status and one note per step, and one detail: {n} steps, "
                f"{len(self.step_statuses)} statuses, {len(self.step_notes)} notes, "
                f"{len(self.step_details)} details"
            )
        return self

    def count(self, status: PlanStepStatus) -> int:
        """How many steps have ``status``."""
        return sum(1 for s in self.step_statuses if s is status)

    def next_step(self) -> int | None:
        """The index of the first step still to do (not started or in progress), or ``None``."""
        return next((i for i, s in enumerate(self.step_statuses) if s.active), None)

    def parallel_group(self, index: int) -> list[int]:
        """``index`` and the steps still to do right after it that run with it: the run of
        consecutive steps marked parallel it starts (just ``[index]`` when it is not)."""
        group = [index]
        while self.step_details[group[-1]].parallel and group[-1] + 1 < len(self.steps):
            after = group[-1] + 1
            if not (self.step_details[after].parallel and self.step_statuses[after].active):
                break
            group.append(after)
        return group

    def with_step(self, index: int, status: PlanStepStatus | None = None, notes: str | None = None) -> Plan:
        """A copy with step ``index`` given a new status and/or notes."""
        statuses, all_notes = list(self.step_statuses), list(self.step_notes)
        if status is not None:
            statuses[index] = status
        if notes is not None:
            all_notes[index] = notes
        return self.model_copy(update={"step_statuses": statuses, "step_notes": all_notes})

    def text(self) -> str:
        """The plan in OpenManus's text layout (see :func:`format_plan`)."""
        return format_plan(self)


dflow.register_model(Plan)


class PlanDraft(BaseModel):
    """A plan to run as it is (no planning model call): its title and steps, and the
    request it serves (the title when empty). ``template`` names the template it came
    from (``name@version``), if any."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    steps: list[str]
    request: str = ""
    template: str | None = None

    @model_validator(mode="after")
    def _checked(self) -> PlanDraft:
        try:
            check_title(self.title)
            check_steps(self.steps)
        except PlanningError as exc:
            raise ValueError(str(exc)) from None
        return self


dflow.register_model(PlanDraft)


def default_plan(request: str) -> PlanDraft:
    """The plan used when the planner makes none: analyse, execute, verify."""
    title = f"Plan for: {request[:50]}{'...' if len(request) > 50 else ''}"
    return PlanDraft(
        title=title, steps=["Analyze the request", "Execute the task", "Verify the results"], request=request
    )


def format_plan(plan: Plan) -> str:
    """``plan`` as text: the title line (underlined), ``Progress: x/y steps completed
    (z%)``, the count of each status, then one line per step with its mark (``[✓]``
    completed, ``[→]`` in progress, ``[!]`` blocked, ``[ ]`` not started) and its notes."""
    head = f"Plan: {plan.title} (ID: {plan.plan_id})\n"
    total = len(plan.steps)
    done = plan.count(PlanStepStatus.COMPLETED)
    percent = f"{done / total * 100:.1f}%" if total else "0%"
    lines = [
        head + "=" * len(head) + "\n",
        f"Progress: {done}/{total} steps completed ({percent})",
        (
            f"Status: {done} completed, {plan.count(PlanStepStatus.IN_PROGRESS)} in progress, "
            f"{plan.count(PlanStepStatus.BLOCKED)} blocked, "
            f"{plan.count(PlanStepStatus.NOT_STARTED)} not started\n"
        ),
        "Steps:",
    ]
    rows = zip(plan.steps, plan.step_statuses, plan.step_notes, plan.step_details)
    for i, (step, status, notes, detail) in enumerate(rows):
        lines.append(f"{i}. {status.mark} {step}{detail.text()}")
        if notes:
            lines.append(f"   Notes: {notes}")
    return "\n".join(lines) + "\n"


def check_plan_id(plan_id: object) -> str:
    """``plan_id`` if it is a valid plan id, else :class:`PlanningError` saying why."""
    if not isinstance(plan_id, str) or _ID.fullmatch(plan_id) is None:
        raise PlanningError(
            f"plan_id {_shown(plan_id)} is not accepted: use 1-64 letters, digits and _ . : @ - "
            "(for example 'trip_plan')"
        )
    return plan_id


def check_title(title: object) -> str:
    """``title`` if it is a non-empty text within the limit."""
    if not isinstance(title, str) or not title.strip():
        raise PlanningError("the plan needs a title: a short non-empty text")
    if len(title) > MAX_TITLE_CHARS:
        raise PlanningError(f"the title is {len(title)} characters long; make it at most {MAX_TITLE_CHARS}")
    return title.strip()


def check_steps(steps: object) -> list[str]:
    """The texts of ``steps`` if they are 1 to ``MAX_PLAN_STEPS`` non-empty texts (or step
    objects, see :mod:`dflow_agents._plan_steps`) within the limit."""
    return check_step_items(steps)[0]


def _check_status(status: object) -> PlanStepStatus:
    try:
        return PlanStepStatus(status)
    except ValueError:
        allowed = ", ".join(s.value for s in PlanStepStatus)
        raise PlanningError(f"step_status {_shown(status)} is not one of: {allowed}") from None


class PlanBook:
    """The plans of one run, read and written through a step's ``ctx`` (or read from
    ``run.context()``): one key per plan, and the active plan's id.

    Each method that changes a plan writes it back at once; the writes commit with the
    step. :meth:`execute` runs a ``planning`` command and returns the text for the model,
    or raises :class:`PlanningError`.
    """

    def __init__(self, ctx: ContextStack) -> None:
        self.ctx = ctx

    def get(self, plan_id: str) -> Plan | None:
        """The plan ``plan_id``, or ``None``."""
        data = self.ctx.get(_PLAN_KEY + plan_id)
        return None if data is None else Plan.model_validate(data)

    def ids(self) -> list[str]:
        """The ids of the run's plans, sorted."""
        return sorted(k[len(_PLAN_KEY) :] for k in self.ctx.keys() if k.startswith(_PLAN_KEY))

    @property
    def active(self) -> str | None:
        """The id of the active plan (``None`` when there is none, or it was deleted)."""
        plan_id = self.ctx.get(_ACTIVE_KEY)
        return plan_id if isinstance(plan_id, str) and (_PLAN_KEY + plan_id) in self.ctx else None

    def put(self, plan: Plan) -> Plan:
        """Store ``plan`` (a new one or a new version of one)."""
        self.ctx.put(_PLAN_KEY + plan.plan_id, plan.model_dump(mode="json"))
        return plan

    def require(self, plan_id: str | None, command: str) -> Plan:
        """The plan ``plan_id`` (the active plan when ``None``), or :class:`PlanningError`."""
        if plan_id is None:
            plan_id = self.active
            if plan_id is None:
                raise PlanningError(
                    f"the command '{command}' got no plan_id and no plan is active: give the plan_id"
                    + (
                        f" (the plans are: {', '.join(self.ids())})"
                        if self.ids()
                        else ", or create a plan first"
                    )
                )
        plan = self.get(check_plan_id(plan_id))
        if plan is None:
            known = self.ids()
            raise PlanningError(
                f"there is no plan with ID {plan_id!r}: "
                + (
                    f"the plans are: {', '.join(known)}"
                    if known
                    else "there are no plans yet, create one first"
                )
            )
        return plan

    # -- the commands ----------------------------------------------------------------------

    def create(self, plan_id: str | None, title: str | None, steps: Sequence[str] | None) -> Plan:
        """A new plan, all its steps not started; it becomes the active plan."""
        if plan_id is None:
            raise PlanningError("the command 'create' needs a plan_id: a short name such as 'trip_plan'")
        check_plan_id(plan_id)
        if self.get(plan_id) is not None:
            raise PlanningError(
                f"a plan with ID {plan_id!r} already exists: use the command 'update' to change it, "
                "or create the new plan under another plan_id"
            )
        if len(self.ids()) >= MAX_PLANS:
            raise PlanningError(
                f"this run already holds {MAX_PLANS} plans: delete one before creating another"
            )
        texts, details = check_step_items(steps)
        plan = Plan(plan_id=plan_id, title=check_title(title), steps=texts, step_details=details)
        self.put(plan)
        self.ctx.put(_ACTIVE_KEY, plan_id)
        return plan

    def update(self, plan_id: str | None, title: str | None, steps: Sequence[str] | None) -> Plan:
        """A new title and/or steps; a step whose text is unchanged at its index keeps its
        status and notes, the others start afresh."""
        plan = self.require(plan_id, "update")
        if title is None and steps is None:
            raise PlanningError("the command 'update' needs a new title or new steps (or both)")
        update: dict[str, Any] = {}
        if title is not None:
            update["title"] = check_title(title)
        if steps is not None:
            new, details = check_step_items(steps)
            kept = [i < len(plan.steps) and plan.steps[i] == s for i, s in enumerate(new)]
            update["steps"] = new
            update["step_details"] = details
            update["step_statuses"] = [
                plan.step_statuses[i] if k else PlanStepStatus.NOT_STARTED for i, k in enumerate(kept)
            ]
            update["step_notes"] = [plan.step_notes[i] if k else "" for i, k in enumerate(kept)]
        return self.put(Plan.model_validate({**plan.model_dump(), **update}))

    def mark_step(
        self, plan_id: str | None, step_index: int | None, step_status: str | None, step_notes: str | None
    ) -> Plan:
        """Set the status and/or the notes of step ``step_index``."""
        plan = self.require(plan_id, "mark_step")
        if step_index is None:
            raise PlanningError("the command 'mark_step' needs step_index: the step's number, from 0")
        n = len(plan.steps)
        if isinstance(step_index, bool) or not isinstance(step_index, int) or not 0 <= step_index < n:
            raise PlanningError(
                f"step_index {_shown(step_index)} is out of range: plan {plan.plan_id!r} has {n} "
                f"steps, numbered 0 to {len(plan.steps) - 1}"
            )
        if step_status is None and step_notes is None:
            raise PlanningError("the command 'mark_step' needs step_status or step_notes (or both)")
        status = None if step_status is None else _check_status(step_status)
        if step_notes is not None and len(step_notes) > MAX_NOTE_CHARS:
            raise PlanningError(
                f"step_notes is {len(step_notes)} characters long; make it at most {MAX_NOTE_CHARS}"
            )
        return self.put(plan.with_step(step_index, status, step_notes))

    def set_active(self, plan_id: str | None) -> Plan:
        """Make ``plan_id`` the active plan."""
        if plan_id is None:
            raise PlanningError("the command 'set_active' needs the plan_id of the plan to make active")
        plan = self.require(plan_id, "set_active")
        self.ctx.put(_ACTIVE_KEY, plan.plan_id)
        return plan

    def delete(self, plan_id: str | None) -> None:
        """Delete the plan ``plan_id`` (no longer active if it was)."""
        if plan_id is None:
            raise PlanningError("the command 'delete' needs the plan_id of the plan to delete")
        plan = self.require(plan_id, "delete")
        self.ctx.delete(_PLAN_KEY + plan.plan_id)
        if self.ctx.get(_ACTIVE_KEY) == plan.plan_id:
            self.ctx.delete(_ACTIVE_KEY)

    def listing(self) -> str:
        """Each plan with its progress, the active one marked."""
        ids = self.ids()
        if not ids:
            return "There are no plans yet: create one with the command 'create'."
        active = self.active
        lines = ["Plans:"]
        for plan_id in ids:
            plan = self.get(plan_id)
            assert plan is not None
            mark = " (active)" if plan_id == active else ""
            done = plan.count(PlanStepStatus.COMPLETED)
            lines.append(f"• {plan_id}{mark}: {plan.title} - {done}/{len(plan.steps)} steps completed")
        return "\n".join(lines)

    def execute(self, command: str, arguments: Mapping[str, Any] | None = None) -> str:
        """Run the ``planning`` command ``command`` with ``arguments`` (``plan_id``,
        ``title``, ``steps``, ``step_index``, ``step_status``, ``step_notes``); the text the
        model reads. Raises :class:`PlanningError`."""
        args = dict(arguments or {})
        plan_id = args.get("plan_id")
        if command == "create":
            plan = self.create(plan_id, args.get("title"), args.get("steps"))
            return f"Plan {plan.plan_id!r} created; it is the active plan.\n\n{format_plan(plan)}"
        if command == "update":
            plan = self.update(plan_id, args.get("title"), args.get("steps"))
            return f"Plan {plan.plan_id!r} updated.\n\n{format_plan(plan)}"
        if command == "list":
            return self.listing()
        if command == "get":
            return format_plan(self.require(plan_id, "get"))
        if command == "set_active":
            plan = self.set_active(plan_id)
            return f"Plan {plan.plan_id!r} is now the active plan.\n\n{format_plan(plan)}"
        if command == "mark_step":
            index = args.get("step_index")
            plan = self.mark_step(plan_id, index, args.get("step_status"), args.get("step_notes"))
            return f"Step {index} of plan {plan.plan_id!r} updated.\n\n{format_plan(plan)}"
        if command == "delete":
            self.delete(plan_id)
            return f"Plan {plan_id!r} deleted."
        raise PlanningError(f"unknown command {_shown(command)}: the commands are {', '.join(_COMMANDS)}")


# -- how a planning run went ---------------------------------------------------------------


class StepResult(BaseModel):
    """How one step of a plan went: which executor ran it and how its agent ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int  #: the step's number in the plan, from 0
    step: str  #: the step's text
    executor: str  #: the executors' key of the agent that ran it
    agent: str  #: that agent's name
    status: AgentStatus  #: how the agent's run ended
    answer: str = ""
    reason: str = ""


class PlanningResult(BaseModel):
    """How a planning run ended: FINISHED (every step run, then summarised), TERMINATED (an
    executor gave up and the plan was aborted) or ERROR (no plan could be made)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: AgentStatus
    answer: str = ""  #: the finalizer's summary; for an aborted plan, the executor's conclusion
    reason: str = ""  #: why the run ended as it did, in a sentence
    plan: Plan | None = None
    plan_text: str = ""  #: the plan as text, with each step's mark and notes
    steps: list[StepResult] = Field(default_factory=list)  #: the steps run, in order
    source: Literal["model", "default", "given", "template", "direct"] = "model"
    """where the plan came from; ``"direct"``: the planner answered without a plan"""
    template: str | None = None  #: ``name@version`` of the template it came from
    usage: Usage = Field(default_factory=Usage)  #: tokens of the planner, the executors and the finalizer
    session: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every step was run and the plan summarised (FINISHED)."""
        return self.status is AgentStatus.FINISHED


dflow.register_model(StepResult)
dflow.register_model(PlanningResult)
