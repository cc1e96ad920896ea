"""Assembling a streamed chat completion, or a streamed raw completion (``/completions``:
each chunk's choice has ``text``), into the body a non-streamed call would have had,
tolerantly, as real servers send it.

Each chunk is one ``data: {...}`` line's object. What real servers do, and what is done with it:

- chunks with ``choices: []`` (a keep-alive, the role-only first chunk of some gateways) and
  a usage-only last chunk (``stream_options.include_usage``): their ``usage`` is kept;
- content deltas as strings or content parts; ``reasoning_content`` is not the answer;
- tool calls in fragments: the first one of a call with its ``index``, ``id`` and ``name``,
  then its ``arguments`` split anywhere, calls of one turn interleaved by ``index``; servers
  that send no ``index`` (a new ``id`` starts a new call) or repeat the full name;
- the legacy ``function_call`` delta;
- ``finish_reason`` in the last content chunk or in a chunk of its own, any value
  (``stop``, ``tool_calls``, ``length``, ``content_filter``, ``eos``...), kept as it came;
- an ``error`` object in the stream (a gateway's failure mid-answer).

A stream that ends with neither a ``finish_reason`` nor ``data: [DONE]`` dropped
mid-answer: ``dropped`` says so. ``StreamedCall`` makes the request, reads the lines and
publishes each delta as a live event of the step running here (``dflow.live``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ._live_reply import LiveReply
from ._openai_wire import (
    _dropped_errors,
    _error_in_body,
    _text,
    map_sdk_error,
    parse_chat_body,
    parse_completion_body,
    scrub,
)
from .errors import ModelConnectionError, ModelError, ModelResponseError
from .messages import ChatResponse

__all__ = ["StreamAssembly", "StreamedCall", "ToolCallDelta"]


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call as it streamed: the call's place in the reply, and the
    name and arguments text it added."""

    index: int
    name: str
    arguments: str


