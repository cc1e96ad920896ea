"""What the model saw and said: each model call of a turn, recorded in the run.

While an agent asks its model for a turn, every request that reaches a model is noted: the
model, the request as it was made (the messages or the raw prompt, the tools offered, the
request options such as ``tool_choice`` and ``stop``) and the reply as the client read it
(text, tool calls, finish reason, usage), or the failure. :class:`OpenAIChatModel` adds what
it put on the wire (its body: the model name, the tools in OpenAI's format, ``tool_choice``,
the rendered prompt in raw mode) and the server's reply as it came (``http``). A :class:`ModelFallback` notes one
call per model it asked. The agent keeps them in the run's data, one key per turn
(``<ns>/call/<turn>``), bounded (:class:`CallRecording`) and passed through its ``redact``
hook first, each request's messages kept as what they add to the earlier turns' (the
messages new since, and runs of those recorded before: see :class:`dflow.RecordedMessages`,
which rebuilds them); ``dflow inspect``, ``Run.tree()`` and the console show them in the
conversation, as ``model call`` entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from dflow import ContextStack

from ._recorded import Transcript, remember, size, transcript
from .messages import ChatMessage, ChatResponse, ToolSpec

__all__ = ["CallRecording"]

_calls: ContextVar[list[dict[str, Any]] | None] = ContextVar("dflow_agents_model_calls", default=None)


@dataclasses.dataclass(frozen=True)
class CallRecording:
    """How the model calls of a turn are kept in the run (see :mod:`dflow_agents.exchanges`).

    Args:
        text_chars: each text of a record (a message, the raw prompt, the reply) is cut
            after this many characters, saying how many more there were.
        max_chars: a turn's record at most (its JSON text); past it, the oldest messages of
            a request are left out (the first is kept), saying how many.
        redact: ``fn(record) -> record`` applied to each call's record before it is kept
            (``{"model", "request", "reply"}`` or ``{"model", "request", "error"}``): take
            out what must not be stored (keys, personal data). If it raises, nothing of that
            call is kept but the model's name and that the hook failed.
    """

    text_chars: int = 4_000
    max_chars: int = 100_000
    redact: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        for what in ("text_chars", "max_chars"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value < 100:
                raise ValueError(f"CallRecording.{what} must be an int >= 100, got {value!r:.80}")
        if self.redact is not None and not callable(self.redact):
            raise TypeError(f"CallRecording.redact is fn(record) -> record, got {self.redact!r:.80}")

    def record(self, calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The turn's ``calls`` as kept in the run, each whole: redacted, then bounded."""
        kept = [self._redacted(c) for c in calls]
        return {
            "model_calls": [_bounded(c, self.text_chars, self.max_chars // max(1, len(kept))) for c in kept]
        }

    def keep(self, ctx: ContextStack, prefix: str, turn: int, calls: Sequence[dict[str, Any]]) -> None:
        """Keep turn ``turn``'s ``calls`` in the run's data key ``<prefix><turn>``: redacted,
        bounded, each request's messages as what they add to the earlier turns' records
        (``<prefix><k>``), which ``dflow inspect`` and the console rebuild."""
        kept = [self._redacted(c) for c in calls]
        found = transcript(ctx, prefix, turn)
        limit = self.max_chars // max(1, len(kept))
        record = {"model_calls": [self._added(c, found, limit) for c in kept]}
        ctx.put(f"{prefix}{turn}", record)
        remember(ctx, prefix, turn, found, record)

    def _added(self, call: dict[str, Any], found: Transcript, max_chars: int) -> dict[str, Any]:
        """``call`` cut and bounded, its request's messages as message parts (``found``: what
        the records hold before it): the oldest new ones left out while over ``max_chars``,
        but for the request's first and last."""
        request = call.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
            return _bounded(call, self.text_chars, max_chars)
        limit = self.text_chars
        parts, new_at = found.parts(request["messages"], lambda m: _cut_texts(m, limit))
        sent = {
            ("message_parts" if k == "messages" else k): parts if k == "messages" else _cut_texts(v, limit)
            for k, v in request.items()
        }
        out = {
            k: _tools_once(sent, found) if k == "request" else _cut_texts(v, limit) for k, v in call.items()
        }
        droppable = [i for i in new_at if 0 < i < len(parts) - 1]
        while droppable and size(out) > max_chars:
            parts[droppable.pop(0)] = None
        return out

    def _redacted(self, call: dict[str, Any]) -> dict[str, Any]:
        if self.redact is None:
            return call
        try:
            out = self.redact(json.loads(json.dumps(call, default=str)))  # the hook gets its own copy
            if not isinstance(out, Mapping):
                raise TypeError(f"it returned {type(out).__name__}, not a dict")
            return dict(out)
        except Exception as exc:
            return {
                "model": call.get("model"),
                "error": f"the redact hook failed ({type(exc).__name__}): not kept",
            }


def _tools_once(request: dict[str, Any], found: Transcript) -> dict[str, Any]:
    """``request`` with ``"tools_as_before": true`` for its tools when they are those of the
    request before it in the records (``found``), which ``RecordedMessages`` puts back."""
    if "tools" not in request:
        return request
    same, found.tools = found.tools is not None and request["tools"] == found.tools, request["tools"]
    if not same:
        return request
    return {
        ("tools_as_before" if k == "tools" else k): True if k == "tools" else v for k, v in request.items()
    }


def model_label(model: object) -> str:
    """A short name of ``model`` for records: its ``name``, else its ``model``, else its type."""
    for attr in ("name", "model"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value[:100]
    return type(model).__name__


@contextlib.contextmanager
def recording(enabled: bool = True) -> Iterator[list[dict[str, Any]]]:
    """Note every model call made inside the block (in this task) in the list it gives;
    ``enabled=False``: none (no request is made into a record), the list stays empty."""
    calls: list[dict[str, Any]] = []
    token = _calls.set(calls if enabled else None)
    try:
        yield calls
    finally:
        _calls.reset(token)


class _Dumps:
    """The JSON data of the messages and tool specs of recent requests, by object: a turn's
    request repeats the conversation so far, whose messages are the same (frozen) objects
    from turn to turn, so each is dumped once, not once a turn; and a request that begins
    with the whole of an earlier one of its conversation (by its first two objects) takes
    that one's data as it is, then dumps what follows. An entry holds its objects, so the
    ids it is found by are not reused while it is there. The dicts are shared between
    requests: what reads a request copies what it changes (``_cut_texts``, the redact hook's
    copy)."""

    def __init__(self, size: int = 8192, requests: int = 256) -> None:
        self._size, self._requests = size, requests
        self._entries: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._last: OrderedDict[tuple[int, int], tuple[list[Any], list[dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()  # runtimes of one process may record from their own threads

    def __call__(self, given: Sequence[ChatMessage] | Sequence[ToolSpec]) -> list[dict[str, Any]]:
        items: list[Any] = list(given)
        key = (id(items[0]), id(items[1])) if len(items) > 1 else None
        with self._lock:
            last = self._last.pop(key, None) if key is not None else None
        if last is not None and len(items) >= len(last[0]) and items[: len(last[0])] == last[0]:
            seen, done = last  # extended in place: no copy of the conversation's data a turn
            new = items[len(seen) :]
            seen += new
            done += self._each(new)
        else:
            seen, done = items, self._each(items)
        if key is not None:
            with self._lock:
                self._last[key] = (seen, done)
                while len(self._last) > self._requests:
                    self._last.popitem(last=False)
        return list(done)

    def _each(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        entries, out, new = self._entries, [], []
        for item in items:
            hit = entries.get(id(item))
            if hit is not None and hit[0] is item:
                out.append(hit[1])
                continue
            dumped = item.model_dump(mode="json", exclude_defaults=True)
            new.append((item, dumped))
            out.append(dumped)
        if new:
            with self._lock:
                if len(entries) + len(new) > self._size:  # the oldest half goes
                    for k in list(entries)[: len(entries) // 2]:
                        del entries[k]
                for item, dumped in new:
                    entries[id(item)] = (item, dumped)
        return out


_dumped = _Dumps()


def chat_request(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] | None, options: Mapping[str, Any]
) -> dict[str, Any]:
    """A chat request as a record notes it (each message's and tool's data dumped once per
    object: see :class:`_Dumps`)."""
    request: dict[str, Any] = {"messages": _dumped(messages)}
    if tools:
        request["tools"] = _dumped(tools)
    if options:
        request["options"] = _plain(options)
    return request


def completion_request(prompt: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A raw-completion request as a record notes it."""
    request: dict[str, Any] = {"prompt": prompt}
    if options:
        request["options"] = _plain(options)
    return request


async def asked(
    label: str, request: Callable[[], dict[str, Any]], call: Callable[[], Awaitable[ChatResponse]]
) -> ChatResponse:
    """``call()``, noted (when a turn records) as a call of model ``label`` with the
    ``request()`` it makes. A call that makes calls of its own (a fallback list) is noted as
    those."""
    calls = _calls.get()
    if calls is None:
        return await call()
    entry: dict[str, Any] = {"model": label, "request": request()}
    at = len(calls)
    calls.append(entry)
    try:
        response = await call()
    except BaseException as exc:
        if len(calls) > at + 1:
            del calls[at]
        else:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        raise
    if len(calls) > at + 1:
        del calls[at]
    else:
        entry["reply"] = response.model_dump(mode="json", exclude_defaults=True)
    return response


def note_http(sent: Callable[[], dict[str, Any]], raw_reply: str) -> None:
    """Add to the call being noted (when a turn records) what its client put on the wire,
    ``sent()`` (the body, but for the chat messages, which the request holds already), and
    the server's ``raw_reply`` text."""
    calls = _calls.get()
    if calls and "reply" not in calls[-1] and "error" not in calls[-1]:
        calls[-1]["http"] = {"sent": _plain(sent()), "raw_reply": raw_reply}


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _cut_texts(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return (
            value if len(value) <= limit else value[:limit] + f" … ({len(value) - limit:,} more characters)"
        )
    if isinstance(value, list):
        return [_cut_texts(v, limit) for v in value]
    if isinstance(value, dict):
        return {k: _cut_texts(v, limit) for k, v in value.items()}
    return value


def _bounded(call: dict[str, Any], text_chars: int, max_chars: int) -> dict[str, Any]:
    """``call`` with each text cut at ``text_chars``, and its request's oldest messages left
    out (all but the first and the last) while its JSON is over ``max_chars``."""
    call = _cut_texts(call, text_chars)
    request = call.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return call
    messages = request["messages"]
    left_out = 0
    while len(messages) > 2 and len(json.dumps(call, ensure_ascii=False)) > max_chars:
        del messages[1]
        left_out += 1
    if left_out:
        request["left_out_messages"] = left_out
    return call
