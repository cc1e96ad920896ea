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

import json
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, runtime_checkable

import pydantic
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ._redis import LoopClients
from .plans import Plan, PlanDraft, PlanningError, check_steps, check_title

if TYPE_CHECKING:
    import redis.asyncio as aioredis

__all__ = [
    "InMemoryPlanTemplates",
    "PlanTemplate",
    "PlanTemplateNotFoundError",
    "PlanTemplates",
    "RedisPlanTemplates",
]

_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
MAX_REQUEST_CHARS = 8_000
MAX_VALUE_CHARS = 4_000
_DEFAULT_MAX_VERSIONS = 100


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
        if _NAME.fullmatch(name) is None:
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


def _check_name(name: object) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(
            f"template name {name!r:.80} is not accepted: use 1-64 letters, digits and _ . : @ -"
        )
    return name


def _check_version(version: object) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version is a number from 1 (None: the latest), got {version!r:.80}")
    return version


def _not_found(name: str, version: int | None, versions: list[int]) -> PlanTemplateNotFoundError:
    if not versions:
        return PlanTemplateNotFoundError(f"there is no plan template named {name!r}: save one first")
    return PlanTemplateNotFoundError(
        f"plan template {name!r} has no version {version}; its versions are {', '.join(map(str, versions))}"
    )


def _body(template: PlanTemplate) -> str:
    return template.model_dump_json(exclude={"version"})


def _load(body: str | bytes, version: int) -> PlanTemplate:
    return PlanTemplate.model_validate({**json.loads(body), "version": version})


def _refuse_pickle(obj: object) -> NoReturn:
    raise TypeError(
        f"{obj!r} cannot be pickled: load templates where the run starts (PlanningFlow.arun_template), "
        f'or declare the store with dflow.shared({type(obj).__name__}(...), "templates")'
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


class InMemoryPlanTemplates:
    """Templates in this process's memory, the last ``max_versions`` of each name."""

    def __init__(self, *, max_versions: int = _DEFAULT_MAX_VERSIONS) -> None:
        self.max_versions = _check_max_versions(max_versions)
        self._templates: dict[str, dict[int, str]] = {}
        self._latest: dict[str, int] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InMemoryPlanTemplates({len(self._templates)} names)"

    async def save(self, template: PlanTemplate) -> PlanTemplate:
        """Store ``template`` as the next version of its name."""
        body = _body(template)
        with self._lock:
            version = self._latest.get(template.name, 0) + 1
            self._latest[template.name] = version
            versions = self._templates.setdefault(template.name, {})
            versions[version] = body
            versions.pop(version - self.max_versions, None)
        return template.model_copy(update={"version": version})

    async def get(self, name: str, version: int | None = None) -> PlanTemplate:
        """Version ``version`` of ``name`` (the latest when ``None``)."""
        _check_name(name)
        _check_version(version)
        with self._lock:
            versions = self._templates.get(name, {})
            wanted = version if version is not None else max(versions, default=0)
            body = versions.get(wanted)
            if body is None:
                raise _not_found(name, version, sorted(versions))
        return _load(body, wanted)

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``."""
        _check_name(name)
        with self._lock:
            return sorted(self._templates.get(name, {}))

    async def names(self) -> list[str]:
        """The names that have templates."""
        with self._lock:
            return sorted(n for n, v in self._templates.items() if v)

    async def delete(self, name: str) -> bool:
        """Forget every version of ``name``."""
        _check_name(name)
        with self._lock:
            self._latest.pop(name, None)
            return bool(self._templates.pop(name, None))

    def __reduce__(self) -> NoReturn:
        _refuse_pickle(self)


def _check_max_versions(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_versions is how many versions of a name are kept, an int >= 1, got {n!r}")
    return n


# Stores a template as the next version of its name, and drops the version max_versions older.
# KEYS[1]: the name's hash (field 'latest', and one field per version). ARGV[1]: the template;
# ARGV[2]: max_versions. Returns the new version.
_SAVE = """
local v = redis.call('HINCRBY', KEYS[1], 'latest', 1)
redis.call('HSET', KEYS[1], tostring(v), ARGV[1])
local old = v - tonumber(ARGV[2])
if old > 0 then redis.call('HDEL', KEYS[1], tostring(old)) end
return v
"""


class RedisPlanTemplates:
    """Templates in Redis (redis-py's asyncio client), the last ``max_versions`` of each
    name: one hash per name, ``{prefix}:{<name>}`` (a field per version and ``latest``), and
    the set of names ``{prefix}:names``.

    ``url_or_client`` is a ``redis://`` URL (each event loop gets its own client; ``options``
    go to ``redis.asyncio.Redis.from_url``) or a ``redis.asyncio.Redis`` client.
    """

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        *,
        prefix: str = "dflow-plan-templates",
        max_versions: int = _DEFAULT_MAX_VERSIONS,
        **options: Any,
    ) -> None:
        if not isinstance(prefix, str) or _NAME.fullmatch(prefix) is None:
            raise ValueError(f"prefix must be 1 to 64 letters, digits and _ . : @ -, got {prefix!r:.80}")
        self.prefix = prefix
        self.max_versions = _check_max_versions(max_versions)
        self._redis = LoopClients("RedisPlanTemplates", url_or_client, options, {"save": _SAVE})

    def __repr__(self) -> str:
        return f"RedisPlanTemplates({self._redis.where!r}, prefix={self.prefix!r})"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{_check_name(name)}}}"

    async def save(self, template: PlanTemplate) -> PlanTemplate:
        """Store ``template`` as the next version of its name."""
        client, scripts = self._redis.get()
        body, key = _body(template), self._key(template.name)
        version = int(await scripts["save"](keys=[key], args=[body, self.max_versions]))
        await client.sadd(f"{self.prefix}:names", template.name)
        return template.model_copy(update={"version": version})

    async def get(self, name: str, version: int | None = None) -> PlanTemplate:
        """Version ``version`` of ``name`` (the latest when ``None``)."""
        key = self._key(name)
        _check_version(version)
        client, _ = self._redis.get()
        if version is None:
            latest = await client.hget(key, "latest")
            wanted = int(latest) if latest is not None else 0
        else:
            wanted = version
        body = await client.hget(key, str(wanted)) if wanted else None
        if body is None:
            raise _not_found(name, version, await self.versions(name))
        try:
            return _load(body, wanted)
        except (ValueError, pydantic.ValidationError) as exc:
            raise ValueError(
                f"plan template {name!r} version {wanted} at {key!r} is not a template ({exc}); "
                "something else "
                "wrote that key: delete it or use another prefix"
            ) from None

    async def versions(self, name: str) -> list[int]:
        """The stored versions of ``name``."""
        client, _ = self._redis.get()
        fields = await client.hkeys(self._key(name))
        return sorted(int(f) for f in fields if (f.decode() if isinstance(f, bytes) else f) != "latest")

    async def names(self) -> list[str]:
        """The names that have templates."""
        client, _ = self._redis.get()
        members = await client.smembers(f"{self.prefix}:names")
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)

    async def delete(self, name: str) -> bool:
        """Forget every version of ``name``."""
        client, _ = self._redis.get()
        deleted = int(await client.delete(self._key(name)))
        await client.srem(f"{self.prefix}:names", name)
        return deleted > 0

    async def aclose(self) -> None:
        """Close the client this store opened for the running event loop."""
        await self._redis.aclose()

    def __reduce__(self) -> NoReturn:
        _refuse_pickle(self)
