"""Conversations that a run keeps in its data, shown by ``dflow inspect``, ``Run.tree()`` and
the console without dflow knowing the library that wrote them (``dflow_agents``).

A step declares a conversation once, with :func:`declare_conversation`: the run's data key
``dflow/conversation/<name>`` then says which of the run's data keys hold its messages, in
order: the ``head`` keys, then for turn 0, 1, 2, ... each of the ``per_turn`` keys with
``{turn}`` replaced by the turn's number, until a turn has none of them. Each of those keys
holds a list of messages: mappings with ``role`` (``system``, ``user``, ``assistant``,
``tool``), ``content`` (text), and optionally ``name``, ``tool_calls``
(``[{"id", "name", "arguments"}]``, on an assistant message) and ``tool_call_id`` (on a tool
message). A key may hold a record of model calls instead: a mapping whose ``model_calls``
lists, for each call, the ``model`` asked, the ``request`` sent and the ``reply`` it gave (or
the ``error`` it failed with), and optionally ``http`` (what went on the wire), any JSON data;
each is shown as a message of role ``model call``, reply first. Every value there is plain data, so any process can show it: one that
has none of the library's classes, and none of its objects.

A request may hold ``message_parts`` instead of ``messages``, so that each turn's record keeps
only what its request adds to the earlier ones (see :class:`RecordedMessages`): a list whose
items are either a message (a mapping; ``null`` for one left out to bound the record), which
is new, or ``[start, count]``: ``count`` of the conversation's *recorded messages* from
position ``start``. The recorded messages are the new items of every ``message_parts`` of the
conversation's model-call records, in the order the records come (turn by turn, call by call).
Such a request may hold ``"tools_as_before": true`` instead of its ``tools``: those of the
last request of the conversation that named them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..context import ContextStack
from ..errors import DFlowError
from ..wire.values import decode, encode
from .as_json import jsonable

__all__ = [
    "CONVERSATION_PREFIX",
    "RecordedMessages",
    "RunData",
    "declare_conversation",
    "described",
    "message",
    "text_lines",
]

#: the run's data keys that declare a conversation start with this
CONVERSATION_PREFIX = "dflow/conversation/"
_MAX_TURNS = 10_000  # read at most
_MAX_KEYS = 16  # head keys, and keys per turn, at most


def declare_conversation(
    ctx: ContextStack, name: str, *, head: Sequence[str], per_turn: Sequence[str]
) -> None:
    """Say, in the run's data, where the run's conversation ``name`` is kept (see the module):
    the data keys of its first messages (``head``), then those of each turn (``per_turn``,
    each with ``{turn}`` in it). Declared again under the same name, the later declaration
    is the one shown."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"a conversation's name is a str of 1-200 characters, got {name!r:.80}")
    head, per_turn = list(head), list(per_turn)
    if not all(isinstance(k, str) for k in head + per_turn):
        raise TypeError("a conversation's head and per_turn are data keys (str)")
    if not per_turn or any("{turn}" not in k for k in per_turn):
        raise ValueError(f"each per_turn key names its turn with {{turn}}, got {per_turn!r:.200}")
    if len(head) > _MAX_KEYS or len(per_turn) > _MAX_KEYS:
        raise ValueError(f"a conversation has at most {_MAX_KEYS} head keys and {_MAX_KEYS} keys per turn")
    key = CONVERSATION_PREFIX + name
    if ctx._readonly:
        raise DFlowError(f"declare_conversation({name!r}) is refused here: {ctx._readonly}")
    ctx._changes[key] = encode({"head": head, "per_turn": per_turn})  # (a key of dflow's own)


