"""Plan templates: a plan saved by name and version, run again with new parameters.

A :class:`PlanTemplate` is a plan whose request, title and steps may hold placeholders such
as ``{userRequirement}`` (``{{`` and ``}}`` stand for literal braces). :meth:`PlanTemplate.fill`
replaces them with the parameters of a new run, giving a :class:`~dflow_agents.PlanDraft`
that a :class:`~dflow_agents.PlanningFlow` runs without asking its planner; a missing or an
unknown parameter is an error that names it. :meth:`PlanTemplate.from_plan` makes a template
of a plan a run made, its parameters' values turned back into placeholders.

A :class:`PlanTemplates` store keeps each name's versions (numbered from 1, the latest by
default): :class:`InMemoryPlanTemplates` for local mode and tests, :class:`RedisPlanTemplates`
for a deployment. Both are async, like :class:`~dflow_agents.ChatMemory`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import pydantic
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ._versions import NAME, InMemoryVersions, RedisVersions
from .plans import Plan, PlanDraft, PlanningError, check_steps, check_title

__all__ = [
    "InMemoryPlanTemplates",
    "PlanTemplate",
    "PlanTemplateNotFoundError",
    "PlanTemplates",
    "RedisPlanTemplates",
]

_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
MAX_REQUEST_CHARS = 8_000
MAX_VALUE_CHARS = 4_000


class PlanTemplateNotFoundError(LookupError):
    """No template of that name (or no such version of it) is stored."""


def _placeholders(text: str) -> set[str]:
    return {m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1)}


def _substitute(text: str, values: Mapping[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "{{":
            return "{"
        if m.group(0) == "}}":
            return "}"
        return values[m.group(1)]

    return _PLACEHOLDER.sub(one, text)  # one pass: a value's own braces are left as they are


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


class PlanTemplate(BaseModel):
    """A plan to run again: a name, a version (0 until a store saves it), a title and
    steps, and the request they serve (the title when empty), each with ``{parameter}``
    placeholders."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int = 0
    title: str
    steps: list[str]
    request: str = ""
    description: str = ""  #: what the template is for (for people; the models do not see it)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if NAME.fullmatch(name) is None:
            raise ValueError(
                f"template name {name!r:.80} is not accepted: use 1-64 letters, digits and _ . : @ -"
            )
        return name

    @model_validator(mode="after")
    def _checked(self) -> PlanTemplate:
        try:
            check_title(self.title)
            check_steps(self.steps)
        except PlanningError as exc:
            raise ValueError(str(exc)) from None
        if len(self.request) > MAX_REQUEST_CHARS:
            raise ValueError(
                f"the request is {len(self.request)} characters long; at most {MAX_REQUEST_CHARS}"
            )
        if self.version < 0:
            raise ValueError(f"version is a number from 1 (0: not saved yet), got {self.version}")
        return self

    @property
    def parameters(self) -> list[str]:
        """The names of its placeholders, sorted."""
        return sorted(set().union(*(_placeholders(t) for t in (self.request, self.title, *self.steps))))

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    def fill(self, parameters: Mapping[str, str]) -> PlanDraft:
        """The plan with every placeholder replaced; ``ValueError`` names the parameters
        missing or unknown (``TypeError``: a value that is not text)."""
        if not isinstance(parameters, Mapping):
            raise TypeError(f"parameters are a mapping of name to text, got {type(parameters).__qualname__}")
        missing = sorted(set(self.parameters) - set(parameters))
        unknown = sorted(set(parameters) - set(self.parameters))
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"missing {', '.join(missing)}")
            if unknown:
                problems.append(f"unknown {', '.join(map(str, unknown))}")
            wants = ", ".join(self.parameters) or "none"
            raise ValueError(f"template {self.ref!r} takes the parameters: {wants}; {' and '.join(problems)}")
        for key, value in parameters.items():
            if not isinstance(value, str):
                raise TypeError(f"parameter {key!r} is a {type(value).__qualname__}; parameters are text")
            if len(value) > MAX_VALUE_CHARS:
                raise ValueError(
                    f"parameter {key!r} is {len(value)} characters long; at most {MAX_VALUE_CHARS}"
                )
        try:
            return PlanDraft(
                title=_substitute(self.title, parameters),
                steps=[_substitute(s, parameters) for s in self.steps],
                request=_substitute(self.request, parameters),
                template=self.ref,
            )
        except pydantic.ValidationError as exc:
            raise ValueError(
                f"template {self.ref!r} filled with these parameters is not a valid plan: "
                f"{exc.errors(include_url=False)[0]['msg']}"
            ) from None

    @classmethod
    def from_plan(
        cls,
        name: str,
        plan: Plan | PlanDraft,
        parameters: Mapping[str, str] | None = None,
        *,
        request: str = "",
        description: str = "",
    ) -> PlanTemplate:
        """A template of ``plan``: each value of ``parameters`` found in its title and steps
        (and in ``request``) becomes that parameter's placeholder, e.g.
        ``from_plan("trip", plan, {"city": "Lisbon"})``; braces already there stay literal."""
        values = dict(parameters or {})
        for key, value in values.items():
            if _PARAM.fullmatch(key) is None:
                raise ValueError(
                    f"parameter name {key!r:.80} is not accepted: a letter or _, then letters, digits, _"
                )
            if not isinstance(value, str) or not value:
                raise ValueError(f"parameter {key!r} must name the text to replace, got {value!r:.80}")
        # One pass over the text, the longest values first: a value inside another is not
        # replaced in it, nor in a placeholder already written, so filling the template with
        # the same values gives the plan back.
        key_of = {_escape(v): k for k, v in sorted(values.items(), key=lambda kv: len(kv[1]))}
        pattern = (
            re.compile("|".join(re.escape(v) for v in sorted(key_of, key=len, reverse=True)))
            if key_of
            else None
        )

        def template(text: str) -> str:
            out = _escape(text)
            if pattern is None:
                return out
            return pattern.sub(lambda m: "{" + key_of[m.group(0)] + "}", out)

        if not request and isinstance(plan, PlanDraft):
            request = plan.request
        return cls(
            name=name,
            title=template(plan.title),
            steps=[template(s) for s in plan.steps],
            request=template(request),
            description=description,
        )


