"""The tool-calling agent: think (a model call) and act (every tool call of the turn at
once), as a tail loop of flow steps.

One turn is two steps, ``loop`` and ``tool``. ``loop`` writes the last turn's results back
in call order (``observe``), then asks the model (``think``) with the conversation that
fits the context window; ``tool`` makes the calls the model asked for, at once, each call's
result kept as it ends (``ctx.once``), so a worker that dies mid-turn costs only the calls
that had not ended; then ``loop`` again, or the end. A turn that calls a flow tool runs each
call as its own step instead, the branches of a ``zip`` that any worker may run.

The run ends FINISHED when ``terminate`` is called with ``success`` (or, by default, when
the model answers without calling a tool), TERMINATED when ``terminate`` says ``failure``,
and ERROR at ``max_steps``, at the token budget, when the loop guard gives up, or when the
model keeps failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dflow import ContextStack, DFlow, Run

from ._ask import ask, fresh_call_ids
from ._conversations import Conversation, Conversations
from ._tool_calls import ToolCallsAgent, is_tool_source, tools_by_name
from ._window import context_window, estimate_tokens
from .agent import RUNNING, AgentResult, AgentStatus, add_usage, dump, load, stop
from .compression import Window, compress, summarizer_for
from .errors import ModelRetryableError
from .exchanges import recording
from .fallback import as_model, model_call
from .function import AIFunction
from .longterm import LongTermMemory
from .loopguard import LoopGuard
from .memory import ChatMemory
from .messages import ChatMessage, ChatResponse, ToolSpec
from .model import ChatModel
from .options import AgentLimits, LongTermRecall, ModelCalls, check_tool_choice
from .qwen import calls_as_text
from .tools import Tool

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ToolCallAgent"]

#: What a tool-calling agent is told by default.
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task with the tools you are given. Work out what "
    "the task needs, call the tools that help (several in one reply when they do not depend on "
    "each other) and read their results. When the task is done, or cannot be done, call "
    "terminate with the outcome and your conclusion."
)


_DEFAULT_LIMITS = AgentLimits()
_DEFAULT_CALLS = ModelCalls()


class ToolCallAgent(ToolCallsAgent):
    """An agent that calls tools until the task is done. See the module's docstring.

    Args:
        name: names its pipeline (``agent.<name>``), its shared object and its keys in a
            run's data; unique per process.
        model: a ``ChatModel`` (native tool calls) or an ``AIFunction`` (any formatter,
            template, model and parser: ``AIFunction.qwen(model)`` for raw completions); a
            list of models is a :class:`ModelFallback` (the next answers a turn that one
            cannot, for a timeout, a rate limit, a connection error or an open circuit).
        tools: the tools it may call; ``terminate`` is added first unless a tool of that
            name is given. An :class:`~dflow_agents.McpServer` among them offers its tools as
            they are listed at each turn (a tool of ``tools`` wins over one of the same name).
        system_prompt: the system message; ``next_step_prompt``: a user message added at the
            end of every request (not kept in the conversation).
        memory: where sessions' conversations are kept (declare it ``dflow.shared``).
        longterm: the users' long-term facts: a :class:`LongTermMemory`, or a
            :class:`LongTermRecall` saying how many tokens of them go in a prompt and when a
            run's facts are kept.
        limits: turns, tokens, the loop guard, the default tool timeout, what is sent
            (:class:`AgentLimits`).
        model_calls: retries of a failing model call, request options, ``tool_choice``
            (each turn's, or one for all), calls written as text (:class:`ModelCalls`).
    """

    def __init__(
        self,
        name: str,
        model: ChatModel | AIFunction[Any] | Sequence[ChatModel],
        tools: Sequence[Tool | Any] = (),
        *,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        next_step_prompt: str | None = None,
        memory: ChatMemory | None = None,
        longterm: LongTermMemory | LongTermRecall | None = None,
        limits: AgentLimits = _DEFAULT_LIMITS,
        model_calls: ModelCalls = _DEFAULT_CALLS,
    ) -> None:
        model = as_model(model)
        if not isinstance(model, (ChatModel, AIFunction)):  # pyright: ignore[reportGeneralTypeIssues]
            raise TypeError(f"model must be a ChatModel or an AIFunction, got {model!r}")
        if not isinstance(limits, AgentLimits):
            raise TypeError(f"limits is an AgentLimits(...), got {limits!r:.80}")
        if not isinstance(model_calls, ModelCalls):
            raise TypeError(f"model_calls is a ModelCalls(...), got {model_calls!r:.80}")
        self.model = model
        self.sources: list[Any] = [t for t in tools if is_tool_source(t)]
        self.tools: dict[str, Tool] = tools_by_name([t for t in tools if not is_tool_source(t)])
        self.specs: list[ToolSpec] = [t.spec for t in self.tools.values()]
        if not callable(model_calls.tool_choice):
            check_tool_choice(model_calls.tool_choice, self.tools)
        self.system_prompt = system_prompt
        self.next_step_prompt = next_step_prompt
        self.limits = limits
        self.model_calls = model_calls
        self.loop_guard = limits.loop_guard
        self._conversations = Conversations()
        self._system: list[ChatMessage] = []
        super().__init__(name, memory=memory, longterm=longterm)

    def _system_messages(self) -> list[ChatMessage]:
        """The system prompt as a message (the same object from turn to turn, while the prompt
        is the same: its token count and its record's data are made once)."""
        prompt = self.system_prompt
        if not prompt:
            return []
        if not self._system or self._system[0].content != prompt:
            self._system = [ChatMessage.system(prompt)]
        return list(self._system)

    # -- running -----------------------------------------------------------------------

    def run(
        self, query: str, *, session: str | None = None, user: str | None = None, trace_id: str | None = None
    ) -> Run:
        """Start a run of the agent on ``query`` (in ``session``, whose memory it reads and
        extends; for ``user``, whose long-term facts it recalls); ``run.result()`` is the
        :class:`AgentResult`."""
        return self.pipeline.call(self._for_user(self._request(query, session), user), trace_id=trace_id)

    async def arun(
        self, query: str, *, session: str | None = None, user: str | None = None, trace_id: str | None = None
    ) -> Run:
        """``run`` for async code."""
        return await self.pipeline.acall(
            self._for_user(self._request(query, session), user), trace_id=trace_id
        )

    def flow(
        self,
        query: str,
        *,
        session: str | None = None,
        user: str | None = None,
        tools: Sequence[str] | None = None,
    ) -> DFlow[AgentResult]:
        """The agent as a flow to embed in another (in a ``flat_map``): it runs in the
        caller's run, and outputs the :class:`AgentResult`. ``tools``: the names of the only
        tools this run is offered (and ``terminate``); a call of another gets an error
        observation naming them."""
        return self._flow(self._with_tools(self._for_user(self._request(query, session), user), tools))

    # -- the loop ----------------------------------------------------------------------

    def _new_state(self, ns: str, query: str, session: str | None, history: int) -> dict[str, Any]:
        state = super()._new_state(ns, query, session, history)
        state.update(
            calls=[],
            calls_from_text=False,
            model_call=None,
            summary=None,
            content="",
            nudge=None,
            nudged=[],
            guard=LoopGuard.new_state() if self.loop_guard else None,
        )
        return state

    async def _loop(self, ctx: ContextStack, value: Any) -> DFlow[Any]:
        """One turn, as one step: the results of the last turn's calls (when ``value``
        holds them) become observations, then the model is asked what to do next; the
        turn's calls follow (``act``: the flow of the next steps), or the end."""
        state = value if isinstance(value, dict) and "ns" in value else self._observe(ctx, value)
        if state["status"] != RUNNING:
            return self._done(state)
        return self._act(await self._think(ctx, state))

    def _retrying(self, flow: DFlow[Any]) -> DFlow[Any]:
        return flow.retry(
            self.model_calls.attempts, backoff=self.model_calls.retry_backoff, on=ModelRetryableError
        )

    def _conversation(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        """The session's history, the task, then every turn so far, from the run's data (what
        this process read of it at the last turn, and the turns since)."""
        entry = self._conversations.take(ctx, state, self._turns.read)
        if state["status"] == RUNNING:  # (an ended run's is not read again)
            self._conversations.give(entry)
        return list(entry.messages)

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        messages = self._conversation(ctx, state)[state["history"] :]
        last = state["step"]
        if ctx.get(f"{state['ns']}/think/{last}") is not None:  # the answer of the last turn
            messages += load(ctx.get(f"{state['ns']}/think/{last}"))
        return _answered([m for m in messages if not (m.role == "user" and m.name == "loop-guard")])

    def _prompt(
        self,
        ctx: ContextStack,
        state: dict[str, Any],
        conversation: list[ChatMessage],
        summary: ChatMessage | None = None,
        read: Conversation | None = None,
    ) -> list[ChatMessage]:
        """What the model is sent this turn: system prompt, the user's recalled facts, the
        conversation that fits (the summary of its oldest turns, if any, right after the
        task), the loop guard's prompt if it spoke, the next-step prompt. ``read``: the run's
        conversation as read, whose window is kept up to date when ``conversation`` is all of
        it (not compressed, no nudge this turn)."""
        ns, step = state["ns"], state["step"]
        if state["nudge"]:  # the loop guard's prompt: kept in the conversation from now on
            nudge = ChatMessage(role="user", content=state["nudge"], name="loop-guard")
            ctx.put(f"{ns}/nudge/{step}", dump([nudge]))
            state["nudged"] = [*state["nudged"], step]
            state["nudge"] = None
            conversation = [*conversation, nudge]
        system = self._system_messages()
        system += self._turns.read(ctx, f"{ns}/longterm")
        goal = ChatMessage.user(state["query"])
        budget = self.limits.context_tokens - (self._turns.tokens(summary) if summary is not None else 0)
        window = None
        limit = self.limits.max_observation_chars
        if read is not None and summary is None and conversation is read.messages:
            window = read.window_of(self._turns.tokens, limit).fit(system, max(1, budget))
        if window is None:
            window = context_window(
                goal,
                system + conversation,
                max(1, budget),
                count_tokens=self._turns.tokens,
                max_observation_chars=limit,
            )
        if summary is not None:  # pinned after the task, whatever the window left out
            at = next(
                (i for i, m in enumerate(window) if m.role == "user" and m.content == goal.content), None
            )
            window.insert(len(system) if at is None else at + 1, summary)
        if self.next_step_prompt:
            window.append(ChatMessage.user(self.next_step_prompt))
        return window

    async def _think(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """Ask the model what to do next; record its reply (thought and calls), and what the
        model was sent and said (``ModelCalls.recording``). A retryable model error is raised
        while attempts remain (the loop step's retry policy calls again, on a store timer);
        then the run stops with ERROR."""
        state = dict(state)
        if state["step"] >= self.limits.max_steps:
            why = f"reached max_steps ({self.limits.max_steps}) without finishing"
            return stop(state, AgentStatus.ERROR, why)
        prefix, turn, keep = f"{state['ns']}/call/", state["step"], self.model_calls.recording
        with recording(enabled=keep is not None) as calls:  # (nothing kept: nothing noted)
            try:
                return await self._reply(ctx, state)
            finally:
                if keep is not None and calls:
                    keep.keep(ctx, prefix, turn, calls)

    async def _reply(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """The turn's request (compressed when it would not fit), the model's reply, recorded."""
        read = self._conversations.take(ctx, state, self._turns.read)
        state = await self._reply_to(ctx, state, read)
        if state["status"] == RUNNING:  # (an ended run's is not read again; nor one that raised)
            self._conversations.give(read)
        return state

    async def _reply_to(self, ctx: ContextStack, state: dict[str, Any], read: Conversation) -> dict[str, Any]:
        conversation = read.messages  # (not changed here: no copy a turn)
        shown, summary = await self._compressed(ctx, state, conversation)
        prompt = self._prompt(ctx, state, shown, summary, read)
        over = self._over_budget(state, prompt)
        if over is not None:
            return stop(state, AgentStatus.ERROR, over)
        try:
            served = await self._served_specs()
            if self.sources:  # (the names its tool steps may be labelled with)
                state["served"] = [s.name for s in served]
            specs = self._offered(state, self.specs + served)
            response = await ask(
                self.model, prompt, specs, self.model_calls, turn=state["step"], who=repr(self)
            )
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_calls.attempts:
                raise  # the think step's retry policy calls again, when the server says
            why = f"the model failed {self.model_calls.attempts} times; last: {exc}"
            return stop(state, AgentStatus.ERROR, why)
        except Exception as exc:
            return stop(state, AgentStatus.ERROR, f"the model call failed: {type(exc).__name__}: {exc}")
        add_usage(state, response.usage)
        return self._record_reply(ctx, state, response, read.ids)

    async def _compressed(
        self, ctx: ContextStack, state: dict[str, Any], conversation: list[ChatMessage]
    ) -> tuple[list[ChatMessage], ChatMessage | None]:
        """The conversation to send, its oldest turns replaced by their summary (made now when
        it would not fit: ``AgentLimits.compression``), and the summary."""
        policy = self.limits.compression
        if policy is None:
            return conversation, None
        ns, head = state["ns"], state["history"] + 1
        made = state.get("summary")
        summary = self._turns.read(ctx, made["key"])[0] if made else None
        through = made["through"] if made else head
        fixed = [ChatMessage.system(self.system_prompt)] if self.system_prompt else []
        fixed += self._turns.read(ctx, f"{ns}/longterm")
        window = Window(
            conversation,
            head,
            state["query"],
            summary,
            through,
            sum(self._turns.tokens(m) for m in fixed),
            self.limits.context_tokens,
        )
        new = await compress(policy, summarizer_for(policy, self.model), window, self._turns.tokens)
        if new is not None:
            key = f"{ns}/summary/{state['step']}"
            ctx.put(key, dump([new.message]))
            state["summary"] = {"key": key, "through": new.through}
            add_usage(state, new.usage)
            summary, through = new.message, new.through
        if summary is None:
            return conversation, None
        return conversation[:head] + conversation[through:], summary

    def _over_budget(self, state: dict[str, Any], prompt: Sequence[ChatMessage]) -> str | None:
        """Why the next request may not be sent (the token budget), or ``None``."""
        budget = self.limits.token_budget
        if budget is None:
            return None
        used = state["usage"]["total_tokens"]
        need = sum(estimate_tokens(m) for m in prompt)
        if used + need <= budget:
            return None
        return f"token budget of {budget} would be exceeded: {used} used, the next request needs about {need}"

    def _record_reply(
        self, ctx: ContextStack, state: dict[str, Any], response: ChatResponse, taken: set[str]
    ) -> dict[str, Any]:
        """Keep the model's reply in the run and its calls in the state, each with an id the
        conversation (``taken``) does not use yet; a reply without calls ends the run
        (``finish_on_text``), and so does a spent budget."""
        step = state["step"]
        calls = fresh_call_ids(response.tool_calls, step, taken)
        if response.calls_from_text:
            # the turn stays in text: a server that did not read the call may drop tool messages
            said = ChatMessage.assistant(calls_as_text(response.content, calls))
        else:
            said = ChatMessage.assistant(response.content, calls)
        ctx.put(f"{state['ns']}/think/{step}", dump([said]))
        state["content"] = response.content
        state["calls"] = [c.model_dump(mode="json") for c in calls]
        state["calls_from_text"] = response.calls_from_text
        state["model_call"] = model_call(response)
        budget, used = self.limits.token_budget, state["usage"]["total_tokens"]
        if not calls and self.limits.finish_on_text:
            state["step"] = step + 1
            why = "the model answered without calling a tool"
            return stop(state, AgentStatus.FINISHED, why, response.content)
        if calls and budget is not None and used > budget:
            state["step"] = step + 1
            why = f"token budget of {budget} exceeded: {used} used; the calls of the last reply were not run"
            return stop(state, AgentStatus.ERROR, why)
        ctx.put(f"{state['ns']}/state", state)
        return state


def _answered(messages: list[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with the calls that no tool message answers taken out of their assistant
    message (a run stopped between a reply and its results): chat APIs refuse them."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    out = []
    for m in messages:
        if m.role == "assistant" and any(c.id not in answered for c in m.tool_calls):
            kept = [c for c in m.tool_calls if c.id in answered]
            if not kept and not m.content:
                continue
            m = ChatMessage.assistant(m.content, kept)
        out.append(m)
    return out
