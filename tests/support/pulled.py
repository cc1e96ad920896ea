"""The tools and the scripted model of the pulled-job tests (in process, and in the
processes of ``tests/integration/apps/pulling_app.py``): signatures for ``PullingJobTool``
(a module gives each tool a name of its own, as pulling tools are known by name in a
process) and a model that calls them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dflow_agents import ChatMessage, ChatResponse, ToolCall, ToolSpec

Decide = Callable[[Sequence[ChatMessage], Sequence[ToolSpec]], ChatResponse]


def fetch_page(url: str) -> str:
    """Fetch a page in the user's browser; its text.

    Args:
        url: the page's address
    """


def ask_user(question: str) -> str:
    """Ask the user.

    Args:
        question: what to ask
    """


def fetch_or_ask(fetch: str, ask: str) -> Decide:
    """A ``FunctionModel`` function that reads the task: ``fetch URL [URL ...]`` calls the
    tool ``fetch`` once per URL (at once), ``ask Q`` calls the tool ``ask``; once the results
    are in, the answer is ``observed: `` and the observations joined with `` | ``."""

    def decide(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> ChatResponse:
        results = [m.content for m in messages if m.role == "tool"]
        if results:
            return ChatResponse(content="observed: " + " | ".join(results))
        kind, _, rest = messages[-1].content.partition(" ")
        if kind == "fetch":
            calls = [ToolCall(id="", name=fetch, arguments={"url": u}) for u in rest.split()]
        else:
            calls = [ToolCall(id="", name=ask, arguments={"question": rest})]
        return ChatResponse(tool_calls=calls)

    return decide
