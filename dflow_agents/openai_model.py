"""An OpenAI-compatible chat model (OpenAI, DashScope compatible mode, vLLM, Ollama)."""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from . import _guard
from ._openai_stream import StreamedCall
from ._openai_wire import map_sdk_error, parse_chat_body, parse_completion_body, wire_tool_choice
from .errors import ModelConfigError, ModelError
from .exchanges import note_http
from .messages import ChatMessage, ChatResponse, ToolSpec, to_openai_messages
from .qwen import QWEN_DEFAULT_SYSTEM, QWEN_STOP, parse_qwen_completion, render_qwen_prompt

if TYPE_CHECKING:
    import openai
    from typing_extensions import Self

__all__ = ["OpenAIChatModel"]

_RAW_DEFAULTS: dict[str, Any] = {"max_tokens": 1024, "stop": list(QWEN_STOP)}


def _import_openai() -> Any:
    try:
        import openai
    except ImportError:  # pragma: no cover - depends on the installation
        raise ModelConfigError(
            "OpenAIChatModel needs the openai package: pip install 'dflow-runtime[agents]'"
        ) from None
    return openai


def _check_stream(stream: object) -> None:
    if not isinstance(stream, bool):
        raise ModelConfigError(f"stream is True or False, got {stream!r:.80}")


