"""Reading OpenAI-compatible response bodies and errors, tolerantly, into our types."""

from __future__ import annotations

import email.utils
import importlib
import json
import time
from collections.abc import Mapping
from typing import Any

from . import _loose_json
from .errors import (
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelResponseError,
    ModelServerError,
    ModelStatusError,
    ModelTimeoutError,
)
from .messages import ChatResponse, ToolCall, Usage

__all__ = [
    "map_sdk_error",
    "parse_chat_body",
    "parse_completion_body",
    "retry_after",
    "scrub",
    "wire_tool_choice",
]

_SNIPPET = 300


def scrub(text: str, secret: str | None) -> str:
    """``text`` without ``secret`` in it (servers sometimes echo the key they were sent)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return text


def _snippet(text: str) -> str:
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + f"... ({len(text)} characters)"


def _bad(endpoint: str, what: str) -> ModelResponseError:
    return ModelResponseError(
        f"the model endpoint {endpoint} sent a response we cannot use: {what}", endpoint=endpoint
    )


def _load(text: str, endpoint: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise _bad(endpoint, f"the body is not JSON: {_snippet(text)!r}") from None
    if not isinstance(data, dict):
        raise _bad(endpoint, f"the body is a JSON {type(data).__name__}, not an object: {_snippet(text)!r}")
    if "choices" not in data and data.get("error"):
        raise _error_in_body(data["error"], endpoint)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _bad(endpoint, f"it has no 'choices' list with an object in it: {_snippet(text)!r}")
    return data


def _error_in_body(error: Any, endpoint: str) -> ModelError:
    """Some gateways answer 200 with ``{"error": ...}``; a rate limit there is still one."""
    info = error if isinstance(error, dict) else {"message": str(error)}
    message = str(info.get("message") or info)
    kind = f"{info.get('code', '')} {info.get('type', '')}".lower()
    if "429" in kind or "rate" in kind or "throttl" in kind:
        return ModelRateLimitError(
            f"the model endpoint {endpoint} is rate limiting: {message}", endpoint=endpoint
        )
    return ModelResponseError(
        f"the model endpoint {endpoint} answered with an error: {message}", endpoint=endpoint
    )


def _usage(data: Mapping[str, Any]) -> Usage:
    raw = data.get("usage")
    if not isinstance(raw, dict):
        return Usage()

    def num(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) else 0

    prompt, completion = num("prompt_tokens"), num("completion_tokens")
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=num("total_tokens") or prompt + completion,
    )


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    if raw is None or raw == "":
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    text = raw if isinstance(raw, str) else json.dumps(raw)
    try:
        value = _loose_json.loads(text)
    except ValueError:
        return {}, text
    return (value, None) if isinstance(value, dict) else ({}, text)


def _tool_call(item: Any, n: int, id_prefix: str, endpoint: str) -> ToolCall:
    fn = item.get("function") if isinstance(item, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise _bad(endpoint, f"tool call #{n} has no function name: {_snippet(json.dumps(item))!r}")
    args, raw = _arguments(fn.get("arguments"))
    given = item.get("id")
    call_id = given if isinstance(given, str) and given else f"{id_prefix}{n}"
    return ToolCall(id=call_id, name=fn["name"], arguments=args, raw_arguments=raw)


def wire_tool_choice(choice: Any) -> Any:
    """``tool_choice`` as the chat-completions body carries it: ``"auto"`` when none is
    given, a tool's name as ``{"type": "function", "function": {"name": ...}}``."""
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice not in ("auto", "required", "none"):
        return {"type": "function", "function": {"name": choice}}
    return choice


