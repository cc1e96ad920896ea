"""The text ReAct agent: Thought / Action / Action Input / Observation / Final Answer.

For models without native tool calls, or when the reasoning should be visible as text.
Each iteration is ``think`` (render the prompt with the scratchpad, complete it, parse what
the model wrote) and, for an action, a ``tool`` step and ``observe``. A reply that cannot be
read goes back to the model as the observation, saying what was wrong. The run ends
FINISHED with the final answer, or ERROR at the iteration limit or when the model keeps
failing. Only the question and the final answer go to the session's memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Sequence
from typing import Any, Literal, cast

from pydantic_core import to_jsonable_python

from dflow import ContextStack, DFlow

from ._tool_calls import tool_label
from ._window import context_window
from .agent import RUNNING, Agent, AgentStatus, add_usage, stop
from .errors import ModelRetryableError
from .exchanges import asked, chat_request, completion_request, model_label, recording
from .fallback import as_model, model_call
from .memory import ChatMemory
from .messages import ChatMessage, ChatResponse
from .model import ChatModel, CompletionModel
from .options import DEFAULT_TOOL_TIMEOUT, ModelCalls, positive_int, seconds
from .react import (
    REACT_STOP,
    REACT_TEMPLATE,
    ReActAction,
    ReActFinalAnswer,
    ReActParseFailure,
    ReActStep,
    parse_react_output,
    render_react_prompt,
    render_react_scratchpad,
)
from .tools import Tool, ToolResult

__all__ = ["ConversationAgentExecutor", "ReActLimits"]


@dataclasses.dataclass(frozen=True)
class ReActLimits:
    """How far a ReAct executor's run may go, and how much its prompt carries.

    Args:
        max_iterations: actions (and unreadable replies) before the run stops with ERROR.
        history_tokens: how much of the session's earlier conversation is shown.
        max_observation_chars: longer tool results are cut (saying so).
        tool_timeout: as ``AgentLimits.tool_timeout``: seconds a tool call may take when the
            tool sets no timeout of its own.
    """

    max_iterations: int = 5
    history_tokens: int = 4_000
    max_observation_chars: int = 4_000
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT

    def __post_init__(self) -> None:
        positive_int("ReActLimits.max_iterations", self.max_iterations)
        positive_int("ReActLimits.history_tokens", self.history_tokens)
        positive_int("ReActLimits.max_observation_chars", self.max_observation_chars)
        object.__setattr__(self, "tool_timeout", seconds("ReActLimits.tool_timeout", self.tool_timeout))


_DEFAULT_LIMITS = ReActLimits()
_DEFAULT_CALLS = ModelCalls()


class ConversationAgentExecutor(Agent):
    """A ReAct agent over a text model. See the module's docstring.

    Args:
        name: as for :class:`ToolCallAgent`.
        model: a ``ChatModel`` or a ``CompletionModel``.
        tools: the tools it may call (plain or flow tools).
        mode: ``"completion"`` completes the whole prompt as raw text (the classic form);
            ``"chat"`` sends the prompt as the first user message, each step as the
            model's message and its observation as the next user message. ``"auto"``: chat
            for a ``ChatModel`` not set to raw mode, completion otherwise.
        template: the ReAct prompt, see :data:`REACT_TEMPLATE`.
        memory: the sessions' memory; the question and the final answer are appended.
        limits: iterations, history and observation sizes (:class:`ReActLimits`).
        model_calls: retries of a failing model call and request options
            (:class:`ModelCalls`); ``stop`` defaults to ``REACT_STOP``. It offers no tools
            natively, so ``tool_choice`` is refused and ``text_tool_calls`` not used.
    """

    def __init__(
        self,
        name: str,
        model: CompletionModel | ChatModel,
        tools: Sequence[Tool] = (),
        *,
        mode: Literal["auto", "chat", "completion"] = "auto",
        template: str = REACT_TEMPLATE,
        memory: ChatMemory | None = None,
        limits: ReActLimits = _DEFAULT_LIMITS,
        model_calls: ModelCalls = _DEFAULT_CALLS,
    ) -> None:
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"tools are Tool objects (made with @tool), got {t!r}")
        if not isinstance(limits, ReActLimits):
            raise TypeError(f"limits is a ReActLimits(...), got {limits!r:.80}")
        if not isinstance(model_calls, ModelCalls):
            raise TypeError(f"model_calls is a ModelCalls(...), got {model_calls!r:.80}")
        if model_calls.tool_choice is not None:
            raise ValueError(
                "ModelCalls.tool_choice does not apply to the ReAct executor: it offers no tools natively "
                "(its prompt lists them); leave tool_choice out"
            )
        render_react_prompt([], "", template=template)  # refuses a template without its placeholders
        model = as_model(model)
        self.mode = _mode_for(model, mode)
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.template = template
        self.limits = limits
        self.model_calls = model_calls
        self.model_options = {"stop": list(REACT_STOP), **model_calls.options}
        super().__init__(name, memory=memory)

    def _new_state(self, ns: str, query: str, session: str | None, history: int) -> dict[str, Any]:
        state = super()._new_state(ns, query, session, history)
        state.update(steps=[], action=None)
        return state

    def _loop(self, ctx: ContextStack, value: Any) -> DFlow[Any]:
        state: dict[str, Any] = value
        if state["status"] != RUNNING:
            return self._done(state)
        return (
            DFlow.just(state)
            .map(self._think)
            .id("think")
            .retry(self.model_calls.attempts, backoff=self.model_calls.retry_backoff, on=ModelRetryableError)
            .flat_map(self._act)
            .id("act")
        )

    def _question(self, ctx: ContextStack, state: dict[str, Any]) -> str:
        """The question, after what fits of the session's earlier conversation."""
        if not state["history"]:
            return str(state["query"])
        history = self._turns.read(ctx, f"{state['ns']}/head")[: state["history"]]
        shown = context_window(None, list(history), self.limits.history_tokens, max_observation_chars=None)
        lines = [
            f"{'User' if m.role == 'user' else 'Assistant'}: {m.content}"
            for m in shown
            if m.role in ("user", "assistant") and m.content
        ]
        if not lines:
            return str(state["query"])
        return "(Earlier in this conversation:\n" + "\n".join(lines) + ")\n\n" + str(state["query"])

    async def _think(self, ctx: ContextStack, state: dict[str, Any]) -> dict[str, Any]:
        """Complete the prompt and read the reply: an action, a final answer, or a failure."""
        state = dict(state)
        if len(state["steps"]) >= self.limits.max_iterations:
            return stop(
                state,
                AgentStatus.ERROR,
                f"reached the iteration limit ({self.limits.max_iterations}) without a final answer",
            )
        steps = [ReActStep.model_validate(s) for s in state["steps"]]
        tools = self._offered(state)
        try:
            response = await self._recorded(
                ctx, state, self._complete(self._question(ctx, state), steps, tools)
            )
        except ModelRetryableError as exc:
            if ctx.attempt + 1 < self.model_calls.attempts:
                raise
            return stop(
                state, AgentStatus.ERROR, f"the model failed {self.model_calls.attempts} times; last: {exc}"
            )
        except Exception as exc:
            return stop(state, AgentStatus.ERROR, f"the model call failed: {type(exc).__name__}: {exc}")
        add_usage(state, response.usage)
        state["model_call"] = model_call(response)
        parsed = parse_react_output(response.content, tools)  # (a tool not offered: its failure)
        state["step"] += 1
        if isinstance(parsed, ReActFinalAnswer):
            return stop(state, AgentStatus.FINISHED, "the model gave its final answer", answer=parsed.answer)
        if isinstance(parsed, ReActParseFailure):
            state["steps"] = [*state["steps"], self._step(ReActStep.of(parsed))]
            state["action"] = None
        else:
            state["action"] = parsed.model_dump(mode="json")
        return state

    async def _recorded(
        self, ctx: ContextStack, state: dict[str, Any], asking: Awaitable[ChatResponse]
    ) -> ChatResponse:
        """``await asking``, what was sent and said kept in the run (``ModelCalls.recording``)."""
        prefix, turn, keep = f"{state['ns']}/call/", state["step"], self.model_calls.recording
        with recording() as calls:
            try:
                return await asking
            finally:
                if keep is not None and calls:
                    keep.keep(ctx, prefix, turn, calls)

    def _offered(self, state: dict[str, Any]) -> list[Tool]:
        """The tools of this run: all of the agent's, or those it was given
        (``flow(..., tools=[...])``)."""
        allowed = state.get("tools")
        return [t for name, t in self.tools.items() if allowed is None or name in allowed]

    async def _complete(self, question: str, steps: list[ReActStep], tools: list[Tool]) -> ChatResponse:
        label, options = model_label(self.model), self.model_options
        if self.mode == "completion":
            prompt = render_react_prompt(tools, question, steps, template=self.template)
            completing = cast(CompletionModel, self.model)
            return await asked(
                label,
                lambda: completion_request(prompt, options),
                lambda: completing.complete(prompt, **options),
            )
        messages = [ChatMessage.user(render_react_prompt(tools, question, (), template=self.template))]
        for step in steps:
            said, _, observed = render_react_scratchpad([step]).partition("\nObservation:")
            messages.append(ChatMessage.assistant(("Thought:" + said).strip()))
            messages.append(ChatMessage.user("Observation:" + observed.removesuffix("\nThought:")))
        chatting = cast(ChatModel, self.model)
        return await asked(
            label,
            lambda: chat_request(messages, None, options),
            lambda: chatting.chat(messages, None, **options),
        )

    def _act(self, ctx: ContextStack, state: dict[str, Any]) -> DFlow[Any]:
        """Run the action's tool, then observe; or go on (a parse failure) or end."""
        action = state.get("action")
        if state["status"] != RUNNING or action is None:
            return self._loop(ctx, state)
        tool = self.tools[action["tool"]]  # the parser only names registered tools
        shown = f"tool {str(action['tool'])[:100]}"  # (the step's id stays "tool": its key is the same)
        if tool.is_flow:  # its value replaces the state: keep the state in the run
            ctx.put(f"{state['ns']}/state", state)
            ran = DFlow.just(state).flat_map(self._flow_tool).id("tool").name(shown)
        else:
            ran = DFlow.just(state).map(self._call_tool).id("tool").name(shown)
        return ran.label(tool_label([action["tool"]], self.tools)).flat_map(self._observe).id("observe")

    async def _call_tool(self, state: dict[str, Any]) -> dict[str, Any]:
        action = state["action"]
        tool = self.tools[action["tool"]]
        result = await tool.run(action["tool_input"], default_timeout=self.limits.tool_timeout)
        return {**state, "observation": result.observation}

    def _flow_tool(self, state: dict[str, Any]) -> DFlow[Any]:
        action = state["action"]
        tool = self.tools[action["tool"]]
        built = tool.flow(action["tool_input"])
        if isinstance(built, ToolResult):
            return DFlow.just({**state, "observation": built.observation})
        return built.map(_as_observation).id("tool-value").on_error_return(_failed_observation)

    def _observe(self, ctx: ContextStack, ran: dict[str, Any]) -> DFlow[Any]:
        """The observation joins the scratchpad; the next iteration."""
        if "__observation__" in ran:  # a flow tool's value (or failure): the state is in the run
            state = dict(ctx.get(f"{ctx.get(self._pointer)}/state"))
            observation = ran["__observation__"]
        else:
            state = {k: v for k, v in ran.items() if k != "observation"}
            observation = ran["observation"]
        action = ReActAction.model_validate(state["action"])
        state["steps"] = [*state["steps"], self._step(ReActStep.of(action, observation))]
        state["action"] = None
        return self._loop(ctx, state)

    def _step(self, step: ReActStep) -> dict[str, Any]:
        limit = self.limits.max_observation_chars
        text = step.observation
        if len(text) > limit:
            head, tail = text[: limit * 3 // 4], text[-(limit // 4) :]
            text = f"{head}\n[… {len(step.observation) - len(head) - len(tail):,} characters cut]\n{tail}"
        return step.model_copy(update={"observation": text}).model_dump(mode="json")

    def _conversation_of_run(self, ctx: ContextStack, state: dict[str, Any]) -> list[ChatMessage]:
        messages = [ChatMessage.user(state["query"])]
        if state["status"] == AgentStatus.FINISHED.value:
            messages.append(ChatMessage.assistant(state["answer"]))
        return messages


def _mode_for(model: object, mode: str) -> Literal["chat", "completion"]:
    """The mode ``mode`` means for ``model``; refuses a mode the model cannot serve."""
    if not isinstance(model, (CompletionModel, ChatModel)):
        raise TypeError(f"model must be a CompletionModel or a ChatModel, got {model!r}")
    if mode == "auto":
        raw = getattr(model, "mode", None) == "raw" or not isinstance(model, ChatModel)
        return "completion" if raw else "chat"
    if mode == "completion":
        if not isinstance(model, CompletionModel):
            raise TypeError(f"mode='completion' needs a model with complete(), and {model!r} has none")
        return "completion"
    if mode == "chat":
        if not isinstance(model, ChatModel):
            raise TypeError(f"mode='chat' needs a model with chat(), and {model!r} has none")
        return "chat"
    raise ValueError(f"mode must be 'auto', 'chat' or 'completion', got {mode!r}")


def _as_observation(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"__observation__": value}
    try:
        return {"__observation__": ToolResult.of("tool", to_jsonable_python(value)).observation}
    except Exception:
        return {"__observation__": str(value)}


def _failed_observation(error: BaseException) -> dict[str, Any]:
    text = f"Error: the tool failed: {type(error).__name__}: {error}"
    return {"__observation__": text if len(text) <= 500 else text[:500] + "..."}