class RunData(Mapping[str, Any]):
    """A run's data, each value decoded on first read (a model whose class this process does
    not have as its fields; ``None`` for a value that cannot be decoded at all)."""

    def __init__(self, raw: Mapping[str, bytes]) -> None:
        self._raw = raw
        self._seen: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._seen:
            raw = self._raw[key]
            try:
                self._seen[key] = decode(raw, plain=True)
            except Exception:
                self._seen[key] = None
        return self._seen[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def message(item: Any) -> dict[str, Any] | None:
    """A message of a conversation as JSON data of the shape the module describes (bounded
    names and ids), or ``None`` when ``item`` is not one."""
    if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
        return None
    calls = item.get("tool_calls")
    return {
        "role": item["role"][:20],
        "content": "" if item.get("content") is None else str(item.get("content")),
        "name": None if item.get("name") is None else str(item.get("name"))[:200],
        "tool_call_id": None if item.get("tool_call_id") is None else str(item.get("tool_call_id"))[:200],
        "tool_calls": [
            {
                "id": str(c.get("id", ""))[:200],
                "name": str(c.get("name", ""))[:200],
                "arguments": jsonable(c.get("arguments")),
            }
            for c in (calls if isinstance(calls, list) else [])
            if isinstance(c, Mapping)
        ],
    }


def _compact(value: Any) -> str:
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(", ", ": "))


_REQUEST, _HTTP = "request: ", "http: "


def _sent(request: Mapping[str, Any]) -> str:
    """What a request held, in a line: its messages or prompt, tools and options."""
    messages, prompt = request.get("messages"), request.get("prompt")
    parts = []
    if isinstance(messages, list):
        left = request.get("left_out_messages")
        parts.append(f"{len(messages)} messages" + (f" ({left} older left out)" if left else ""))
    if isinstance(prompt, str):
        parts.append(f"a prompt of {len(prompt):,} characters")
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        names = [str(t.get("name")) for t in tools if isinstance(t, Mapping)]
        parts.append(f"tools {', '.join(names)}")
    options = request.get("options")
    if isinstance(options, Mapping) and options:
        parts.append(f"options {_compact(options)}")
    return "; ".join(parts) or "nothing"


