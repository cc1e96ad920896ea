"""LLM agents written as dflow flows (tool calling, ReAct, planning, crawling).

Empty for now: the agents are built on the distributed runtime, which comes first.
"""

from __future__ import annotations

__all__: list[str] = []
