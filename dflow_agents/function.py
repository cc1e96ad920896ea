"""An AI function: four replaceable parts composed into one async call.

``inputs -> formatter -> template -> model -> parser -> result``

* **formatter** ``(inputs) -> variables``: shapes the caller's dict (the call's tools are
  under ``inputs["tools"]`` as ``ToolSpec``s);
* **template** ``(variables) -> prompt``: a list of ``ChatMessage`` or a raw ``str``;
* **model** ``async (prompt, tools) -> ChatResponse``: the model and its settings
  (:class:`ModelConfig` wraps a ``ChatModel``; a ``str`` prompt goes to ``complete``);
* **parser** ``(response) -> result``.

Each part is a plain callable, swapped per instance (``fn.with_parts(parser=...)``) or per
call (``await fn(inputs, parser=...)``). :meth:`AIFunction.chat` and :meth:`AIFunction.qwen`
give the native tool-call path and the Qwen2.5 raw-prompt path.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from .exchanges import asked, chat_request, completion_request, model_label
from .messages import ChatMessage, ChatResponse, ToolSpec
from .model import ChatModel, CompletionModel
from .qwen import QWEN_DEFAULT_SYSTEM, parse_qwen_completion, render_qwen_prompt
from .tools import Tool

__all__ = [
    "AIFunction",
    "ModelConfig",
    "chat_formatter",
    "chat_template",
    "qwen_parser",
    "qwen_template",
    "response_parser",
]

R = TypeVar("R")

Prompt = Sequence[ChatMessage] | str
InputFormatter = Callable[[Mapping[str, Any]], Mapping[str, Any]]
PromptTemplate = Callable[[Mapping[str, Any]], Prompt]
ModelPart = Callable[[Prompt, Sequence[ToolSpec]], Awaitable[ChatResponse]]
OutputParser = Callable[[ChatResponse], Any]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model part: a model and the request options to use with it.

    Called with a list of messages it asks ``model.chat`` (with the tools); with a ``str``
    prompt it asks ``model.complete``.
    """

    model: ChatModel | CompletionModel
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    async def __call__(self, prompt: Prompt, tools: Sequence[ToolSpec]) -> ChatResponse:
        """Send ``prompt`` to the model."""
        if isinstance(prompt, str):
            if not isinstance(self.model, CompletionModel):
                raise TypeError(
                    f"the template rendered a raw prompt, but {self.model!r} has no complete(); use a "
                    "raw-completion model (OpenAIChatModel(..., mode='raw')) or a chat template"
                )
            model, text = self.model, prompt
            return await asked(
                model_label(model),
                lambda: completion_request(text, self.options),
                lambda: model.complete(text, **self.options),
            )
        if not isinstance(self.model, ChatModel):
            raise TypeError(f"the template rendered messages, but {self.model!r} has no chat()")
        chat, messages, offered = self.model, list(prompt), list(tools) or None
        return await asked(
            model_label(chat),
            lambda: chat_request(messages, offered, self.options),
            lambda: chat.chat(messages, offered, **self.options),
        )


def _messages(value: Any) -> list[ChatMessage]:
    return [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in value or ()]


