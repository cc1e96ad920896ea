"""The loop guard: notice an agent going round in circles, tell the model, then stop it.

Three signs, each counted over the turns of one run:

* **repeats** – the same tool calls turn after turn; calls that differ only in spaces, key
  order, the way a number is written (``17``, ``17.0``, ``"17"``) or the case of a string
  are the same call (:func:`call_signature`);
* **duplicates** – the same reply text again (what OpenManus calls "stuck");
* **stalls** – the same observations turn after turn: whatever the calls, nothing new.

When one shows, the next model request ends with a change-of-strategy prompt naming what
was seen (up to ``nudges`` times); if it shows again after that, the agent stops with status
ERROR and a reason saying what it repeated.

Before any threshold, a call the model made before in the run whose result comes back the
same gets a note saying so at once (``remind``): small models call ``multiply(17, 23)``
again after getting ``391.0``, and are told they have it. The guard keeps its counts in the
loop's state (plain data), so it works the same on any worker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["REPEAT_NOTE", "STRATEGY_PROMPT", "LoopGuard", "call_signature"]

#: The change-of-strategy prompt; ``{what}`` says what the guard saw.
STRATEGY_PROMPT = (
    "You are going round in circles: {what}. Doing it again will not help. Change strategy: use "
    "other tools or other arguments, break the task down differently, or answer with what you "
    "have. If the task cannot be done, call terminate with status 'failure' and say why."
)

#: The note added to the result of a call made before with the same result; ``{name}`` is
#: the tool, ``{when}`` says when it was made ("in turn 2", "earlier in this reply").
REPEAT_NOTE = (
    "(You called {name} with these arguments {when} and got this same result: you have it "
    "already. Use it to go on, or give your answer; calling it again will not change it.)"
)

_SEEN_KEPT = 64  # calls remembered per run for the repeat note (the oldest forgotten first)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _canonical(value: Any) -> Any:
    """``value`` with what near-identical arguments differ in taken out."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return _number(float(value))
    if isinstance(value, str):
        text = " ".join(value.split()).casefold()
        return _number(float(text)) if _NUMBER.fullmatch(text) else text
    return str(value)


