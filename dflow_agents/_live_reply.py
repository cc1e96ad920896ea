"""A model reply as live events of the step that asked for it (``dflow.live``), the same
for every model that streams: ``OpenAIChatModel(stream=True)`` as its chunks come, and
``ScriptedModel(stream=True)`` in tests and examples.

Each event has ``kind`` and ``call`` (an id of this model call: a call made again after a
crash or a retry has a new one): ``model.start`` (``model``), then ``model.delta``
(``text``) and ``model.tool`` (``index``, ``name``, ``arguments``: the fragment that came),
then ``model.end`` (``finish_reason``) or ``model.dropped`` (``error``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from dflow import live

from .messages import ChatResponse

__all__ = ["LiveReply"]

_WORDS = re.compile(r"\S+\s*|\s+")


class LiveReply:
    """The live events of one model call to ``model``."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.call = uuid.uuid4().hex[:12]

    async def start(self) -> None:
        await self._say("model.start", model=self.model)

    async def delta(self, text: str) -> None:
        await self._say("model.delta", text=text)

    async def tool(self, index: int, name: str, arguments: str) -> None:
        await self._say("model.tool", index=index, name=name, arguments=arguments)

    async def dropped(self, error: str) -> None:
        await self._say("model.dropped", error=error[:500])

    async def end(self, finish_reason: str | None) -> None:
        await self._say("model.end", finish_reason=finish_reason)

    async def whole(self, reply: ChatResponse) -> None:
        """Publish a reply that is already whole as if it streamed: word by word, then its calls."""
        await self.start()
        for word in _WORDS.findall(reply.content):
            await self.delta(word)
        for i, call in enumerate(reply.tool_calls):
            await self.tool(i, call.name, call.raw_arguments or json.dumps(call.arguments))
        await self.end(reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop"))

    async def _say(self, kind: str, **data: Any) -> None:
        await live.publish({"kind": kind, "call": self.call, **data})
