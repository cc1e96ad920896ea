"""Test doubles for models, and the switch that keeps tests off the network.

``ScriptedModel`` plays a list of replies; ``FunctionModel`` lets a function decide each
reply. Both pick their answer from the request alone, never from state kept between calls:
agent steps are re-executed after a crash and run on different worker processes, so a
double that counted its calls would answer a retried step with the wrong reply.

Both record the requests they received *in this process* (``model.requests``) and pickle
(cloudpickle) without them, so flows that capture them can travel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from . import _guard
from ._live_reply import LiveReply
from .messages import ChatMessage, ChatResponse, ToolCall, ToolSpec, Usage
from .qwen import calls_as_text

__all__ = [
    "FunctionModel",
    "ModelRequest",
    "ScriptedModel",
    "ScriptedReply",
    "block_network_models",
    "call",
    "network_models_blocked",
    "reply",
    "usage",
]


@dataclasses.dataclass(frozen=True)
class ModelRequest:
    """One request a test double received: a conversation (``chat``) or a raw ``prompt``."""

    messages: tuple[ChatMessage, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prompt: str | None = None

    @property
    def turn(self) -> int:
        """How many assistant turns the conversation already has (the reply's index). For a
        raw prompt: its completed ChatML assistant turns, or, in a prompt without ChatML
        (a ReAct prompt), the ``Observation:`` lines after its last ``Question:`` line."""
        if self.prompt is not None:
            if "<|im_start|>" in self.prompt:
                return len(_COMPLETED_ASSISTANT.findall(self.prompt))
            scratchpad = self.prompt.rpartition("\nQuestion:")[2]
            return len(_OBSERVATION_LINE.findall(scratchpad))
        return sum(1 for m in self.messages if m.role == "assistant")

    @property
    def last_input(self) -> str:
        """The text of the last user or tool message (for a raw prompt: of its last user turn,
        or of the last ``<tool_response>`` in it)."""
        if self.prompt is not None:
            turns = _USER_TURN.findall(self.prompt)
            if not turns:
                return ""
            responses: list[str] = _TOOL_RESPONSE.findall(turns[-1])
            last: str = responses[-1] if responses else turns[-1]
            return last
        for m in reversed(self.messages):
            if m.role in ("user", "tool"):
                return m.content
        return ""


_COMPLETED_ASSISTANT = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)
_OBSERVATION_LINE = re.compile(r"^Observation:", re.MULTILINE)
_USER_TURN = re.compile(r"<\|im_start\|>user\n?(.*?)<\|im_end\|>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)

Expectation = str | Callable[[ModelRequest], object]


@dataclasses.dataclass(frozen=True)
class ScriptedReply:
    """A reply of a ``ScriptedModel`` and what the request for it must look like."""

    response: ChatResponse
    expect: tuple[Expectation, ...] = ()


def call(
    name: str, arguments: Mapping[str, Any] | None = None, /, *, call_id: str | None = None, **kwargs: Any
) -> ToolCall:
    """A tool call for a scripted reply: ``call("search", q="x")`` or ``call("get", {"id": 3})``.

    Without ``call_id`` the model assigns ``call_{reply index}_{position}``.
    """
    return ToolCall(id=call_id or "", name=name, arguments={**(arguments or {}), **kwargs})


def usage(prompt_tokens: int = 0, completion_tokens: int = 0) -> Usage:
    """Token usage for a scripted reply (the total is the sum)."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def reply(
    content: str = "",
    *,
    calls: Sequence[ToolCall] = (),
    usage: Usage | None = None,
    finish_reason: str | None = None,
    expect: Expectation | Sequence[Expectation] | None = None,
) -> ScriptedReply:
    """A scripted reply: text, tool calls, usage.

    ``expect`` checks the request before the reply is given: a string must appear in the
    last user/tool message; a callable gets the :class:`ModelRequest` and fails by raising
    ``AssertionError`` or returning ``False``.
    """
    checks: tuple[Expectation, ...]
    if expect is None:
        checks = ()
    elif isinstance(expect, str) or callable(expect):
        checks = (expect,)
    else:
        checks = tuple(expect)
    response = ChatResponse(
        content=content,
        tool_calls=list(calls),
        usage=usage or Usage(),
        finish_reason=finish_reason or ("tool_calls" if calls else "stop"),
    )
    return ScriptedReply(response, checks)


def _as_reply(item: ScriptedReply | ChatResponse | str) -> ScriptedReply:
    if isinstance(item, ScriptedReply):
        return item
    if isinstance(item, ChatResponse):
        return ScriptedReply(item)
    if isinstance(item, str):
        return reply(item)
    raise TypeError(f"a scripted reply is a str, a ChatResponse or reply(...), got {item!r}")


def _with_ids(response: ChatResponse, turn: int, model: str) -> ChatResponse:
    calls = [
        c if c.id else c.model_copy(update={"id": f"call_{turn}_{n}"})
        for n, c in enumerate(response.tool_calls)
    ]
    return response.model_copy(update={"tool_calls": calls, "model": response.model or model})


def _as_completion(response: ChatResponse) -> ChatResponse:
    """A reply as the raw text a Qwen model would write (calls as ``<tool_call>`` blocks)."""
    text = calls_as_text(response.content, response.tool_calls)
    return response.model_copy(update={"content": text, "tool_calls": []})


def _shown(text: str) -> str:
    return repr(text if len(text) <= 300 else text[:300] + "...")