def _number(x: float) -> float | int | str:
    if not math.isfinite(x):
        return repr(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def call_signature(name: object, arguments: Any) -> str:
    """A digest that a call and its near-identical repeats share: the same tool, arguments
    that differ only in spaces, key order, how a number is written or the case of a string."""
    return _digest([name, _canonical(arguments)])


def _calls_text(calls: list[dict[str, Any]]) -> str:
    shown = ", ".join(
        f"{c.get('name')}({json.dumps(c.get('arguments', {}), ensure_ascii=False)})" for c in calls
    )
    return shown if len(shown) <= 200 else shown[:197] + "..."


def _run_of(last: list[str], sig: str, keep: int) -> list[str]:
    """The run of equal signatures ending with ``sig``, at most ``keep`` long."""
    return ((last if last and last[0] == sig else []) + [sig])[-keep:]


@dataclasses.dataclass(frozen=True)
class LoopGuard:
    """Thresholds of the loop guard; ``0`` switches a sign off.

    Args:
        repeats: the same (or near-identical) tool calls this many turns in a row.
        duplicates: the same non-empty reply text this many times in the run.
        stalls: the same observations this many turns in a row.
        nudges: change-of-strategy prompts sent before the agent is stopped.
        prompt: the change-of-strategy prompt (``{what}`` is replaced).
        remind: add :data:`REPEAT_NOTE` to the result of a call made before in the run
            whose result is the same.
    """

    repeats: int = 3
    duplicates: int = 3
    stalls: int = 4
    nudges: int = 1
    prompt: str = STRATEGY_PROMPT
    remind: bool = True

    def __post_init__(self) -> None:
        for name in ("repeats", "duplicates", "stalls", "nudges"):
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < 0
                or (value == 1 and name != "nudges")
            ):
                raise ValueError(
                    f"LoopGuard.{name} must be 0 (off) or an int >= 2 (nudges: >= 0), got {value!r}"
                )
        if "{what}" not in self.prompt:
            raise ValueError("LoopGuard.prompt must contain {what}, where the guard says what it saw")
        if not isinstance(self.remind, bool):
            raise TypeError(f"LoopGuard.remind is a bool, got {self.remind!r:.80}")

    @staticmethod
    def new_state() -> dict[str, Any]:
        """The guard's counts at the start of a run."""
        return {"calls": [], "texts": {}, "obs": [], "nudged": 0, "seen": {}}

    @staticmethod
    def copied(guard: dict[str, Any]) -> dict[str, Any]:
        """``guard`` copied, so that counting a turn leaves the state it came from as it was."""
        return {
            k: dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
            for k, v in guard.items()
        }

    def observe(
        self, guard: dict[str, Any], content: str, calls: list[dict[str, Any]], observations: list[str]
    ) -> str | None:
        """Count one turn (its reply text, its calls, their observations) into ``guard``;
        return what repeats, or ``None``."""
        seen = [
            self._repeats(guard, calls),
            self._duplicates(guard, content),
            self._stalls(guard, observations),
        ]
        return "; ".join(s for s in seen if s) or None

    def _repeats(self, guard: dict[str, Any], calls: list[dict[str, Any]]) -> str | None:
        if not calls:
            guard["calls"] = []
            return None
        if not self.repeats:
            return None
        sig = _digest([call_signature(c.get("name"), c.get("arguments", {})) for c in calls])
        guard["calls"] = run = _run_of(guard["calls"], sig, self.repeats)
        if len(run) < self.repeats:
            return None
        return f"the same call{'s' if len(calls) > 1 else ''} {_calls_text(calls)} {len(run)} turns in a row"

    def _duplicates(self, guard: dict[str, Any], content: str) -> str | None:
        text = content.strip()
        if not text or not self.duplicates:
            return None
        sig = _digest(text)
        texts = guard["texts"]
        texts[sig] = texts.get(sig, 0) + 1
        if len(texts) > 32:  # keep the state small: forget the oldest text seen once
            once = next((k for k, n in texts.items() if n == 1), None)
            if once is not None:
                del texts[once]
        if texts.get(sig, 0) < self.duplicates:
            return None
        shown = text if len(text) <= 120 else text[:117] + "..."
        return f"the same reply {shown!r} {texts[sig]} times"

    def _stalls(self, guard: dict[str, Any], observations: list[str]) -> str | None:
        if not observations or not self.stalls:
            return None
        guard["obs"] = run = _run_of(guard["obs"], _digest(observations), self.stalls)
        return f"the same tool results {len(run)} turns in a row" if len(run) >= self.stalls else None

    def react(self, guard: dict[str, Any], what: str) -> str | None:
        """What to do when ``what`` repeats: the prompt to send (and count it), or ``None``
        when the prompts are used up and the agent must stop."""
        if guard["nudged"] >= self.nudges:
            return None
        guard["nudged"] += 1
        return self.prompt.format(what=what)

    def reminders(
        self, guard: dict[str, Any], turn: int, calls: Sequence[dict[str, Any]], observations: Sequence[str]
    ) -> list[str | None]:
        """For each call of turn ``turn`` (from 0), the note to add to its observation when
        the same call (or a near-identical one) was made before in the run and its result is
        the same, else ``None``; the calls are remembered in ``guard``."""
        if not self.remind:
            return [None] * len(calls)
        seen: dict[str, list[Any]] = guard.setdefault("seen", {})
        notes: list[str | None] = []
        for call, observation in zip(calls, observations):
            sig, result = call_signature(call.get("name"), call.get("arguments", {})), _digest(observation)
            before = seen.get(sig)
            if before is not None and before[1] == result:
                when = "earlier in this reply" if before[0] == turn else f"in turn {before[0] + 1}"
                notes.append(REPEAT_NOTE.format(name=call.get("name"), when=when))
                continue
            seen.pop(sig, None)  # a new result: remembered as the newest
            seen[sig] = [turn, result]
            notes.append(None)
        while len(seen) > _SEEN_KEPT:
            del seen[next(iter(seen))]
        return notes
