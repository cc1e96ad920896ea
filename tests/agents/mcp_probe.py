"""Running a coroutine in a step of the local runtime, where an agent's tools run (on the
runtime's event loop, whose MCP sessions the tools share): for the MCP tests."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from dflow import DFlow

_names = itertools.count()
_jobs: dict[str, Callable[[], Awaitable[object]]] = {}


async def _apply(job: str) -> object:
    return await _jobs.pop(job)()


_probe = DFlow.from_call("mcp-probe").map(_apply).id("probe")


def in_runtime(fn: Callable[[], Awaitable[object]]) -> Any:
    """Run the async ``fn`` in a step of the local runtime, and give its value."""
    job = f"job-{next(_names)}"
    _jobs[job] = fn
    return _probe.init(f"mcp-probe-{job}").call(job).result(120)


def run_tool(tool: Any, **arguments: object) -> dict[str, Any]:
    """``tool.run(arguments)`` in the runtime, as the result's data."""

    async def go() -> object:
        return (await tool.run(arguments)).model_dump()

    result = in_runtime(go)
    assert isinstance(result, dict)
    return result


def close_sessions() -> None:
    """Close the runtime's MCP sessions (stdio servers exit)."""

    async def close() -> None:
        from dflow_agents._mcp_pool import close_connections

        await close_connections()

    in_runtime(close)
