"""Agents defined as data: a name, a prompt, tools by name and a model by name, stored and
versioned like plan templates, built into agents a :class:`~dflow_agents.PlanningFlow` gives
steps to.

An :class:`AgentDefinition` holds no code: :meth:`AgentDefinition.build` makes a
:class:`~dflow_agents.ToolCallAgent` of it from the models and tools a process has, by name,
and names what is missing when a definition asks for a model or a tool that is not there.
:func:`build_agents` builds several, keyed by name as a planning flow's executors, and
:func:`descriptions_of` gives what each does, for ``PlanningOptions(descriptions=...)``, so
the planner knows the agents it can name in a plan's steps. A store keeps each name's
versions: :class:`InMemoryAgentDefinitions`, :class:`RedisAgentDefinitions`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

import dflow

from ._versions import InMemoryVersions, RedisVersions
from .model import ChatModel
from .toolcall import DEFAULT_SYSTEM_PROMPT, ToolCallAgent
from .tools import Tool

__all__ = [
    "AgentDefinition",
    "AgentDefinitionNotFoundError",
    "InMemoryAgentDefinitions",
    "RedisAgentDefinitions",
    "build_agents",
    "descriptions_of",
]

MAX_PROMPT_CHARS = 20_000
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a planning flow's executor key


class AgentDefinitionNotFoundError(LookupError):
    """No agent definition of that name (or no such version of it) is stored."""


class AgentDefinition(BaseModel):
    """An agent as data: its name, what it does (told to a planner), its system prompt, its
    tools and its model, by name; ``version`` is 0 until a store saves it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int = 0
    description: str = ""
    prompt: str = DEFAULT_SYSTEM_PROMPT
    tools: tuple[str, ...] = ()
    model: str = "default"

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if _KEY.fullmatch(name) is None:  # a planning flow's executors are keyed by it
            raise ValueError(
                f"agent definition name {name!r:.80} is not accepted: use 1-64 letters, digits, _ and -"
            )
        return name

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt: str) -> str:
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"the prompt is {len(prompt)} characters long; make it at most {MAX_PROMPT_CHARS}"
            )
        return prompt

    @property
    def ref(self) -> str:
        """``name@version``."""
        return f"{self.name}@{self.version}"

    def build(
        self, *, models: Mapping[str, ChatModel], tools: Sequence[Tool] = (), **options: Any
    ) -> ToolCallAgent:
        """A ``ToolCallAgent`` named ``name@version``, with the model ``models[model]`` and
        the tools this definition names (from ``tools``); ``options`` go to the agent
        (``limits``, ``memory``...). ``ValueError`` names a model or tool that is missing."""
        model = models.get(self.model)
        if model is None:
            raise ValueError(
                f"agent definition {self.ref!r} names the model {self.model!r}, which is not among "
                f"the models: {', '.join(models) or 'none'}: pass it in models={{...}}"
            )
        by_name = {t.name: t for t in tools}
        missing = [t for t in self.tools if t not in by_name]
        if missing:
            raise ValueError(
                f"agent definition {self.ref!r} names the tools {', '.join(map(repr, missing))}, which are "
                f"not among the tools: {', '.join(by_name) or 'none'}: pass them in tools=[...]"
            )
        chosen = [by_name[t] for t in self.tools]
        return ToolCallAgent(self.ref, model, chosen, system_prompt=self.prompt, **options)


dflow.register_model(AgentDefinition)


def build_agents(
    definitions: Sequence[AgentDefinition], *, models: Mapping[str, ChatModel], tools: Sequence[Tool] = ()
) -> dict[str, ToolCallAgent]:
    """The agents of ``definitions`` keyed by name: a planning flow's executors."""
    names = [d.name.lower() for d in definitions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two agent definitions are named {twice[0]!r}: give each agent its own name")
    return {d.name: d.build(models=models, tools=tools) for d in definitions}


def descriptions_of(definitions: Sequence[AgentDefinition]) -> dict[str, str]:
    """What each agent does, by name, for ``PlanningOptions(descriptions=...)``."""
    return {d.name: d.description for d in definitions if d.description}


class InMemoryAgentDefinitions(InMemoryVersions[AgentDefinition]):
    """Agent definitions in this process's memory, the last ``max_versions`` of each name."""

    item = AgentDefinition
    kind = "agent definition"
    short = "agent definition"
    not_found = AgentDefinitionNotFoundError
    load_hint = "build the agents when the process starts"


class RedisAgentDefinitions(RedisVersions[AgentDefinition]):
    """Agent definitions in Redis, the last ``max_versions`` of each name (``prefix``
    defaults to ``dflow-agent-definitions``; see :class:`~dflow_agents.RedisPlanTemplates`
    for the keys and the arguments)."""

    item = AgentDefinition
    kind = "agent definition"
    short = "agent definition"
    not_found = AgentDefinitionNotFoundError
    load_hint = "build the agents when the process starts"

    default_prefix = "dflow-agent-definitions"
