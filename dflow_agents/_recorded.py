"""A turn's recorded requests kept as what they add to the earlier ones.

Each turn's request repeats the conversation so far; kept whole, a run's records grow with
the square of its turns. So a request's messages are kept as ``message_parts`` (the format of
:class:`dflow.RecordedMessages`): the messages the earlier records of the conversation hold
already, as ``[start, count]`` runs of them, and the new ones, each cut at ``text_chars``.

To find what is new, a request is compared with the previous request of the conversation,
message by message, as it was sent. This process remembers the last request it recorded of
each conversation (checked against the record the run holds: another worker may have
recorded a later turn, or a step run again); else it reads the conversation's records again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from dflow import ContextStack, RecordedMessages

_REMEMBERED = 256  # conversations whose last request this process remembers


class Transcript:
    """What a conversation's model-call records hold, through turn ``turn``: how many recorded
    messages, and the last request's messages as (their position among those, as sent)."""

    def __init__(self, turn: int, recorded: int, last: list[tuple[int, Any]], tools: Any = None) -> None:
        self.turn, self.recorded, self.last = turn, recorded, last
        self.tools = tools  # the tools of the last request that named them, as recorded
        self.kept: Any = None  # the record of turn ``turn`` as it was kept
        self._sent = [m for _, m in last]  # the last request's messages
        self._runs: list[list[int]] = _runs(p for p, _ in last)  # their positions, as runs

    def parts(self, sent: Sequence[Any], cut: Callable[[Any], Any]) -> tuple[list[Any], list[int]]:
        """``sent`` (a request's messages) as message parts, and where its new ones are in
        them (each ``cut(m)``, a recorded message from now on); ``sent`` becomes the last
        request."""
        n = len(self.last)
        if n and len(sent) >= n and sent[:n] == self._sent:  # (most turns: the last request, and more)
            return self._parts_after_last(sent, cut)
        parts: list[Any] = []
        new_at: list[int] = []
        last, after, now = self.last, 0, []
        for m in sent:
            same = after < len(last) and (last[after][1] is m or last[after][1] == m)
            found = after if same else _find(last, m, after)
            if found is None:
                new_at.append(len(parts))
                parts.append(cut(m))
                now.append((self.recorded, m))
                self.recorded += 1
                continue
            at = last[found][0]
            after = found + 1
            now.append((at, m))
            if parts and isinstance(parts[-1], list) and sum(parts[-1]) == at:
                parts[-1][1] += 1
            else:
                parts.append([at, 1])
        self.last, self._sent = now, list(sent)
        self._runs = _runs(p for p, _ in now)
        return parts, new_at

    def _parts_after_last(
        self, sent: Sequence[Any], cut: Callable[[Any], Any]
    ) -> tuple[list[Any], list[int]]:
        """``parts`` of a request that begins with the last one: its runs, then what is new
        (as many steps whatever the length of the conversation)."""
        parts: list[Any] = [list(r) for r in self._runs]
        first, new = self.recorded, sent[len(self.last) :]
        new_at = list(range(len(parts), len(parts) + len(new)))
        parts += [cut(m) for m in new]
        self.last += [(first + i, m) for i, m in enumerate(new)]  # (in place: no copy a turn)
        self._sent += new
        self.recorded += len(new)
        if new:
            runs = self._runs = [list(r) for r in self._runs]
            if runs and sum(runs[-1]) == first:
                runs[-1][1] += len(new)
            else:
                runs.append([first, len(new)])
        return parts, new_at


def _runs(positions: Any) -> list[list[int]]:
    """``positions`` as ``[start, count]`` runs of consecutive ones."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and sum(runs[-1]) == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1])
    return runs


def _find(last: list[tuple[int, Any]], message: Any, after: int) -> int | None:
    """Where ``message`` is in ``last`` from ``after`` on: most often right there."""
    for i in range(after, len(last)):
        if last[i][1] is message or last[i][1] == message:
            return i
    return None


_known: OrderedDict[tuple[str, str], Transcript] = OrderedDict()
_lock = threading.Lock()  # runtimes of one process may record from their own threads


def transcript(ctx: ContextStack, prefix: str, turn: int) -> Transcript:
    """What the records ``<prefix><k>`` (``k < turn``) of the run hold: remembered, when this
    process recorded the last of them; else read again."""
    with _lock:
        known = _known.pop((ctx.trace_id, prefix), None)  # (a step run twice at once reads again)
    if (
        known is not None
        and known.turn < turn
        and ctx.get(f"{prefix}{known.turn}") == known.kept
        and all(ctx.get(f"{prefix}{k}") is None for k in range(known.turn + 1, turn))
    ):
        return known
    return _read(ctx, prefix, turn)


def remember(ctx: ContextStack, prefix: str, turn: int, found: Transcript, kept: Any) -> None:
    """``found`` is what the records hold through turn ``turn``, whose record is ``kept``."""
    found.turn, found.kept = turn, kept
    with _lock:
        _known[(ctx.trace_id, prefix)] = found
        while len(_known) > _REMEMBERED:
            _known.popitem(last=False)


def _read(ctx: ContextStack, prefix: str, turn: int) -> Transcript:
    recorded = RecordedMessages()
    last: list[tuple[int, Any]] = []
    for k in range(turn):
        record = ctx.get(f"{prefix}{k}")
        calls = record.get("model_calls") if isinstance(record, dict) else None
        for call in calls if isinstance(calls, list) else ():
            before = len(recorded.messages)
            recorded.rebuilt(call)
            request = call.get("request") if isinstance(call, dict) else None
            if isinstance(request, dict) and isinstance(request.get("message_parts"), list):
                last = _positions(request["message_parts"], recorded.messages, before)
            elif isinstance(request, dict) and "messages" in request:
                last = []  # an older record, its messages whole: none of them recorded ones
    return Transcript(turn - 1, len(recorded.messages), last, recorded.tools)


def _positions(parts: list[Any], recorded: list[Any], new: int) -> list[tuple[int, Any]]:
    """A request's messages read again, as (position among the ``recorded`` ones, message);
    its new ones are those from position ``new``."""
    out = []
    for part in parts:
        if isinstance(part, list):
            if len(part) == 2 and all(isinstance(n, int) and not isinstance(n, bool) for n in part):
                out += [(i, recorded[i]) for i in range(max(0, part[0]), min(sum(part), len(recorded)))]
        else:
            out.append((new, recorded[new]))
            new += 1
    return [(i, m) for i, m in out if m is not None]


def size(value: Any) -> int:
    """The length of ``value``'s JSON text."""
    return len(json.dumps(value, ensure_ascii=False, default=str))
