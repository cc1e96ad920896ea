"""The tool-calling agent: think (a model call) and act (every tool call of the turn at
once, each its own step), as a tail loop of flow steps.

One turn is ``think`` → ``act`` → ``loop``: ``think`` asks the model with the conversation
that fits the context window; ``act`` runs the calls the model asked for as the branches of
a ``zip`` (each a step that any worker may run, concurrently) and ``observe`` writes their
results back in call order; ``loop`` starts the next turn or finishes. A worker that dies
mid-turn costs only the step it was running.

The run ends FINISHED when ``terminate`` is called with ``success`` (or, by default, when
the model answers without calling a tool), TERMINATED when ``terminate`` says ``failure``,
and ERROR at ``max_steps``, at the token budget, when the loop guard gives up, or when the
model keeps failing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pydantic_core import to_jsonable_python

from dflow import ContextStack, DFlow, Run

from ._window import context_window, estimate_tokens
from .agent import RUNNING, Agent, AgentResult, AgentStatus, add_usage, dump, load, stop
from .errors import ModelRetryableError
from .function import AIFunction
from .longterm import LongTermMemory, user_statements
from .loopguard import LoopGuard
from .memory import ChatMemory
from .messages import ChatMessage, ChatResponse, ToolCall, ToolSpec
from .model import ChatModel
from .terminate import terminate as default_terminate
from .tools import Tool, ToolResult

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ToolCallAgent"]

#: What a tool-calling agent is told by default.
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task with the tools you are given. Work out what "
    "the task needs, call the tools that help (several in one reply when they do not depend on "
    "each other) and read their results. When the task is done, or cannot be done, call "
    "terminate with the outcome and your conclusion."
)


_DEFAULT_GUARD = LoopGuard()


class ToolCallAgent(Agent):
    """An agent that calls tools until the task is done. See the module's docstring.

    Args:
        name: names its pipeline (``agent.<name>``), its shared object and its keys in a
            run's data; unique per process.
        model: a ``ChatModel`` (native tool calls) or an ``AIFunction`` (any formatter,
            template, model and parser: ``AIFunction.qwen(model)`` for raw completions).
        tools: the tools it may call; ``terminate`` is added first unless a tool of that
            name is given.
        system_prompt: the system message; ``next_step_prompt``: a user message added at the
            end of every request (not kept in the conversation).
        max_steps: turns before the run stops with ERROR.
        memory: where sessions' conversations are kept (declare it ``dflow.shared``).
        longterm: the users' long-term facts (a :class:`LongTermMemory`): a run given
            ``user=`` starts by recalling the facts most relevant to its task, which go in
            every prompt after the system prompt, as one system message of at most
            ``longterm_tokens`` tokens (the facts that fit, most relevant first).
        snapshot_on: events at which a run's facts go to the user's long-term memory, once,
            when the run ends: ``"finished"``, ``"terminated"``, ``"error"`` (the run ended
            so), ``"tool:NAME"`` (the run called tool NAME). The facts are
            ``snapshot_facts(messages)`` of the messages the run added (default
            :func:`user_statements`: what the user said), stored with ``kind="snapshot"``;
            those longer than the memory's ``max_chars`` are left out, and a write it
            refuses is logged (the run still gives its result).
        token_budget: tokens all model calls of a run may use (prompt and completion);
            the run stops with ERROR before a request that would exceed it.
        context_tokens: what of the conversation is sent: the task and the latest turns
            within this many tokens (estimated); ``max_observation_chars`` cuts long tool
            results (saying what was cut).
        finish_on_text: a reply without tool calls is the answer (FINISHED); otherwise the
            loop goes on until ``terminate``.
        loop_guard: see :class:`LoopGuard`; ``None`` switches it off.
        model_attempts: model calls per turn when the model fails with a retryable error
            (rate limit, timeout, server error), waiting ``model_retry_backoff`` seconds,
            doubling, or what the server asks (a store timer, not a sleep); then ERROR.
        model_options: request options for a ``ChatModel`` (``temperature``...).
    """

    def __init__(
        self,
        name: str,
        model: ChatModel | AIFunction[Any],
        tools: Sequence[Tool] = (),
        *,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        next_step_prompt: str | None = None,
        max_steps: int = 20,
        memory: ChatMemory | None = None,
        longterm: LongTermMemory | None = None,
        longterm_tokens: int = 1_000,
        snapshot_on: Collection[str] = (),
        snapshot_facts: Callable[[Sequence[ChatMessage]], Sequence[str]] = user_statements,
        token_budget: int | None = None,
        context_tokens: int = 32_000,
        max_observation_chars: int | None = 8_000,
        finish_on_text: bool = True,
        loop_guard: LoopGuard | None = _DEFAULT_GUARD,
        model_attempts: int = 4,
        model_retry_backoff: float = 1.0,
        model_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, (ChatModel, AIFunction)):
            raise TypeError(f"model must be a ChatModel or an AIFunction, got {model!r}")
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"tools are Tool objects (made with @tool), got {t!r}")
        names = [t.name for t in tools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"two tools named {dup[0]!r}: the model calls tools by name, so names must differ")
        _positive("max_steps", max_steps)
        _positive("context_tokens", context_tokens)
        _positive("model_attempts", model_attempts)
        if token_budget is not None:
            _positive("token_budget", token_budget)
        self.model = model
        self.tools: dict[str, Tool] = {t.name: t for t in tools}
        if default_terminate.name not in self.tools:
            self.tools = {default_terminate.name: default_terminate, **self.tools}
        self.specs: list[ToolSpec] = [t.spec for t in self.tools.values()]
        self.system_prompt = system_prompt
        self.next_step_prompt = next_step_prompt
        self.max_steps = max_steps
        self.token_budget = token_budget
        self.context_tokens = context_tokens
        self.max_observation_chars = max_observation_chars
        self.finish_on_text = finish_on_text
        self.loop_guard = loop_guard
        self.model_attempts = model_attempts
        self.model_retry_backoff = float(model_retry_backoff)
        self.model_options = dict(model_options or {})
        super().__init__(name, memory=memory, longterm=longterm, longterm_tokens=longterm_tokens,
                         snapshot_on=snapshot_on, snapshot_facts=snapshot_facts)

    # -- running -----------------------------------------------------------------------

    def run(self, query: str, *, session: str | None = None, user: str | None = None,
            trace_id: str | None = None) -> Run:
        """Start a run of the agent on ``query`` (in ``session``, whose memory it reads and
        extends; for ``user``, whose long-term facts it recalls); ``run.result()`` is the
        :class:`AgentResult`."""
        return self.pipeline.call(self._for_user(self._request(query, session), user), trace_id=trace_id)

    async def arun(self, query: str, *, session: str | None = None, user: str | None = None,
                   trace_id: str | None = None) -> Run:
        """``run`` for async code."""
        return await self.pipeline.acall(self._for_user(self._request(query, session), user), trace_id=trace_id)

    def flow(self, query: str, *, session: str | None = None, user: str | None = None) -> DFlow[AgentResult]:
        """The agent as a flow to embed in another (in a ``flat_map``): it runs in the
        caller's run, and outputs the :class:`AgentResult`."""
        return self._flow(self._for_user(self._request(query, session), user))

    # -- the loop ----------------------------------------------------------------------

    def _new_state(self, ns: str, query: str, session: str | None, history: int) -> dict[str, Any]:
        state = super()._new_state(ns, query, session, history)
        state.update(calls=[], content="", nudge=None, nudged=[],
                     guard=LoopGuard.new_state() if self.loop_guard else None)
        return state

    async def _loop(self, ctx: ContextStack, value: Any) -> DFlow[Any]:
        """One turn, as one step: the results of the last turn's calls (when ``value``
        holds them) become observations, then the model is asked what to do next; the
        turn's calls follow (``act``), or the end."""
        state = value if isinstance(value, dict) and "ns" in value else self._observe(ctx, value)
        if state["status"] != RUNNING:
            return self._done(state)
        state = await self._think(ctx, state)
        return DFlow.just(state).flat_map(self._act).id("act")

    def _retrying(self, flow: DFlow[Any]) -> DFlow[Any]:
        return flow.retry(self.model_attempts, backoff=self.model_retry_backoff, on=ModelRetryableError)

    def _conversation(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        """The session's history, the task, then every turn so far, from the run's data."""
        ns = state["ns"]
        read = self._turns.read
        messages = list(read(ctx, f"{ns}/head"))
        nudged = set(state["nudged"])
        for k in range(state["step"]):
            if k in nudged:
                messages += read(ctx, f"{ns}/nudge/{k}")
            messages += read(ctx, f"{ns}/think/{k}")
            messages += read(ctx, f"{ns}/observe/{k}")
        return messages

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        messages = self._conversation(ctx, state)[state["history"]:]
        last = state["step"]
        if ctx.get(f"{state['ns']}/think/{last}") is not None:  # the answer of the last turn
            messages += load(ctx.get(f"{state['ns']}/think/{last}"))
        return _answered([m for m in messages if not (m.role == "user" and m.name == "loop-guard")])

    def _prompt(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        """What the model is sent this turn: system prompt, the user's recalled facts, the
        conversation that fits, the loop guard's prompt if it spoke, the next-step prompt."""
        ns, step = state["ns"], state["step"]
        conversation = self._conversation(ctx, state)
        if state["nudge"]:  # the loop guard's prompt: kept in the conversation from now on
            nudge = ChatMessage(role="user", content=state["nudge"], name="loop-guard")
            ctx.put(f"{ns}/nudge/{step}", dump([nudge]))
            state["nudged"] = [*state["nudged"], step]
            state["nudge"] = None
            conversation.append(nudge)
        system = [ChatMessage.system(self.system_prompt)] if self.system_prompt else []
        system += self._turns.read(ctx, f"{ns}/longterm")
        goal = ChatMessage.user(state["query"])
        window = context_window(
            goal, system + conversation, self.context_tokens, count_tokens=self._turns.tokens,
            max_observation_chars=self.max_observation_chars,
        )
        if self.next_step_prompt:
            window.append(ChatMessage.user(self.next_step_prompt))
        return window

    async def _ask(self, prompt: list[ChatMessage]) -> ChatResponse:
        if isinstance(self.model, AIFunction):
            response = await self.model({"messages": prompt, "tools": self.specs})
            if not isinstance(response, ChatResponse):
                raise TypeError(f"the AI function of {self!r} returned {type(response).__name__}, not a ChatResponse")
            return response
        return await self.model.chat(prompt, self.specs, **self.model_options)

    async def _think(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """Ask the model what to do next; record its reply (thought and calls). A
        retryable model error is raised while attempts remain (the loop step's retry
        policy calls again, on a store timer); then the run stops with ERROR."""
        state = dict(state)
        step = state["step"]
        if step >= self.max_steps:
            return stop(state, AgentStatus.ERROR, f"reached max_steps ({self.max_steps}) without finishing")
        prompt = self._prompt(ctx, state)
        if self.token_budget is not None:
            used = state["usage"]["total_tokens"]
            need = sum(estimate_tokens(m) for m in prompt)
            if used + need > self.token_budget:
                return stop(state, AgentStatus.ERROR,
                            f"token budget of {self.token_budget} would be exceeded: {used} used, the next "
                            f"request needs about {need}")
        try:
            response = await self._ask(prompt)
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_attempts:
                raise  # the think step's retry policy calls again, when the server says
            return stop(state, AgentStatus.ERROR, f"the model failed {self.model_attempts} times; last: {exc}")
        except Exception as exc:  # noqa: BLE001 - a failing model ends the run as ERROR, with the reason
            return stop(state, AgentStatus.ERROR, f"the model call failed: {type(exc).__name__}: {exc}")
        add_usage(state, response.usage)
        calls = _with_ids(response.tool_calls, step)
        ctx.put(f"{state['ns']}/think/{step}", dump([ChatMessage.assistant(response.content, calls)]))
        state["content"] = response.content
        state["calls"] = [c.model_dump(mode="json") for c in calls]
        if not calls:
            if self.finish_on_text:
                state["step"] = step + 1
                return stop(state, AgentStatus.FINISHED, "the model answered without calling a tool",
                            answer=response.content)
        elif self.token_budget is not None and state["usage"]["total_tokens"] > self.token_budget:
            state["step"] = step + 1
            return stop(state, AgentStatus.ERROR,
                        f"token budget of {self.token_budget} exceeded: {state['usage']['total_tokens']} used; "
                        f"the calls of the last reply were not run")
        ctx.put(f"{state['ns']}/state", state)
        return state

    def _act(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[Any]:
        """Run the turn's calls, concurrently (a ``zip`` of one step per call); their
        results go to the next turn. A turn without calls goes on, or ends the run."""
        if state["status"] != RUNNING:
            return self._done(state)
        if not state["calls"]:  # text only, and the loop goes on
            state = dict(state)
            self._guard(state, [])
            state["step"] += 1
            return self._retrying(DFlow.just(state).flat_map(self._loop).id("loop"))
        branches: list[DFlow[Any]] = []
        for call in state["calls"]:
            tool = self.tools.get(call["name"])
            if tool is not None and tool.is_flow:
                branches.append(DFlow.just(call).flat_map(self._flow_tool).id("tool"))
            else:
                branches.append(DFlow.just(call).map(self._call_tool).id("tool"))
        calls = branches[0] if len(branches) == 1 else DFlow.zip(branches)
        return self._retrying(calls.flat_map(self._loop).id("loop"))

    async def _call_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        """One tool call; every failure is a result the model reads."""
        tool = self.tools.get(call["name"])
        if tool is None:
            return self._unknown(call).model_dump(mode="json")
        result = await tool.run(ToolCall.model_validate(call))
        return result.model_dump(mode="json")

    def _flow_tool(self, call: dict[str, Any]) -> DFlow[Any]:
        """A flow tool's flow, whose value becomes the result; its failure is a result too."""
        tool = self.tools[call["name"]]
        built = tool.flow(ToolCall.model_validate(call))
        if isinstance(built, ToolResult):
            return DFlow.just(built.model_dump(mode="json"))
        return built.map(_flow_value).id("tool-value").on_error_return(_flow_failed)

    def _unknown(self, call: dict[str, Any]) -> ToolResult:
        known = ", ".join(self.tools)
        return ToolResult.failure(
            str(call["name"])[:64],
            f"Error: there is no tool named {str(call['name'])[:64]!r}. The tools are: {known}.",
            error="UnknownTool", call_id=call["id"],
        )

    def _observe(self, ctx: ContextStack, results: Any) -> dict[str, Any]:
        """The results, in call order, become the turn's observations; ``terminate`` and the
        loop guard may end the loop."""
        if not isinstance(results, list):  # a single call ran without a zip
            results = [results]
        ns = ctx.get(self._pointer)
        state = dict(ctx.get(f"{ns}/state"))
        step = state["step"]
        messages: list[ChatMessage] = []
        ended: dict[str, Any] | None = None
        for call, raw in zip(state["calls"], results):
            result = self._result(call, raw)
            messages.append(result.to_message())
            if result.name == default_terminate.name and result.ok and ended is None and isinstance(result.output, dict):
                ended = result.output
        ctx.put(f"{ns}/observe/{step}", dump(messages))
        state["step"] = step + 1
        if ended is not None:
            conclusion = str(ended.get("conclusion") or "")
            if ended.get("status") == "success":
                stop(state, AgentStatus.FINISHED, "terminate was called with status success", conclusion)
            else:
                stop(state, AgentStatus.TERMINATED, "terminate was called with status failure", conclusion)
        else:
            self._guard(state, [m.content for m in messages])
        return state

    def _result(self, call: dict[str, Any], raw: Any) -> ToolResult:
        if isinstance(raw, dict) and raw.get("__flow_value__", False) is not False:
            tool = self.tools[call["name"]]
            return tool.result(raw["__flow_value__"], call_id=call["id"])
        if isinstance(raw, dict) and raw.get("__flow_error__") is not None:
            error = raw["__flow_error__"]
            return ToolResult.failure(call["name"], f"Error: tool '{call['name']}' failed: {error}",
                                      error="FlowError", call_id=call["id"])
        result = ToolResult.model_validate(raw)
        return result if result.call_id else result.model_copy(update={"call_id": call["id"]})

    def _guard(self, state: dict[str, Any], observations: list[str]) -> None:
        guard = self.loop_guard
        if guard is None or state["guard"] is None:
            return
        counts = {**state["guard"], "calls": list(state["guard"]["calls"]), "obs": list(state["guard"]["obs"]),
                  "texts": dict(state["guard"]["texts"])}
        state["guard"] = counts
        what = guard.observe(counts, state["content"], state["calls"], observations)
        if what is None:
            return
        prompt = guard.react(counts, what)
        if prompt is None:
            stop(state, AgentStatus.ERROR, f"stopped by the loop guard: {what}, after a change-of-strategy prompt")
        else:
            state["nudge"] = prompt


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


def _flow_value(value: Any) -> dict[str, Any]:
    try:
        data = to_jsonable_python(value)
    except Exception:  # noqa: BLE001 - shown as text instead
        data = str(value)
    return {"__flow_value__": data}


def _flow_failed(error: BaseException) -> dict[str, Any]:
    text = f"{type(error).__name__}: {error}"
    return {"__flow_error__": text if len(text) <= 500 else text[:500] + "..."}


def _with_ids(calls: Sequence[ToolCall], step: int) -> list[ToolCall]:
    """Calls with ids (a model that gives none, or the same one twice, gets ``call_<turn>_<n>``)."""
    seen: set[str] = set()
    out = []
    for n, c in enumerate(calls):
        if not c.id or c.id in seen:
            c = c.model_copy(update={"id": f"call_{step}_{n}"})
        seen.add(c.id)
        out.append(c)
    return out


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")