class RecordedMessages:
    """The recorded messages of a conversation (see the module), gathered as its model-call
    records are read in order: :meth:`rebuilt` turns each call of a record into the call as it
    was made, its request's ``message_parts`` become its ``messages`` again (those left out
    counted in ``left_out_messages``)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []  # every new item so far (None: left out)
        self.tools: Any = None  # the tools of the last request that named them

    def rebuilt(self, call: Any) -> Any:
        """``call`` with its request's messages whole (a new mapping), after adding the new
        messages of its ``message_parts`` to the recorded ones, and its tools when it says
        they are those of the request before (``"tools_as_before": true``); any other
        ``call`` as it is."""
        request = call.get("request") if isinstance(call, Mapping) else None
        if isinstance(request, Mapping) and "tools" in request:
            self.tools = request["tools"]
        if not isinstance(request, Mapping) or not isinstance(request.get("message_parts"), list):
            return call
        messages, left_out = [], 0
        for part in request["message_parts"]:
            if isinstance(part, list):
                earlier = self._earlier(part)
            else:
                self.messages.append(part if isinstance(part, Mapping) else None)
                earlier = self.messages[-1:]
            kept = [m for m in earlier if m is not None]
            messages += kept
            left_out += len(earlier) - len(kept)
        whole = self._whole(request, messages)
        if left_out:
            whole["left_out_messages"] = left_out + int(whole.get("left_out_messages") or 0)
        return {**call, "request": whole}

    def _whole(self, request: Mapping[str, Any], messages: list[Any]) -> dict[str, Any]:
        """``request`` with ``messages`` where its parts were, and its tools where it said they
        were those before (in the request's own order; the mark stays when no earlier request
        here had tools to put back, as when the reading starts after it)."""
        whole: dict[str, Any] = {}
        for k, v in request.items():
            if k == "tools_as_before":
                if v is True and self.tools is not None:
                    whole["tools"] = self.tools
                else:
                    whole[k] = v
                continue
            whole["messages" if k == "message_parts" else k] = messages if k == "message_parts" else v
        return whole

    def _earlier(self, part: list[Any]) -> list[Any]:
        if len(part) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in part):
            return []
        start, count = max(0, part[0]), max(0, part[1])
        return self.messages[start : start + count]


def model_call_message(call: Any) -> dict[str, Any] | None:
    """A recorded model call (``{"model", "request", "reply" | "error"}``) as a message of
    role ``model call``: what the model said (or how it failed), then what it was sent."""
    if not isinstance(call, Mapping):
        return None
    lines = []
    if call.get("error") is not None:
        lines.append(f"failed: {call['error']}")
    if call.get("reply") is not None:
        lines.append(f"reply: {_compact(call['reply'])}")
    request = call.get("request")
    if isinstance(request, Mapping):
        lines.append(f"sent: {_sent(request)}")
    if request is not None:
        lines.append(f"{_REQUEST}{_compact(request)}")
    if call.get("http") is not None:  # what the client put on the wire, and the raw reply
        lines.append(f"{_HTTP}{_compact(call['http'])}")
    name = call.get("model")
    return {
        "role": "model call",
        "content": "\n".join(lines),
        "name": None if name is None else str(name)[:200],
        "tool_call_id": None,
        "tool_calls": [],
    }


def _batch(value: Any, recorded: RecordedMessages) -> list[dict[str, Any]]:
    if isinstance(value, Mapping) and isinstance(value.get("model_calls"), list):
        found = (model_call_message(recorded.rebuilt(c)) for c in value["model_calls"])
    else:
        found = (message(item) for item in (value if isinstance(value, list) else []))
    return [m for m in found if m is not None]


def _keys(value: Any, name: str) -> list[str]:
    keys = value.get(name) if isinstance(value, Mapping) else None
    return [k for k in keys[:_MAX_KEYS] if isinstance(k, str)] if isinstance(keys, list) else []


def _messages(data: Mapping[str, Any], declared: Any) -> list[dict[str, Any]]:
    head, per_turn = _keys(declared, "head"), _keys(declared, "per_turn")
    recorded = RecordedMessages()
    out = [m for k in head for m in _batch(data.get(k), recorded)]
    for turn in range(_MAX_TURNS if per_turn else 0):
        keys = [k.replace("{turn}", str(turn)) for k in per_turn]
        if not any(k in data for k in keys):
            break
        out += [m for k in keys for m in _batch(data.get(k), recorded)]
    return out


def described(data: Mapping[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The conversations declared in a run's ``data`` (decoded values): each one's name and
    messages, oldest first, by name; those without messages are left out."""
    found = []
    for key in sorted(k for k in data if k.startswith(CONVERSATION_PREFIX)):
        messages = _messages(data, data.get(key))
        if messages:
            found.append((key[len(CONVERSATION_PREFIX) :], messages))
    return found


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" … ({len(text) - limit:,} more characters)"


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, Mapping):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return json.dumps(arguments, ensure_ascii=False)


def _said(m: Mapping[str, Any]) -> str:
    who = str(m["role"])
    if who == "tool":
        who = f"tool {m['name'] or '?'}" + (f" [{m['tool_call_id']}]" if m["tool_call_id"] else "")
    elif m["name"]:
        who = f"{who} ({m['name']})"
    return who


def _content(m: Mapping[str, Any], requests: bool) -> str:
    text = str(m.get("content") or "")
    if requests or m.get("role") != "model call":
        return text
    return "\n".join(line for line in text.splitlines() if not line.startswith((_REQUEST, _HTTP)))


def text_lines(
    name: str, messages: Sequence[Mapping[str, Any]], limit: int = 2000, *, requests: bool = False
) -> list[str]:
    """A conversation as lines of text for a terminal (unescaped): who said what, each tool
    call with its arguments, each message's text cut after ``limit`` characters; a model
    call's whole request only with ``requests`` (else a line saying what it held)."""
    lines = [f"conversation {name} ({len(messages)} messages)"]
    for m in messages:
        text = _cut(_content(m, requests), limit).splitlines() or [""]
        lines.append(f"  {_said(m)}: {text[0]}")
        lines += [f"    {t}" for t in text[1:]]
        for call in m.get("tool_calls") or ():
            args = _cut(_arguments(call.get("arguments")), limit)
            lines.append(f"    → {call.get('name')}({args})" + (f" [{call['id']}]" if call.get("id") else ""))
    return lines
