"""Model fallback: a turn that the first model cannot answer goes to the next.

:class:`ModelFallback` is itself a model (``chat`` and ``complete``), so it goes wherever an
agent takes one: ``ToolCallAgent(name, ModelFallback([primary, backup]), ...)`` (or just
``model=[primary, backup]``), the planner of a ``PlanningFlow``, the ReAct executor, the
model of an ``AIFunction``. Each request asks the models in order; a model that fails with
one of ``on`` (a timeout, a rate limit, a connection error, a server error, an open circuit)
is skipped, and the next one is asked at once. The reply says which model answered
(``ChatResponse.model`` when the model did not name itself) and why each model before it was
skipped (``ChatResponse.skipped``); the agents record both in the turn's step.

A model may be given a :class:`dflow.Circuit`: its calls go through it, so its failures
open the circuit (in every process on the store), and while it is open the model is
skipped without being asked, or waited for. When every model failed or was skipped, the
request fails with :class:`ModelFallbackError`, a retryable error carrying the soonest
``retry_after`` any of them asked for: the agent's retry policy (``ModelCalls.attempts``)
tries the whole list again then.

Any other error (a request the server refused as malformed, a wrong API key, a bug) is
raised at once: asking another model would hide it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dflow import Circuit, CircuitOpenError

from .errors import ModelRetryableError
from .exchanges import asked, chat_request, completion_request, model_label
from .messages import ChatMessage, ChatResponse, SkippedModel, ToolSpec
from .model import ChatModel, CompletionModel

__all__ = ["DEFAULT_FALLBACK_ON", "ModelFallback", "ModelFallbackError"]

#: what makes a model be skipped for the next, by default: its retryable failures (rate
#: limit, timeout, connection, server error), an open circuit, and plain timeouts and
#: connection errors of models that raise those
DEFAULT_FALLBACK_ON: tuple[type[BaseException], ...] = (
    ModelRetryableError,
    CircuitOpenError,
    TimeoutError,
    ConnectionError,
)
_MAX_REASON = 300


class ModelFallbackError(ModelRetryableError):
    """Every model of a :class:`ModelFallback` failed or was skipped. ``skipped`` says why,
    model by model; ``retry_after`` is the soonest any of them asked to be tried again (an
    open circuit's cool-down, a rate limit's wait), or ``None``."""

    def __init__(self, message: str, *, skipped: Sequence[SkippedModel], retry_after: float | None) -> None:
        super().__init__(message)
        self.skipped = list(skipped)
        self.retry_after = retry_after


class ModelFallback:
    """Models asked in order for each request (see the module).

    Args:
        models: the models, first choice first (at least one); ``ChatModel`` and/or
            ``CompletionModel`` objects.
        circuits: a circuit per model (``None`` for a model without one), in the order of
            ``models``; a model whose circuit is open is skipped without being asked.
        on: the failures that make a model be skipped (default :data:`DEFAULT_FALLBACK_ON`).
        name: how records name this list (default: ``"fallback"``).
    """

    def __init__(
        self,
        models: Sequence[ChatModel | CompletionModel],
        *,
        circuits: Sequence[Circuit | None] | None = None,
        on: tuple[type[BaseException], ...] = DEFAULT_FALLBACK_ON,
        name: str = "fallback",
    ) -> None:
        models = list(models)
        if not models:
            raise ValueError("ModelFallback needs at least one model")
        for m in models:
            if not isinstance(m, (ChatModel, CompletionModel)):
                raise TypeError(f"ModelFallback takes models with chat() or complete(), got {m!r:.80}")
        guards: list[Circuit | None] = [None] * len(models) if circuits is None else list(circuits)
        if len(guards) != len(models):
            raise ValueError(
                f"ModelFallback has {len(models)} models and {len(guards)} circuits: give one per model "
                "(None for a model without one)"
            )
        for c in guards:
            if c is not None and not isinstance(c, Circuit):
                raise TypeError(f"ModelFallback circuits are dflow.Circuit objects or None, got {c!r:.80}")
        if not isinstance(on, tuple) or not all(
            isinstance(k, type) and issubclass(k, BaseException) for k in on
        ):
            raise TypeError(f"ModelFallback on= is a tuple of exception classes, got {on!r:.80}")
        self.models = models
        self.circuits = guards
        self.on = on
        self.name = name

    def __repr__(self) -> str:
        return f"ModelFallback([{', '.join(model_label(m) for m in self.models)}])"

    @property
    def mode(self) -> str | None:
        """The first model's ``mode`` (``"raw"`` makes the ReAct executor send raw prompts)."""
        first = self.models[0]
        return "raw" if not isinstance(first, ChatModel) else getattr(first, "mode", None)

    async def chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None = None, **options: Any
    ) -> ChatResponse:
        """The reply of the first model that answers (see the module); models without
        ``chat`` are passed over."""

        def asker(model: object) -> Callable[[], Awaitable[ChatResponse]] | None:
            if not isinstance(model, ChatModel):
                return None

            async def ask() -> ChatResponse:
                return await asked(
                    model_label(model),
                    lambda: chat_request(messages, tools, options),
                    lambda: model.chat(messages, tools, **options),
                )

            return ask

        return await self._first(asker, "chat")

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        """The continuation of the first model that answers; models without ``complete``
        are passed over."""

        def asker(model: object) -> Callable[[], Awaitable[ChatResponse]] | None:
            if not isinstance(model, CompletionModel):
                return None

            async def ask() -> ChatResponse:
                return await asked(
                    model_label(model),
                    lambda: completion_request(prompt, options),
                    lambda: model.complete(prompt, **options),
                )

            return ask

        return await self._first(asker, "complete")

    async def _first(
        self, asker: Callable[[object], Callable[[], Awaitable[ChatResponse]] | None], what: str
    ) -> ChatResponse:
        skipped: list[SkippedModel] = []
        waits: list[float] = []
        asked = 0
        for model, circuit in zip(self.models, self.circuits):
            ask = asker(model)
            if ask is None:
                continue
            asked += 1
            try:
                response = await _through(circuit, ask)
            except self.on as exc:
                skipped.append(_skipped(model, exc))
                wait = getattr(exc, "retry_after", None)
                if isinstance(wait, (int, float)) and wait >= 0:
                    waits.append(float(wait))
                continue
            return response.model_copy(
                update={
                    "model": response.model or model_label(model),
                    "skipped": [*response.skipped, *skipped],
                }
            )
        if not asked:
            raise TypeError(f"none of the models of {self!r} has {what}()")
        reasons = "; ".join(f"{s.model}: {s.reason}" for s in skipped)
        raise ModelFallbackError(
            f"no model of {self!r} answered: {reasons}", skipped=skipped, retry_after=min(waits, default=None)
        )


async def _through(circuit: Circuit | None, ask: Callable[[], Awaitable[ChatResponse]]) -> ChatResponse:
    """``ask()``, through ``circuit`` when there is one (``CircuitOpenError`` at once when it
    is open)."""
    if circuit is None:
        return await ask()
    async with circuit:
        return await ask()


def _skipped(model: object, exc: BaseException) -> SkippedModel:
    reason = f"{type(exc).__name__}: {exc}"
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 1] + "…"
    return SkippedModel(model=model_label(model), error=type(exc).__name__, reason=reason)


def as_model(model: Any) -> Any:
    """``model``, or a :class:`ModelFallback` of it when it is a list or tuple of models."""
    if isinstance(model, (list, tuple)):
        return ModelFallback(model)
    return model


def model_call(response: ChatResponse) -> dict[str, Any]:
    """What a turn's step records of who answered: the model, and those skipped and why."""
    record: dict[str, Any] = {"model": response.model}
    if response.skipped:
        record["skipped"] = [s.model_dump(mode="json") for s in response.skipped]
    return record
