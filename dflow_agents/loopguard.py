"""The loop guard: notice an agent going round in circles, tell the model, then stop it.

Three signs, each counted over the turns of one run:

* **repeats** – the same tool calls (names and arguments) turn after turn;
* **duplicates** – the same reply text again (what OpenManus calls "stuck");
* **stalls** – the same observations turn after turn: whatever the calls, nothing new.

When one shows, the next model request ends with a change-of-strategy prompt naming what
was seen (up to ``nudges`` times); if it shows again after that, the agent stops with status
ERROR and a reason saying what it repeated. The guard keeps its counts in the loop's state
(plain data), so it works the same on any worker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

__all__ = ["STRATEGY_PROMPT", "LoopGuard"]

#: The change-of-strategy prompt; ``{what}`` says what the guard saw.
STRATEGY_PROMPT = (
    "You are going round in circles: {what}. Doing it again will not help. Change strategy: use "
    "other tools or other arguments, break the task down differently, or answer with what you "
    "have. If the task cannot be done, call terminate with status 'failure' and say why."
)


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _calls_text(calls: list[dict[str, Any]]) -> str:
    shown = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments', {}), ensure_ascii=False)})" for c in calls)
    return shown if len(shown) <= 200 else shown[:197] + "..."


@dataclasses.dataclass(frozen=True)
class LoopGuard:
    """Thresholds of the loop guard; ``0`` switches a sign off.

    Args:
        repeats: the same tool calls this many turns in a row.
        duplicates: the same non-empty reply text this many times in the run.
        stalls: the same observations this many turns in a row.
        nudges: change-of-strategy prompts sent before the agent is stopped.
        prompt: the change-of-strategy prompt (``{what}`` is replaced).
    """

    repeats: int = 3
    duplicates: int = 3
    stalls: int = 4
    nudges: int = 1
    prompt: str = STRATEGY_PROMPT

    def __post_init__(self) -> None:
        for name in ("repeats", "duplicates", "stalls", "nudges"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value == 1 and name != "nudges":
                raise ValueError(f"LoopGuard.{name} must be 0 (off) or an int >= 2 (nudges: >= 0), got {value!r}")
        if "{what}" not in self.prompt:
            raise ValueError("LoopGuard.prompt must contain {what}, where the guard says what it saw")

    @staticmethod
    def new_state() -> dict[str, Any]:
        """The guard's counts at the start of a run."""
        return {"calls": [], "texts": {}, "obs": [], "nudged": 0}

    def observe(
        self, guard: dict[str, Any], content: str, calls: list[dict[str, Any]], observations: list[str]
    ) -> str | None:
        """Count one turn (its reply text, its calls, their observations) into ``guard``;
        return what repeats, or ``None``."""
        seen: list[str] = []
        if calls and self.repeats:
            sig = _digest([[c.get("name"), c.get("arguments", {})] for c in calls])
            last = guard["calls"]
            last = (last if last and last[0] == sig else []) + [sig]
            guard["calls"] = last[-self.repeats:]
            if len(last) >= self.repeats:
                seen.append(f"the same call{'s' if len(calls) > 1 else ''} {_calls_text(calls)} "
                            f"{len(last)} turns in a row")
        elif not calls:
            guard["calls"] = []
        if content.strip() and self.duplicates:
            sig = _digest(content.strip())
            texts = guard["texts"]
            texts[sig] = texts.get(sig, 0) + 1
            if len(texts) > 32:  # keep the state small: forget the oldest text seen once
                for k in list(texts):
                    if texts[k] == 1:
                        del texts[k]
                        break
            if texts[sig] >= self.duplicates:
                shown = content.strip() if len(content.strip()) <= 120 else content.strip()[:117] + "..."
                seen.append(f"the same reply {shown!r} {texts[sig]} times")
        if observations and self.stalls:
            sig = _digest(observations)
            last = guard["obs"]
            last = (last if last and last[0] == sig else []) + [sig]
            guard["obs"] = last[-self.stalls:]
            if len(last) >= self.stalls:
                seen.append(f"the same tool results {len(last)} turns in a row")
        return "; ".join(seen) or None

    def react(self, guard: dict[str, Any], what: str) -> str | None:
        """What to do when ``what`` repeats: the prompt to send (and count it), or ``None``
        when the prompts are used up and the agent must stop."""
        if guard["nudged"] >= self.nudges:
            return None
        guard["nudged"] += 1
        return self.prompt.format(what=what)
