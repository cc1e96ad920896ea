"""What every agent shares: its states, its result, and how it runs as a flow.

An agent is a stateless object declared once per process (``dflow.shared`` under its name,
so flows that capture its methods carry the name, and each worker uses its own instance).
Everything a run changes lives in the run: the loop's state is the value passed from step
to step, and the conversation is written to the run's data under the agent's namespace,
one key per message batch, never rewritten, and declared there
(``dflow.declare_conversation``), so ``dflow inspect``, ``Run.tree()`` and the console
show each turn's thought, calls and observations in any process, one that does not
import the agent too.

A run of an agent is ``start`` (load the session's memory, record the task), then a tail
loop of turns that each subclass defines, then ``finish`` (append the conversation to the
session's memory, make the :class:`AgentResult`).
"""

from __future__ import annotations

import logging
import re
import uuid
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Mapping, Sequence
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

import dflow
from dflow import ContextStack, DFlow, Pipeline, Run

from ._snapshot_events import check_events
from ._window import estimate_tokens
from .longterm import LongTermMemory, check_user, facts_prompt
from .memory import ChatMemory, _check_session
from .messages import ChatMessage, Usage
from .options import LongTermRecall

__all__ = ["Agent", "AgentResult", "AgentStatus"]

log = logging.getLogger("dflow_agents.agent")

_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")


class AgentStatus(str, Enum):
    """Where an agent's run stands. A run starts RUNNING and ends in one of the other
    three: FINISHED (the task is done: ``terminate`` with ``success``, or an answer),
    TERMINATED (the agent gave up: ``terminate`` with ``failure``), ERROR (stopped by the
    framework: ``max_steps``, the loop guard, the token budget, a failing model)."""

    IDLE = "idle"
    RUNNING = "running"
    FINISHED = "finished"
    TERMINATED = "terminated"
    ERROR = "error"


class AgentResult(BaseModel):
    """How an agent's run ended: its status, its answer and why it stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: AgentStatus
    answer: str = ""  #: the final answer, or ``terminate``'s conclusion
    reason: str = ""  #: why the run stopped, in a sentence
    steps: int = 0  #: turns taken
    usage: Usage = Field(default_factory=Usage)  #: tokens used by every model call
    session: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the task was done (FINISHED)."""
        return self.status is AgentStatus.FINISHED


dflow.register_model(AgentResult)
dflow.register_model(Usage)

RUNNING = AgentStatus.RUNNING.value
_agents: dict[str, weakref.ref[Agent]] = {}  # by name: a second agent of a name replaces the first


def check_name(name: object, what: str = "agent") -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(
            f"{what} name {name!r} is not accepted: use 1-64 letters, digits and _ . : @ - "
            "(it names the agent's pipeline, its shared object and its keys in a run's data)"
        )
    return name


#: the key of a run's data naming the ``dflow serve`` session the run was started in (what
#: ``dflow.server.SESSION_KEY`` names; read here without importing the server)
SESSION_KEY = "dflow/session"