@dataclass
class StreamAssembly:
    """The chunks of one streamed reply, added in order (``add``), as a reply (``body``, ``reply``)."""

    endpoint: str
    content: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    chunks: int = 0
    done: bool = False  # (``data: [DONE]`` came)

    def add(self, chunk: Any) -> tuple[str, list[ToolCallDelta]]:
        """Take one chunk; the content text and the tool-call fragments it added."""
        self.chunks += 1
        if not isinstance(chunk, dict):
            return "", []
        if chunk.get("error") and not chunk.get("choices"):
            raise _error_in_body(chunk["error"], self.endpoint)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if self.model is None and isinstance(chunk.get("model"), str):
            self.model = chunk["model"]
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return "", []
        text, deltas = "", []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue  # (n > 1: the first choice is the answer, as in the non-streamed path)
            said, fragments = self._choice(choice)
            text += said
            deltas += fragments
        return text, deltas

    def _choice(self, choice: dict[str, Any]) -> tuple[str, list[ToolCallDelta]]:
        finish = choice.get("finish_reason")
        if isinstance(finish, str) and finish:
            self.finish_reason = finish
        delta = _obj(choice.get("delta")) or _obj(choice.get("message"))
        text = _text(delta.get("content") if delta else choice.get("text"))  # (a raw completion: its text)
        if text:
            self.content.append(text)
        raw = delta.get("tool_calls")
        items = list(raw) if isinstance(raw, list) else []
        legacy = delta.get("function_call")
        if not items and isinstance(legacy, dict):
            items = [{"index": 0, "function": legacy}]
        return text, [d for d in (self._fragment(item) for item in items) if d is not None]

    def _fragment(self, item: Any) -> ToolCallDelta | None:
        if not isinstance(item, dict):
            return None
        index = self._index(item)
        call = self.calls.setdefault(index, _Call())
        if isinstance(item.get("id"), str) and item["id"]:
            call.id = item["id"]
        fn = _obj(item.get("function"))
        given_name = fn.get("name")
        name = given_name if isinstance(given_name, str) else ""
        if name and name != call.name:
            call.name = name if not call.name or name.startswith(call.name) else call.name + name
        args = fn.get("arguments")
        piece = args if isinstance(args, str) else ("" if args is None else json.dumps(args))
        if isinstance(args, dict):
            call.arguments = piece  # (a server that sends the arguments whole, as an object)
        else:
            call.arguments += piece
        return ToolCallDelta(index, name, piece)

    def _index(self, item: dict[str, Any]) -> int:
        index = item.get("index")
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return index
        given = item.get("id")  # no index: a new id is a new call, else the latest call goes on
        if isinstance(given, str) and given:
            for i, call in self.calls.items():
                if call.id == given:
                    return i
            return len(self.calls)
        return max(self.calls, default=0)

    @property
    def dropped(self) -> bool:
        """Whether the stream ended before the answer was complete: no ``finish_reason``
        and no ``data: [DONE]``."""
        return self.finish_reason is None and not self.done

    def text(self) -> str:
        """The content so far."""
        return "".join(self.content)

    def body(self) -> dict[str, Any]:
        """The non-streamed chat-completions body of this reply."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text() or None}
        if self.calls:
            message["tool_calls"] = [
                {
                    **({"id": c.id} if c.id else {}),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for _, c in sorted(self.calls.items())
            ]
        body: dict[str, Any] = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.model is not None:
            body["model"] = self.model
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    def completion_body(self) -> dict[str, Any]:
        """The non-streamed completions body of this reply (a raw completion's)."""
        body: dict[str, Any] = {
            "object": "text_completion",
            "choices": [{"index": 0, "text": self.text(), "finish_reason": self.finish_reason}],
        }
        if self.model is not None:
            body["model"] = self.model
        if self.usage is not None:
            body["usage"] = self.usage
        return body

    def reply(self, id_prefix: str) -> ChatResponse:
        """The reply, as ``parse_chat_body`` makes it of the non-streamed body."""
        return parse_chat_body(json.dumps(self.body()), endpoint=self.endpoint, id_prefix=id_prefix)


class StreamedCall:
    """One streamed call to ``endpoint`` for ``model``: the request (a chat call whose body
    has ``messages``, or a raw completion whose body has ``prompt``), its chunks read from
    the ``data:`` lines of the response as they come, each delta published as a live event
    of the step running here (``dflow.live.publish``), and the whole reply.

    The live events are those of :mod:`dflow_agents._live_reply`; a raw completion's deltas
    are its text as the model writes it (tool calls among it, as text)."""

    def __init__(self, endpoint: str, secret: str, model: str, *, raw: bool = False) -> None:
        self.endpoint = endpoint
        self.secret = secret
        self.model = model
        self.raw = raw  # a raw completion (``/completions``), else a chat call
        self.said = LiveReply(model)
        self.assembly = StreamAssembly(endpoint)

    async def run(
        self, client: Any, body: dict[str, Any], timeout: float, id_prefix: str
    ) -> tuple[ChatResponse, str]:
        """The reply and its non-streamed body as JSON text; ``ModelError`` subclasses."""
        await self.said.start()
        error: ModelError | None = None
        try:
            await self._read(client, body, timeout)
        except ModelError as exc:
            error = exc
        except Exception as exc:
            error = self._mapped(exc)
        if error is None and self.assembly.dropped:
            error = ModelConnectionError(
                f"the stream from the model endpoint {self.endpoint} ended before the answer was complete "
                f"(no finish_reason nor [DONE] after {self.assembly.chunks} chunks): the server closed it mid-answer",
                endpoint=self.endpoint,
            )
        if error is not None:
            await self.said.dropped(str(error))
            raise error  # (outside the except block: the SDK's exception holds the request)
        if self.raw:
            whole = json.dumps(self.assembly.completion_body())
            reply = parse_completion_body(whole, endpoint=self.endpoint)
        else:
            whole = json.dumps(self.assembly.body())
            reply = self.assembly.reply(id_prefix)
        await self.said.end(reply.finish_reason)
        return reply, whole

    async def _read(self, client: Any, body: dict[str, Any], timeout: float) -> None:
        if self.raw:
            prompt = body.pop("prompt")
            request = client.completions.with_streaming_response.create(
                model=self.model, prompt=prompt, stream=True, extra_body=body, timeout=timeout
            )
        else:
            messages = body.pop("messages")
            request = client.chat.completions.with_streaming_response.create(
                model=self.model, messages=messages, stream=True, extra_body=body, timeout=timeout
            )
        async with request as response:
            async for line in response.iter_lines():
                chunk = _chunk(line, self.endpoint)
                if chunk is _DONE:
                    self.assembly.done = True
                    return
                if chunk is None:
                    continue
                text, deltas = self.assembly.add(chunk)
                if text:
                    await self.said.delta(text)
                for d in deltas:
                    await self.said.tool(d.index, d.name, d.arguments)

    def _mapped(self, exc: Exception) -> ModelError:
        import openai

        if isinstance(exc, openai.APIError):
            return map_sdk_error(exc, endpoint=self.endpoint, secret=self.secret)
        if isinstance(exc, (*_dropped_errors(), OSError)) or type(exc).__module__.startswith(
            ("httpx", "httpcore")
        ):
            return ModelConnectionError(
                f"the stream from the model endpoint {self.endpoint} dropped after {self.assembly.chunks} chunks, "
                f"before the answer was complete: {type(exc).__name__}: {scrub(str(exc), self.secret)}",
                endpoint=self.endpoint,
            )
        return ModelResponseError(
            f"the model endpoint {self.endpoint} failed: {type(exc).__name__}: {scrub(str(exc), self.secret)}",
            endpoint=self.endpoint,
        )


_DONE = object()


def _obj(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _chunk(line: str, endpoint: str) -> Any:
    """The object of one SSE line: ``None`` for what is not data (blank lines, comments,
    ``event:``/``id:`` fields), ``_DONE`` for ``data: [DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return _DONE
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise ModelResponseError(
            f"the model endpoint {endpoint} streamed a line that is not JSON: {data[:200]!r}",
            endpoint=endpoint,
        ) from None