def parse_chat_body(text: str, *, endpoint: str, id_prefix: str) -> ChatResponse:
    """A chat-completions body as a ``ChatResponse``.

    Accepts ``content: null`` or content parts, missing call ids (``{id_prefix}{n}``) and
    the legacy ``function_call`` field. Calls the model wrote in its text stay text here:
    the agents read them (:func:`~dflow_agents.read_text_tool_calls`).
    """
    data = _load(text, endpoint)
    choice = data["choices"][0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _bad(endpoint, f"choice 0 has no 'message' object: {_snippet(text)!r}")
    content = _text(message.get("content"))
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _bad(endpoint, f"'tool_calls' is not a list: {_snippet(text)!r}")
    calls = [_tool_call(item, n, id_prefix, endpoint) for n, item in enumerate(raw_calls)]
    legacy = message.get("function_call")
    if not calls and isinstance(legacy, dict):
        calls = [_tool_call({"function": legacy}, 0, id_prefix, endpoint)]
    finish = choice.get("finish_reason")
    model = data.get("model")
    return ChatResponse(
        content=content,
        tool_calls=calls,
        usage=_usage(data),
        finish_reason=finish if isinstance(finish, str) else None,
        model=model if isinstance(model, str) else None,
    )


def parse_completion_body(text: str, *, endpoint: str) -> ChatResponse:
    """A completions body as a ``ChatResponse`` whose content is the raw continuation."""
    data = _load(text, endpoint)
    choice = data["choices"][0]
    if "text" in choice:
        content = _text(choice["text"])
    elif isinstance(choice.get("message"), dict):
        content = _text(choice["message"].get("content"))
    else:
        raise _bad(endpoint, f"choice 0 has no 'text': {_snippet(text)!r}")
    finish = choice.get("finish_reason")
    model = data.get("model")
    return ChatResponse(
        content=content,
        usage=_usage(data),
        finish_reason=finish if isinstance(finish, str) else None,
        model=model if isinstance(model, str) else None,
    )


def retry_after(headers: Mapping[str, str] | Any) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``retry-after``), or None."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000.0)
        value = headers.get("retry-after")
    except (AttributeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        return json.dumps(body)[:_SNIPPET]
    if isinstance(body, str) and body:
        return _snippet(body)
    return str(getattr(exc, "message", "") or exc)


_HINTS = {
    401: "check the API key (OPENAI_API_KEY or api_key=)",
    403: "the API key is not allowed to use this model or endpoint",
    404: "check the base URL (it usually ends in /v1) and the model name",
}


def _dropped_errors() -> tuple[type[BaseException], ...]:
    """The transport errors of a connection that was made and then lost mid-exchange (the
    peer closed it early, or reset it), as the HTTP clients the ``openai`` SDK runs on raise
    them (``httpx2``, or ``httpx`` when it is given one); refused connections, DNS and TLS
    failures are not among them."""
    found: list[type[BaseException]] = []
    for module in ("httpx2", "httpx"):
        try:
            http = importlib.import_module(module)
        except ImportError:
            continue
        for name in ("RemoteProtocolError", "ReadError", "WriteError"):
            cls = getattr(http, name, None)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return tuple(found)


def map_sdk_error(exc: Exception, *, endpoint: str, secret: str | None) -> ModelError:
    """The ``ModelError`` for an exception of the ``openai`` SDK (the most specific one)."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return ModelTimeoutError(f"the model endpoint {endpoint} did not answer in time", endpoint=endpoint)
    if isinstance(exc, openai.APIConnectionError):
        cause = scrub(str(exc.__cause__ or exc) or type(exc.__cause__ or exc).__name__, secret)
        if isinstance(exc.__cause__, _dropped_errors()):
            return ModelConnectionError(
                f"the connection to the model endpoint {endpoint} dropped before its answer was complete "
                f"(the server closed or reset it: did it crash or restart?): {cause}",
                endpoint=endpoint,
            )
        return ModelConnectionError(f"cannot reach the model endpoint {endpoint}: {cause}", endpoint=endpoint)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = scrub(_detail(exc), secret)
        wait = retry_after(exc.response.headers)
        said = f"the model endpoint {endpoint} answered HTTP {status}: {detail}"
        if status == 429:
            return ModelRateLimitError(said, endpoint=endpoint, retry_after=wait)
        if status == 408:
            return ModelTimeoutError(said, endpoint=endpoint)
        if status >= 500 or status == 409:
            return ModelServerError(said, endpoint=endpoint, status_code=status, retry_after=wait)
        hint = _HINTS.get(status)
        return ModelStatusError(f"{said}; {hint}" if hint else said, endpoint=endpoint, status_code=status)
    return ModelResponseError(
        f"the model endpoint {endpoint} failed: {type(exc).__name__}: {scrub(str(exc), secret)}",
        endpoint=endpoint,
    )