def share_once(
    registry: dict[str, weakref.ref[Any]],
    obj: object,
    name: str,
    shared_as: str,
    what: str,
    then: str,
    *,
    stacklevel: int,
) -> None:
    """Share ``obj`` by name (``dflow.shared(obj, shared_as)``), warning (``RuntimeWarning``)
    when it replaces a live object of the same ``name`` in ``registry``: flows naming it would
    reach only the second (``then`` says what that means)."""
    old = registry.get(name)
    if old is not None and old() is not None:
        warnings.warn(
            f"a second {what} named {name!r} replaces the first in this process: {then}",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    registry[name] = weakref.ref(obj)
    dflow.shared(obj, shared_as)


def check_session(session: object) -> str | None:
    """``session`` unless it is not a valid session name (``ValueError`` / ``TypeError``)."""
    if session is None:
        return None
    return _check_session(session)


def run_session(ctx: ContextStack, session: object) -> str | None:
    """The memory session a run may use: ``session``, checked, and for a run started through
    ``dflow serve`` only its own session's (``PermissionError`` for another: a client must
    not read or extend the memory of a session it does not hold the token of)."""
    session = check_session(session)
    owner = ctx.get(SESSION_KEY)
    if session is not None and owner is not None and session != owner:
        raise PermissionError(
            f"this run was started in server session {owner!r} and may not use the memory of session "
            f"{session!r}: leave the session out (or start the run with POST /agents/{{name}}/runs)"
        )
    return session


def run_user(ctx: ContextStack, user: object) -> str | None:
    """The user whose long-term memory a run may use: ``user``, checked; a run started
    through ``dflow serve`` may use only its own session's (``PermissionError``)."""
    if user is None:
        return None
    user = check_user(user)
    owner = ctx.get(SESSION_KEY)
    if owner is not None and user != owner:
        raise PermissionError(
            f"this run was started in server session {owner!r} and may not use the long-term memory of user "
            f"{user!r}: leave the user out, or name the session's own"
        )
    return user


def dump(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the JSON data a run stores."""
    return [m.model_dump(mode="json", exclude_defaults=True) for m in messages]


def load(data: Any) -> list[ChatMessage]:
    """Messages back from what ``dump`` stored."""
    return [ChatMessage.model_validate(m) for m in data or ()]


def usage_of(state: dict[str, Any]) -> Usage:
    return Usage.model_validate(state["usage"])


def add_usage(state: dict[str, Any], usage: Usage) -> None:
    u = state["usage"]
    total = usage.total_tokens or usage.prompt_tokens + usage.completion_tokens
    state["usage"] = {
        "prompt_tokens": u["prompt_tokens"] + usage.prompt_tokens,
        "completion_tokens": u["completion_tokens"] + usage.completion_tokens,
        "total_tokens": u["total_tokens"] + total,
    }


def stop(
    state: dict[str, Any], status: AgentStatus, reason: str, answer: str | None = None
) -> dict[str, Any]:
    """``state`` ended with ``status`` for ``reason``."""
    state["status"] = status.value
    state["reason"] = reason
    if answer is not None:
        state["answer"] = answer
    return state


class MessageCache:
    """The messages of a run's keys, read once per process.

    A conversation's keys are written once each (by the step that made them) and read by
    every later turn: caching what was *read* (committed data) saves decoding and
    validating the whole conversation again at each turn. Keys carry a per-invocation
    nonce, so a trace id used again by a later run cannot hit an old entry. Also keeps the
    token estimate of each cached message.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._entries: OrderedDict[str, tuple[ChatMessage, ...]] = OrderedDict()
        self._tokens: dict[int, int] = {}

    def read(self, ctx: ContextStack, key: str) -> tuple[ChatMessage, ...]:
        """The messages under ``key`` (``()`` when there is nothing)."""
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        data = ctx.get(key)
        if data is None:
            return ()  # not cached: it may be written later
        messages = tuple(load(data))
        for m in messages:
            self._tokens[id(m)] = estimate_tokens(m)
        self._entries[key] = messages
        if len(self._entries) > self._size:
            for m in self._entries.popitem(last=False)[1]:
                self._tokens.pop(id(m), None)
        return messages

    def tokens(self, message: ChatMessage) -> int:
        """The estimated tokens of ``message`` (cached for the messages read here)."""
        n = self._tokens.get(id(message))
        return estimate_tokens(message) if n is None else n


class Agent:
    """The base of the agents: a name, an optional session memory, a pipeline to start runs
    with (``run``), and ``flow`` to embed the agent in another flow.

    Subclasses implement ``_loop(ctx, state) -> DFlow`` (one turn, then ``_loop`` again as a
    tail ``flat_map``, or ``self._done(state)``) and may extend ``_new_state``.
    """

    def __init__(
        self,
        name: str,
        *,
        memory: ChatMemory | None = None,
        longterm: LongTermMemory | LongTermRecall | None = None,
    ) -> None:
        self.name = check_name(name)
        if memory is not None and not isinstance(memory, ChatMemory):
            raise TypeError(
                f"memory must be a ChatMemory (InMemoryChatMemory, RedisChatMemory), got {memory!r}"
            )
        recall = LongTermRecall.of(longterm)
        tools = list(getattr(self, "tools", {})) or None
        self.snapshot_on = check_events(recall.snapshot_on, tools) if recall is not None else frozenset()
        self.memory = memory
        self.recall = recall  #: the users' facts, recalled into the prompt of a run given user=
        self.longterm = recall.memory if recall is not None else None
        self._pointer = f"dflow_agents/{name}"  # the run's key naming this agent's current invocation
        self._turns = MessageCache()
        share_once(
            _agents,
            self,
            name,
            f"dflow_agents.agent:{name}",
            "agent",
            "runs of either go to the second (give each agent its own name)",
            stacklevel=3,
        )
        entry = f"agent.{name}"
        self.pipeline: Pipeline = self._retrying(
            DFlow.from_call(entry).map(self._start).id("start").flat_map(self._loop).id("loop")
        ).init(entry)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def console_conversation(self, data: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """This agent's conversation in a run's data (decoded values), for the web console of
        ``dflow serve``, which asks every shared object that has this method; ``None`` when
        the agent took no turn in the run."""
        from ._console import conversation

        return conversation(self._pointer, data)

    # -- running -----------------------------------------------------------------------

    def run(self, query: str, *, session: str | None = None, trace_id: str | None = None) -> Run:
        """Start a run of the agent on ``query`` (in ``session``, whose memory it reads and
        extends); ``run.result()`` is the :class:`AgentResult`."""
        return self.pipeline.call(self._request(query, session), trace_id=trace_id)

    async def arun(self, query: str, *, session: str | None = None, trace_id: str | None = None) -> Run:
        """``run`` for async code."""
        return await self.pipeline.acall(self._request(query, session), trace_id=trace_id)

    def flow(
        self, query: str, *, session: str | None = None, tools: Sequence[str] | None = None
    ) -> DFlow[AgentResult]:
        """The agent as a flow to embed in another (in a ``flat_map``): it runs in the
        caller's run, and outputs the :class:`AgentResult`. ``tools``: the names of the only
        tools this run is offered (and ``terminate``, for an agent that has it); a call of
        another gets an error observation naming them."""
        return self._flow(self._with_tools(self._request(query, session), tools))

    def _with_tools(self, request: dict[str, Any], tools: Sequence[str] | None) -> dict[str, Any]:
        """``request`` for a run that is offered only the tools named ``tools`` (and
        ``terminate``, which ends the loop): a call of another gets an error observation
        naming those. ``None``: all of the agent's tools."""
        if tools is None:
            return request
        if (
            isinstance(tools, str)
            or not isinstance(tools, Sequence)
            or not all(isinstance(t, str) for t in tools)
        ):
            raise TypeError(f"tools is a list of tool names, got {tools!r:.120}")
        known = list(getattr(self, "tools", {}) or {})
        unknown = [t for t in tools if t not in known]
        if unknown and not getattr(self, "sources", None):  # (a tool source's tools are listed as it runs)
            raise ValueError(
                f"{self!r} has no tool named {', '.join(map(repr, unknown))}: its tools are {', '.join(known) or 'none'}"
            )
        allowed = ["terminate"] if "terminate" in known and "terminate" not in tools else []
        return {**request, "tools": [*allowed, *dict.fromkeys(tools)]}

    def _flow(self, request: dict[str, Any]) -> DFlow[AgentResult]:
        return self._retrying(
            DFlow.just(request)
            .map(self._start)
            .id(f"{self.name}.start")
            .flat_map(self._loop)
            .id(f"{self.name}.loop")
        )

    def _request(self, query: str, session: str | None) -> dict[str, Any]:
        if not isinstance(query, str):
            raise TypeError(f"an agent's query is a str, got {type(query).__qualname__}")
        return {"query": query, "session": check_session(session)}

    def _for_user(self, request: dict[str, Any], user: object) -> dict[str, Any]:
        """``request`` for ``user``'s long-term memory too."""
        if user is None:
            return request
        if self.longterm is None:
            raise ValueError(
                f"user= names whose long-term memory a run uses, and {self!r} has none (longterm=)"
            )
        return {**request, "user": check_user(user)}

    # -- steps -------------------------------------------------------------------------

    async def _start(self, ctx: ContextStack, request: Any) -> dict[str, Any]:
        """Record the task, the session's memory and the user's recalled facts in the run;
        the loop's first state."""
        if isinstance(request, str):  # pipeline.call("question")
            request = {"query": request, "session": None}
        if not isinstance(request, dict) or not isinstance(request.get("query"), str):
            raise TypeError(
                f"{self!r} starts from a query (str) or {{'query': str, 'session': str}}, got {request!r}"
            )
        session = run_session(ctx, request.get("session"))
        user = run_user(ctx, request.get("user"))
        if user is not None and self.longterm is None:
            raise ValueError(
                f"the request names user {user!r}, and {self!r} has no long-term memory (longterm=)"
            )
        history = await self.memory.load(session) if self.memory is not None and session else []
        ns = f"{self._pointer}/{ctx.idempotency_key}/{uuid.uuid4().hex[:12]}"
        ctx.put(self._pointer, ns)
        ctx.put(f"{ns}/head", dump([*history, ChatMessage.user(request["query"])]))
        # where the conversation is, as plain data: dflow inspect shows it in any process
        turn = ("nudge/{turn}", "summary/{turn}", "call/{turn}", "think/{turn}", "observe/{turn}")
        dflow.declare_conversation(ctx, self.name, head=[f"{ns}/head"], per_turn=[f"{ns}/{k}" for k in turn])
        if user is not None and self.recall is not None:  # the user's facts most relevant to the task
            recalled = facts_prompt(
                await self.recall.memory.recall(user, request["query"]), self.recall.tokens
            )
            if recalled is not None:
                ctx.put(f"{ns}/longterm", dump([recalled]))
        state = self._new_state(ns, request["query"], session, len(history))
        state["user"] = user
        if request.get("tools") is not None:  # (only these tools, in this run)
            state["tools"] = [str(t) for t in request["tools"]]
        return state

    def _new_state(self, ns: str, query: str, session: str | None, history: int) -> dict[str, Any]:
        return {
            "ns": ns,
            "query": query,
            "session": session,
            "history": history,  # messages of the session's memory at the head of the conversation
            "step": 0,
            "status": RUNNING,
            "answer": "",
            "reason": "",
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    def _loop(self, ctx: ContextStack, value: Any) -> DFlow[Any] | Awaitable[DFlow[Any]]:
        raise NotImplementedError  # pragma: no cover - abstract

    def _retrying(self, flow: DFlow[Any]) -> DFlow[Any]:
        """``flow`` (whose last node is the loop step) with the retry policy of the loop."""
        return flow

    def _done(self, state: dict[str, Any]) -> DFlow[AgentResult]:
        return DFlow.just(state).map(self._finish).id("finish")

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        """The messages this run added to the session (the task and every turn after it)."""
        raise NotImplementedError  # pragma: no cover - abstract

    async def _snapshot(self, longterm: LongTermMemory, user: str, facts: Sequence[str], key: str) -> None:
        """Write a run's snapshot ``facts``: those the memory would refuse as too long are left
        out, and a write it refuses is logged: the run's result matters more than its facts."""
        texts = [facts] if isinstance(facts, str) else list(facts)
        limit = getattr(longterm, "max_chars", None)
        if isinstance(limit, int):
            texts = [t for t in texts if not isinstance(t, str) or len(t.strip()) <= limit]
        try:
            await longterm.remember(user, texts, key=key, kind="snapshot")
        except (TypeError, ValueError) as exc:
            log.warning(
                "dflow_agents: %r did not keep the facts of a run of user %r: %s (see LongTermRecall.snapshot_facts)",
                self,
                user,
                exc,
            )

    async def _finish(self, ctx: ContextStack, state: dict[str, Any]) -> AgentResult:
        """Append the run's conversation to the session's memory and, when the run reached
        a ``snapshot_on`` event, its facts to the user's long-term memory (each once,
        whatever re-runs this step); give the result."""
        session, user = state.get("session"), state.get("user")
        longterm = self.longterm if self.snapshot_on and user is not None else None
        keep = self.memory is not None and bool(session)
        messages = self._conversation_of_run(ctx, state) if keep or longterm is not None else []
        if self.memory is not None and session:
            await self.memory.append(session, messages, key=state["ns"])
        if longterm is not None and isinstance(user, str):
            reached = {state["status"], *(f"tool:{m.name}" for m in messages if m.role == "tool" and m.name)}
            if reached & self.snapshot_on:
                facts = self.recall.snapshot_facts(messages) if self.recall is not None else ()
                await self._snapshot(longterm, user, facts, f"{state['ns']}/snapshot")
        return AgentResult(
            status=AgentStatus(state["status"]),
            answer=state.get("answer", ""),
            reason=state.get("reason", ""),
            steps=state["step"],
            usage=usage_of(state),
            session=session,
        )
