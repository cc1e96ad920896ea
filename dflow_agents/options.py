"""The settings groups of the agents' constructors: frozen dataclasses with defaults.

An agent takes its name, its model and its tools, then a few keyword groups instead of a
long list of keywords::

    ToolCallAgent(
        "shopper",
        model,
        [search, buy],
        limits=AgentLimits(max_steps=8, token_budget=50_000),
        model_calls=ModelCalls(attempts=6, tool_choice="required"),
        longterm=LongTermRecall(facts, tokens=500, snapshot_on={"finished"}),
    )

* :class:`AgentLimits`: how far a :class:`~dflow_agents.ToolCallAgent`'s run may go
  (turns, tokens, the loop guard, time per tool call) and how much each request
  carries;
* :class:`ModelCalls`: how the model is asked (attempts of a failing call, request
  options, ``tool_choice``) and how its reply is read (tool calls written as text), for
  the tool-calling agent, the ReAct executor and the planning flow alike;
* :class:`LongTermRecall`: a user's long-term facts in the prompt, and when a run's facts
  are kept.

The ReAct executor's bounds are :class:`~dflow_agents.ReActLimits`, the planning flow's
settings :class:`~dflow_agents.PlanningOptions`, each beside its agent. Every group checks
its values when it is made, so a wrong one fails where it is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ._snapshot_events import check_events
from .compression import ContextCompression
from .exchanges import CallRecording
from .longterm import LongTermMemory, user_statements
from .loopguard import LoopGuard
from .messages import ChatMessage

__all__ = ["DEFAULT_TOOL_TIMEOUT", "AgentLimits", "LongTermRecall", "ModelCalls", "ToolChoice"]

#: Seconds an agent lets a tool call take when the tool sets no timeout of its own (the
#: seeds' default).
DEFAULT_TOOL_TIMEOUT = 10.0

#: ``"auto"`` (the model decides), ``"required"`` (it must call a tool), ``"none"`` (it must
#: not), or the name of the one tool it must call.
ToolChoice = str

TOOL_CHOICES = ("auto", "required", "none")
_DEFAULT_GUARD = LoopGuard()
_DEFAULT_RECORDING = CallRecording()


def positive_int(what: str, value: object) -> int:
    """``value`` if it is an int >= 1 (``ValueError`` naming ``what`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an int >= 1, got {value!r:.80}")
    return value


def seconds(what: str, value: object, *, none: bool = True) -> float | None:
    """``value`` as seconds > 0 (``None`` when ``none`` allows it); ``ValueError`` otherwise."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{what} must be a number of seconds > 0{' or None' if none else ''}, got {value!r:.80}"
        )
    return float(value)


@dataclasses.dataclass(frozen=True)
class AgentLimits:
    """How far a tool-calling agent's run may go, and how much each request carries.

    Args:
        max_steps: turns before the run stops with ERROR.
        token_budget: tokens all model calls of a run may use (prompt and completion);
            the run stops with ERROR before a request that would exceed it. ``None``: no
            budget.
        context_tokens: what of the conversation is sent: the task and the latest turns
            within this many tokens (estimated).
        max_observation_chars: longer tool results are cut in the request (saying what
            was cut); ``None``: never cut.
        tool_timeout: seconds a tool call may take when the tool sets no ``timeout`` of its
            own; then it fails with a result the model reads. A sync tool runs in a worker
            thread under it (a thread cannot be stopped: it finishes alone, its result
            dropped). ``None``: no default (sync tools without a timeout run in the event
            loop's thread).
        loop_guard: see :class:`~dflow_agents.LoopGuard`; ``None`` switches it off.
        finish_on_text: a reply without tool calls is the answer (FINISHED); ``False``:
            the loop goes on until ``terminate``.
        compression: when the conversation passes ``context_tokens``, its oldest turns are
            summarised into one message kept in the run (:class:`ContextCompression`);
            ``None``: they are only left out (:func:`~dflow_agents.context_window`).
    """

    max_steps: int = 20
    token_budget: int | None = None
    context_tokens: int = 32_000
    max_observation_chars: int | None = 8_000
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT
    loop_guard: LoopGuard | None = _DEFAULT_GUARD
    finish_on_text: bool = True
    compression: ContextCompression | None = None

    def __post_init__(self) -> None:
        positive_int("AgentLimits.max_steps", self.max_steps)
        if self.compression is not None and not isinstance(self.compression, ContextCompression):
            raise TypeError(
                f"AgentLimits.compression is a ContextCompression or None, got {self.compression!r:.80}"
            )
        positive_int("AgentLimits.context_tokens", self.context_tokens)
        if self.token_budget is not None:
            positive_int("AgentLimits.token_budget", self.token_budget)
        if self.max_observation_chars is not None:
            positive_int("AgentLimits.max_observation_chars", self.max_observation_chars)
        object.__setattr__(self, "tool_timeout", seconds("AgentLimits.tool_timeout", self.tool_timeout))
        if self.loop_guard is not None and not isinstance(self.loop_guard, LoopGuard):
            raise TypeError(f"AgentLimits.loop_guard is a LoopGuard or None, got {self.loop_guard!r:.80}")
        if not isinstance(self.finish_on_text, bool):
            raise TypeError(f"AgentLimits.finish_on_text is a bool, got {self.finish_on_text!r:.80}")


@dataclasses.dataclass(frozen=True)
class ModelCalls:
    """How the model is asked, and how its reply is read.

    Args:
        attempts: model calls per turn when the model fails with a retryable error (rate
            limit, timeout, server error, a dropped connection), waiting ``retry_backoff``
            seconds, doubling, or what the server asks (a store timer, not a sleep); then
            the run stops with ERROR.
        retry_backoff: the first wait, in seconds.
        options: request options for a ``ChatModel`` (``temperature``, ``max_tokens``...).
        tool_choice: what the model is told about calling the tools offered: ``"auto"``,
            ``"required"``, ``"none"`` or a tool's name; or ``fn(turn) -> choice`` (turns
            count from 0; ``None``: say nothing), e.g. ``lambda turn: "required" if turn == 0
            else "auto"``. ``None``: say nothing (``OpenAIChatModel`` sends ``"auto"``
            whenever it sends tools). An ``AIFunction`` model gets it as
            ``inputs["tool_choice"]``. Not for the ReAct executor, which offers no tools
            natively.
        text_tool_calls: when tools were offered and a reply has no native tool calls, read
            calls the model wrote in its text (a JSON call object, fenced or not, a list of
            them, ``<tool_call>`` tags): servers without a tool-call parser return them so.
            The turn records that it did (``calls_from_text`` in the loop's state) and stays
            in text: the calls go back to the model as ``<tool_call>`` blocks and their
            results as one user message of ``<tool_response>`` blocks (a server that did not
            read the call may drop tool messages, as llama-cpp-python's chat formats do). See
            :func:`~dflow_agents.read_text_tool_calls` for what counts as a call. ``False``:
            such a reply is text (the ReAct executor offers no tools natively, and reads
            none).
        recording: how each turn's model calls (the exact request, the reply) are kept in
            the run, for ``dflow inspect`` and the console: bounds and a ``redact`` hook
            (:class:`CallRecording`). ``None``: not kept.
    """

    attempts: int = 4
    retry_backoff: float = 1.0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tool_choice: ToolChoice | Callable[[int], ToolChoice | None] | None = None
    text_tool_calls: bool = True
    recording: CallRecording | None = _DEFAULT_RECORDING

    def __post_init__(self) -> None:
        positive_int("ModelCalls.attempts", self.attempts)
        if self.recording is not None and not isinstance(self.recording, CallRecording):
            raise TypeError(f"ModelCalls.recording is a CallRecording or None, got {self.recording!r:.80}")
        object.__setattr__(
            self, "retry_backoff", seconds("ModelCalls.retry_backoff", self.retry_backoff, none=False)
        )
        if not isinstance(self.options, Mapping):
            raise TypeError(f"ModelCalls.options is a mapping of request options, got {self.options!r:.80}")
        object.__setattr__(self, "options", dict(self.options))
        choice = self.tool_choice
        if choice is not None and not callable(choice) and not (isinstance(choice, str) and choice):
            raise TypeError(
                "ModelCalls.tool_choice is 'auto', 'required', 'none', a tool's name or fn(turn) -> "
                f"one of those, got {choice!r:.80}"
            )
        if not isinstance(self.text_tool_calls, bool):
            raise TypeError(f"ModelCalls.text_tool_calls is a bool, got {self.text_tool_calls!r:.80}")

    def choice_for(self, turn: int, tools: Collection[str]) -> ToolChoice | None:
        """The ``tool_choice`` of turn ``turn``, checked against the ``tools`` offered
        (``ValueError`` saying what is wrong)."""
        choice = self.tool_choice(turn) if callable(self.tool_choice) else self.tool_choice
        check_tool_choice(choice, tools)
        return choice


def check_tool_choice(choice: object, tools: Collection[str]) -> None:
    """``ValueError`` unless ``choice`` is ``None``, one of the choices, or a tool of ``tools``."""
    if choice is None or choice in TOOL_CHOICES or (isinstance(choice, str) and choice in tools):
        return
    raise ValueError(
        f"tool_choice {choice!r:.80} is neither 'auto', 'required', 'none' nor a tool offered "
        f"({', '.join(tools) or 'none'})"
    )


@dataclasses.dataclass(frozen=True)
class LongTermRecall:
    """A user's long-term facts in an agent's prompts, and when a run's facts are kept.

    An agent given ``longterm=`` (this, or a bare :class:`~dflow_agents.LongTermMemory`,
    with these defaults) and a run given ``user=`` starts by recalling the facts most
    relevant to its task, which go in every prompt after the system prompt as one system
    message of at most ``tokens`` tokens (the facts that fit, most relevant first).

    Args:
        memory: where the users' facts are kept.
        tokens: the most the recalled facts take in a prompt.
        snapshot_on: events at which a run's facts go to the user's long-term memory, once,
            when the run ends: ``"finished"``, ``"terminated"``, ``"error"`` (the run ended
            so), ``"tool:NAME"`` (the run called tool NAME).
        snapshot_facts: ``fn(messages) -> facts`` of the messages the run added (default
            :func:`~dflow_agents.user_statements`: what the user said), stored with
            ``kind="snapshot"``; those longer than the memory's ``max_chars`` are left out,
            and a write it refuses is logged (the run still gives its result).
    """

    memory: LongTermMemory
    tokens: int = 1_000
    snapshot_on: Collection[str] = ()
    snapshot_facts: Callable[[Sequence[ChatMessage]], Sequence[str]] = user_statements

    def __post_init__(self) -> None:
        if not isinstance(self.memory, LongTermMemory):
            raise TypeError(
                f"LongTermRecall.memory is a LongTermMemory (StateLongTermMemory), got {self.memory!r:.80}"
            )
        positive_int("LongTermRecall.tokens", self.tokens)
        object.__setattr__(self, "snapshot_on", check_events(self.snapshot_on))
        if not callable(self.snapshot_facts):
            raise TypeError(
                "LongTermRecall.snapshot_facts takes a function (messages) -> list of str, "
                f"got {self.snapshot_facts!r:.80}"
            )

    @classmethod
    def of(cls, longterm: LongTermMemory | LongTermRecall | None) -> LongTermRecall | None:
        """``longterm`` as a ``LongTermRecall`` (a bare memory gets the defaults)."""
        if longterm is None or isinstance(longterm, LongTermRecall):
            return longterm
        if not isinstance(longterm, LongTermMemory):
            raise TypeError(
                "longterm is a LongTermMemory (StateLongTermMemory) or a LongTermRecall, "
                f"got {longterm!r:.80}"
            )
        return cls(longterm)