@runtime_checkable
class PlanTemplates(Protocol):
    """Where plan templates are kept, by name and version (async)."""

    async def save(self, template: PlanTemplate) -> PlanTemplate:
        """Store ``template`` as the next version of its name; the template as stored."""
        ...

    async def get(self, name: str, version: int | None = None) -> PlanTemplate:
        """Version ``version`` of template ``name`` (the latest when ``None``);
        :class:`PlanTemplateNotFoundError` when there is none."""
        ...

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``, oldest first (``[]``: none)."""
        ...

    async def names(self) -> list[str]:
        """The names that have templates, sorted."""
        ...

    async def delete(self, name: str) -> bool:
        """Forget every version of ``name``; False when there was none."""
        ...


class InMemoryPlanTemplates(InMemoryVersions[PlanTemplate]):
    """Templates in this process's memory, the last ``max_versions`` of each name."""

    item = PlanTemplate
    kind = "plan template"
    short = "template"
    not_found = PlanTemplateNotFoundError
    load_hint = "PlanningFlow.arun_template"


class RedisPlanTemplates(RedisVersions[PlanTemplate]):
    """Templates in Redis (redis-py's asyncio client), the last ``max_versions`` of each
    name: one hash per name, ``{prefix}:{<name>}`` (a field per version and ``latest``), and
    the set of names ``{prefix}:names``; ``prefix`` defaults to ``dflow-plan-templates``.

    ``url_or_client`` is a ``redis://`` URL (each event loop gets its own client; ``options``
    go to ``redis.asyncio.Redis.from_url``) or a ``redis.asyncio.Redis`` client.
    """

    item = PlanTemplate
    kind = "plan template"
    short = "template"
    not_found = PlanTemplateNotFoundError
    load_hint = "PlanningFlow.arun_template"

    default_prefix = "dflow-plan-templates"