class OpenAIChatModel:
    """A model behind an OpenAI-compatible HTTP API.

    ``model``, ``base_url`` and ``api_key`` come from the arguments, else from
    ``OPENAI_MODEL``, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (servers that need no key
    take any placeholder, such as ``"EMPTY"``). ``options`` are defaults for every request
    (``temperature``, ``max_tokens``...); ``timeout`` is per request, in seconds.

    ``stream=True`` asks for the reply as a stream of tokens, in either mode (and for
    ``complete``): while it arrives, each content delta and tool-call fragment (in raw
    mode, the text as the model writes it) is published as a live event of the step that
    called the model (``dflow.live``; followers read them from ``Run.aevents(live=True)``,
    the HTTP API and the console), and the call returns the whole reply, the same
    ``ChatResponse`` as without streaming (see the agents' streaming docs). A stream
    that drops mid-answer raises :class:`ModelConnectionError`, as a dropped non-streamed
    call does. Add ``options={"stream_options": {"include_usage": True}}`` for the token
    usage on servers that send it only when asked.

    ``mode="chat"`` uses ``/chat/completions`` with native tool calls. ``mode="raw"`` is for
    models served without them: the conversation is rendered as a Qwen2.5 prompt (with
    ``default_system`` when it has no system message), sent to ``/completions``, and the calls
    are parsed out of the text (see :mod:`dflow_agents.qwen`).

    The client never retries or sleeps: HTTP 429 raises :class:`ModelRateLimitError` (with
    ``retry_after``), timeouts :class:`ModelTimeoutError`; both are
    :class:`ModelRetryableError`, which the calling step retries with a store timer::

        DFlow.just(state).map(think).id("think").retry(5, backoff=2.0, on=ModelRetryableError)

    It holds an HTTP client and an API key, so it refuses to be pickled into a stored flow.
    Declare it at import time in a module every worker imports::

        model = dflow.shared(OpenAIChatModel("qwen-plus"), "model")

    Flows that capture it then carry only the name ``"model"``, and each worker uses its own
    instance (one HTTP client per event loop).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        mode: Literal["chat", "raw"] = "chat",
        timeout: float = 120.0,
        options: Mapping[str, Any] | None = None,
        default_headers: Mapping[str, str] | None = None,
        default_system: str | None = QWEN_DEFAULT_SYSTEM,
        stream: bool = False,
    ) -> None:
        if mode not in ("chat", "raw"):
            raise ModelConfigError(
                f"mode must be 'chat' (native tool calls) or 'raw' (Qwen prompt), got {mode!r}"
            )
        _check_stream(stream)
        model = model or os.environ.get("OPENAI_MODEL")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        api_key = api_key or os.environ.get("OPENAI_API_KEY")
        missing = [
            what
            for what, value in (
                ("a model name (model= or OPENAI_MODEL)", model),
                ("a base URL (base_url= or OPENAI_BASE_URL, e.g. https://api.openai.com/v1)", base_url),
                (
                    "an API key (api_key= or OPENAI_API_KEY; any placeholder for servers without keys)",
                    api_key,
                ),
            )
            if not value
        ]
        if missing:
            raise ModelConfigError("OpenAIChatModel needs " + " and ".join(missing))
        if not str(base_url).startswith(("http://", "https://")):
            raise ModelConfigError(f"the base URL must start with http:// or https://, got {base_url!r}")
        if timeout <= 0:
            raise ModelConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
        assert model is not None and base_url is not None and api_key is not None
        self._model = model
        self._base_url = str(base_url).rstrip("/")
        self._api_key = api_key
        self._mode: Literal["chat", "raw"] = mode
        self._timeout = float(timeout)
        self._options = dict(options or {})
        self._headers = dict(default_headers or {})
        self._default_system = default_system
        self._stream = stream
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def model(self) -> str:
        """The model name sent with each request."""
        return self._model

    @property
    def base_url(self) -> str:
        """The server's base URL (the endpoint named in errors)."""
        return self._base_url

    @property
    def stream(self) -> bool:
        """Whether replies stream (see the class)."""
        return self._stream

    @property
    def mode(self) -> Literal["chat", "raw"]:
        """``"chat"`` (native tool calls) or ``"raw"`` (Qwen prompt on /completions)."""
        return self._mode

    def __repr__(self) -> str:
        streams = ", stream=True" if self._stream else ""
        return f"OpenAIChatModel(model={self._model!r}, base_url={self._base_url!r}, mode={self._mode!r}{streams})"

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] | None = None,
        **options: Any,
    ) -> ChatResponse:
        """Answer ``messages``; the reply may call ``tools``. Raises ``ModelError`` subclasses.

        ``tool_choice`` (``"auto"``, ``"required"``, ``"none"`` or a tool's name) is sent with
        the tools, ``"auto"`` unless said (some servers leave the tools out of the prompt
        without it). In raw mode it shapes the prompt: ``"none"`` shows no tools, a name
        only that tool, and ``"required"`` or a name tells the model to call.
        """
        turn = sum(1 for m in messages if m.role == "assistant")
        body = {**self._options, **options}
        choice = body.pop("tool_choice", None)
        if self._mode == "raw":
            prompt = render_qwen_prompt(
                messages, tools, default_system=self._default_system, tool_choice=choice
            )
            reply = await self.complete(prompt, **options)
            parsed = parse_qwen_completion(reply.content, id_prefix=f"call_{turn}_")
            return reply.model_copy(update={"content": parsed.content, "tool_calls": parsed.tool_calls})
        if tools:
            body["tools"] = [t.to_openai() for t in tools]
            body["tool_choice"] = wire_tool_choice(choice)
        if self._stream:
            return await self._streamed(
                {"messages": to_openai_messages(messages)}, body, id_prefix=f"call_{turn}_"
            )
        text = await self._post("chat", to_openai_messages(messages), body)
        return parse_chat_body(text, endpoint=self._base_url, id_prefix=f"call_{turn}_")

    async def complete(self, prompt: str, **options: Any) -> ChatResponse:
        """Continue a raw ``prompt`` on ``/completions``; the text is the ``content``.

        Unless set, ``max_tokens`` is 1024 (servers default to 16) and ``stop`` is the
        ChatML end markers.
        """
        body = {**_RAW_DEFAULTS, **self._options, **options}
        body.pop("tool_choice", None)  # the prompt says what the model may call
        if self._stream:
            return await self._streamed({"prompt": prompt}, body, id_prefix="")
        text = await self._post("raw", prompt, body)
        return parse_completion_body(text, endpoint=self._base_url)

    async def aclose(self) -> None:
        """Close the HTTP client of the running event loop (a new one opens on next use)."""
        sdk = self._clients.pop(asyncio.get_running_loop(), None)
        if sdk is not None:
            await sdk.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{self!r} cannot be pickled: it holds an HTTP client and an API key, which must not be "
            "stored with a flow. Declare it at import time in a module every worker imports, e.g. "
            'model = dflow.shared(OpenAIChatModel(...), "model"); flows then carry the name only'
        )

    def __copy__(self) -> OpenAIChatModel:
        return self  # a shared resource, like a connection pool

    def __deepcopy__(self, memo: dict[int, Any]) -> OpenAIChatModel:
        return self

    def _client(self) -> openai.AsyncOpenAI:
        """The SDK client of the running event loop (HTTP connections belong to one loop)."""
        loop = asyncio.get_running_loop()
        sdk = self._clients.get(loop)
        if sdk is None:
            sdk = _import_openai().AsyncOpenAI(
                api_key=self._api_key,
                base_url=self._base_url,
                max_retries=0,  # retries belong to the dflow step (a store timer), never a sleep here
                timeout=self._timeout,
                default_headers=self._headers or None,
            )
            self._clients[loop] = sdk
        return sdk

    async def _streamed(
        self, payload: dict[str, Any], body: dict[str, Any], *, id_prefix: str
    ) -> ChatResponse:
        """A streamed call: ``payload`` is ``{"messages": [...]}`` (a chat call) or
        ``{"prompt": text}`` (a raw completion)."""
        _guard.check_allowed(self._base_url)
        model = body.pop("model", self._model)
        timeout = body.pop("timeout", self._timeout)
        completing = "prompt" in payload
        call = StreamedCall(self._base_url, self._api_key, model, raw=completing)
        reply, raw = await call.run(self._client(), {**body, **payload}, timeout, id_prefix)
        endpoint = "completions" if completing else "chat/completions"
        wire = {k: v for k, v in payload.items() if k == "prompt"}  # (chat messages: in the noted request)
        note_http(lambda: {"endpoint": endpoint, "model": model, "stream": True, **body, **wire}, raw)
        return reply

    async def _post(self, kind: Literal["chat", "raw"], payload: Any, body: dict[str, Any]) -> str:
        _guard.check_allowed(self._base_url)
        openai = _import_openai()
        client = self._client()
        model = body.pop("model", self._model)
        timeout = body.pop("timeout", self._timeout)
        error: ModelError | None = None
        text: str = ""
        try:
            if kind == "chat":
                chat = await client.chat.completions.with_raw_response.create(
                    model=model, messages=payload, extra_body=body, timeout=timeout
                )
                text = chat.http_response.text
            else:
                raw = await client.completions.with_raw_response.create(
                    model=model, prompt=payload, extra_body=body, timeout=timeout
                )
                text = raw.http_response.text
        except openai.APIError as exc:
            error = map_sdk_error(exc, endpoint=self._base_url, secret=self._api_key)
        if error is not None:
            # Raised outside the except block: the SDK exception holds the request and its
            # Authorization header, so it must not travel as our error's context.
            raise error
        endpoint = "chat/completions" if kind == "chat" else "completions"
        wire = {} if kind == "chat" else {"prompt": payload}  # (chat messages: in the noted request)
        note_http(lambda: {"endpoint": endpoint, "model": model, **body, **wire}, text)
        return text