def chat_formatter(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The default formatter: ``system`` + ``messages`` + ``input`` + ``next_step`` as one
    conversation (``messages`` may be ``ChatMessage``s or their dicts), ``tools``, and
    ``tool_choice`` when one is given.

    Returns ``{"messages": [...], "tools": [...]}`` (and ``"tool_choice"``).
    """
    messages: list[ChatMessage] = []
    if inputs.get("system"):
        messages.append(ChatMessage.system(str(inputs["system"])))
    messages += _messages(inputs.get("messages"))
    for key in ("input", "next_step"):
        if inputs.get(key):
            messages.append(ChatMessage.user(str(inputs[key])))
    if not messages:
        raise ValueError("the AI function got no conversation: give 'messages', 'input' or 'system'")
    variables: dict[str, Any] = {"messages": messages, "tools": list(inputs.get("tools") or ())}
    if inputs.get("tool_choice") is not None:
        variables["tool_choice"] = inputs["tool_choice"]
    return variables


def chat_template(variables: Mapping[str, Any]) -> list[ChatMessage]:
    """The native template: the conversation as it is (the model gets the tools natively)."""
    return _messages(variables["messages"])


def qwen_template(variables: Mapping[str, Any]) -> str:
    """The Qwen2.5 template: the conversation and its tools rendered as one ChatML prompt
    (``tool_choice`` shapes which tools it lists, see :func:`render_qwen_prompt`)."""
    system = variables.get("default_system", QWEN_DEFAULT_SYSTEM)
    return render_qwen_prompt(
        _messages(variables["messages"]),
        variables.get("tools"),
        default_system=system,
        tool_choice=variables.get("tool_choice"),
    )


def response_parser(response: ChatResponse) -> ChatResponse:
    """The native parser: the response as it is."""
    return response


def qwen_parser(response: ChatResponse) -> ChatResponse:
    """The Qwen2.5 parser: tool calls recovered from the completion text."""
    parsed = parse_qwen_completion(response.content)
    return response.model_copy(update={"content": parsed.content, "tool_calls": parsed.tool_calls})


def _spec(t: Tool | ToolSpec) -> ToolSpec:
    return t.spec if isinstance(t, Tool) else t


_PARTS = ("model", "template", "formatter", "parser", "tools")


@dataclasses.dataclass(frozen=True)
class AIFunction(Generic[R]):
    """``inputs -> formatter -> template -> model -> parser -> result``, every part replaceable.

    ``model`` is a :class:`ModelConfig` or any ``async (prompt, tools) -> ChatResponse``; a
    bare ``ChatModel`` is wrapped in a ``ModelConfig``. ``tools`` are ``Tool``s or
    ``ToolSpec``s. Picklable when its parts are (declare real models with ``dflow.shared``).
    """

    model: ModelPart
    template: PromptTemplate = chat_template
    formatter: InputFormatter = chat_formatter
    parser: Callable[[ChatResponse], R] = response_parser  # type: ignore[assignment]  # pyright: ignore[reportAssignmentType]
    tools: tuple[ToolSpec, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.model, (ChatModel, CompletionModel)) and not isinstance(self.model, ModelConfig):
            object.__setattr__(self, "model", ModelConfig(self.model))
        object.__setattr__(self, "tools", tuple(_spec(t) for t in self.tools))

    @classmethod
    def chat(
        cls, model: ChatModel | ModelPart, *, tools: Sequence[Tool | ToolSpec] = (), **options: Any
    ) -> AIFunction[ChatResponse]:
        """The native tool-call path: messages in, ``ChatResponse`` out."""
        part = ModelConfig(model, options) if isinstance(model, ChatModel) else model
        return AIFunction(model=part, tools=tuple(_spec(t) for t in tools))

    @classmethod
    def qwen(
        cls, model: CompletionModel | ModelPart, *, tools: Sequence[Tool | ToolSpec] = (), **options: Any
    ) -> AIFunction[ChatResponse]:
        """The Qwen2.5 raw path: a ChatML prompt to ``complete``, calls parsed from the text."""
        part = ModelConfig(model, options) if isinstance(model, CompletionModel) else model
        return AIFunction(
            model=part,
            template=qwen_template,
            parser=qwen_parser,
            tools=tuple(_spec(t) for t in tools),
        )

    def with_parts(self, **parts: Any) -> AIFunction[Any]:
        """A copy with some parts replaced: ``model``, ``template``, ``formatter``, ``parser``, ``tools``."""
        unknown = set(parts) - set(_PARTS)
        if unknown:
            raise TypeError(f"unknown AI function part(s) {sorted(unknown)}; the parts are {list(_PARTS)}")
        return dataclasses.replace(self, **parts)

    async def __call__(self, inputs: Mapping[str, Any], **parts: Any) -> R:
        """Run the function on ``inputs``; keyword ``parts`` replace parts for this call only.

        ``inputs["tools"]``, when given, replaces the function's tools for this call;
        ``inputs["tool_choice"]`` goes to a chat model as the request's ``tool_choice`` (a
        :class:`ModelConfig` model part) and shapes a Qwen prompt (see :func:`qwen_template`).
        """
        fn: AIFunction[Any] = self.with_parts(**parts) if parts else self
        tools = [_spec(t) for t in inputs["tools"]] if inputs.get("tools") is not None else list(fn.tools)
        variables = fn.formatter({**inputs, "tools": tools})
        prompt = fn.template(variables)
        model = fn.model
        choice = variables.get("tool_choice")
        if choice is not None and isinstance(model, ModelConfig) and not isinstance(prompt, str):
            model = dataclasses.replace(model, options={**model.options, "tool_choice": choice})
        response = await model(prompt, tools)
        result = fn.parser(response)
        if inspect.isawaitable(result):
            result = await result
        return cast(R, result)