class ScriptedModel:
    """A model that plays ``replies`` in order, choosing by the conversation itself.

    Reply number *i* answers a conversation that already holds *i* assistant messages (for a
    raw prompt: *i* completed assistant turns), so a step re-executed after a crash, or on
    another worker, gets the same reply. This assumes what agents do anyway: each reply goes
    back into the conversation as one assistant message (``ChatResponse.to_message()``). A
    conversation past the end of the script, or a failed ``expect``, raises
    ``AssertionError`` saying which reply and why.

    Implements ``chat`` and ``complete`` (where tool calls are written as Qwen
    ``<tool_call>`` text, so one script serves both paths). With ``stream=True`` a chat
    reply is also published as live events of the step that asked, word by word, as
    ``OpenAIChatModel(stream=True)`` publishes what it reads (``Run.aevents(live=True)``).
    """

    def __init__(
        self,
        replies: Sequence[ScriptedReply | ChatResponse | str],
        *,
        name: str = "scripted",
        stream: bool = False,
    ) -> None:
        if not isinstance(stream, bool):
            raise TypeError(f"ScriptedModel's stream is True or False, got {stream!r:.80}")
        self.replies: tuple[ScriptedReply, ...] = tuple(_as_reply(r) for r in replies)
        self.name = name
        self.stream = stream
        self.requests: list[ModelRequest] = []

    def __repr__(self) -> str:
        return f"ScriptedModel({len(self.replies)} replies, name={self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"replies": self.replies, "name": self.name, "stream": self.stream}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.replies, self.name, self.requests = state["replies"], state["name"], []
        self.stream = bool(state.get("stream", False))

    async def chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None, **options: Any
    ) -> ChatResponse:
        """The scripted reply for this conversation."""
        request = ModelRequest(tuple(messages), tuple(tools or ()), dict(options))
        reply = self._answer(request)
        if self.stream:
            await LiveReply(self.name).whole(reply)
        return reply

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        """The scripted reply for this raw prompt, as raw text."""
        request = ModelRequest(options=dict(options), prompt=prompt)
        return _as_completion(self._answer(request))

    def _answer(self, request: ModelRequest) -> ChatResponse:
        self.requests.append(request)
        i = request.turn
        if i >= len(self.replies):
            raise AssertionError(
                f"{self!r} was asked for reply #{i + 1} (the conversation holds {i} assistant turns) but "
                f"its script has only {len(self.replies)}; last input: {_shown(request.last_input)}"
            )
        scripted = self.replies[i]
        for check in scripted.expect:
            _check(check, request, f"{self!r}, reply #{i + 1}")
        return _with_ids(scripted.response, i, self.name)


def _check(check: Expectation, request: ModelRequest, who: str) -> None:
    if isinstance(check, str):
        if check not in request.last_input:
            raise AssertionError(
                f"{who}: expected {check!r} in the last user/tool message, "
                f"which is {_shown(request.last_input)}"
            )
        return
    if check(request) is False:
        name = getattr(check, "__name__", repr(check))
        raise AssertionError(
            f"{who}: the expectation {name} rejected the request; last input: {_shown(request.last_input)}"
        )


_Reply = ChatResponse | str | Awaitable[ChatResponse | str]
ReplyFunction = Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], _Reply]
CompleteFunction = Callable[[str], _Reply]


async def _resolve(value: Any) -> ChatResponse:
    if inspect.isawaitable(value):
        value = await value
    if isinstance(value, str):
        return ChatResponse(content=value, finish_reason="stop")
    if isinstance(value, ScriptedReply):
        return value.response
    if not isinstance(value, ChatResponse):
        raise TypeError(f"a FunctionModel function must return a ChatResponse or a str, got {value!r}")
    return value


class FunctionModel:
    """A model whose replies come from ``fn(messages, tools)`` (sync or async), returning a
    ``ChatResponse`` or a ``str``; ``complete=`` is the same for raw prompts.

    Decide from the messages, not from counters kept in the function: steps are re-executed.
    Tool calls without ids get ``call_{turn}_{position}``.
    """

    def __init__(
        self, fn: ReplyFunction, *, complete: CompleteFunction | None = None, name: str = "function"
    ) -> None:
        self.fn = fn
        self.complete_fn = complete
        self.name = name
        self.requests: list[ModelRequest] = []

    def __repr__(self) -> str:
        return f"FunctionModel({getattr(self.fn, '__name__', self.fn)!r}, name={self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn, "complete_fn": self.complete_fn, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.requests = []

    async def chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None, **options: Any
    ) -> ChatResponse:
        """The reply ``fn`` gives for this conversation."""
        request = ModelRequest(tuple(messages), tuple(tools or ()), dict(options))
        self.requests.append(request)
        response = await _resolve(self.fn(request.messages, request.tools))
        return _with_ids(response, request.turn, self.name)

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        """The raw text ``complete`` gives for this prompt."""
        if self.complete_fn is None:
            raise TypeError(f"{self!r} got a raw prompt but has no complete= function")
        self.requests.append(ModelRequest(options=dict(options), prompt=prompt))
        response = await _resolve(self.complete_fn(prompt))
        return response.model_copy(update={"model": response.model or self.name})


def block_network_models(blocked: bool = True) -> contextlib.AbstractContextManager[None]:
    """Refuse (or allow again) model requests to non-loopback hosts in this process.

    Takes effect at once; used as ``with block_network_models(): ...`` it restores the
    previous setting on exit. The environment variable ``DFLOW_AGENTS_BLOCK_NETWORK=1`` does
    the same for every process that inherits it (worker processes included).
    """
    previous = _guard.set_blocked(blocked)

    @contextlib.contextmanager
    def restore() -> Any:
        try:
            yield None
        finally:
            _guard.set_blocked(previous)

    return restore()


def network_models_blocked() -> bool:
    """Whether model requests to non-loopback hosts are refused now (switch or environment)."""
    return _guard.is_blocked()
