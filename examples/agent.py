"""A tool-calling agent in local mode: two tools, a scripted model, the run's step tree.

    python examples/agent.py

With OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL set (any OpenAI-compatible server:
OpenAI, DashScope's compatible mode, vLLM, Ollama, llama.cpp's server), the same agent asks
that model instead of the script.
"""

from __future__ import annotations

import os

import dflow
from dflow import DFlow
from dflow_agents import AgentLimits, ToolCallAgent, tool
from dflow_agents.testing import ScriptedModel, call, reply


@tool
def weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: the city's name, e.g. "Paris".
    """
    return {"paris": "sunny, 24 °C", "oslo": "rain, 11 °C"}.get(city.lower(), "unknown")


@tool
def convert(celsius: float) -> float:
    """Degrees Celsius in Fahrenheit."""
    return round(celsius * 9 / 5 + 32, 1)


def model() -> object:
    if os.environ.get("OPENAI_BASE_URL") and os.environ.get("OPENAI_MODEL"):
        from dflow_agents import OpenAIChatModel

        return dflow.shared(OpenAIChatModel(), "example-model")
    return ScriptedModel(
        [  # what a model would answer, turn by turn
            reply(
                "Let me look up both cities.",
                calls=[call("weather", city="Paris"), call("weather", city="Oslo")],
            ),
            reply(calls=[call("convert", celsius=24)]),
            reply(
                calls=[
                    call(
                        "terminate",
                        status="success",
                        conclusion="Paris is sunny at 24 °C (75.2 °F); Oslo has rain at 11 °C.",
                    )
                ]
            ),
        ]
    )


agent = ToolCallAgent(
    "weather-agent",
    model(),  # type: ignore[arg-type]
    [weather, convert],
    limits=AgentLimits(max_steps=8),
)

if __name__ == "__main__":
    DFlow.global_init_for_test()  # local mode: the in-memory store and transport
    run = agent.run("How warm is it in Paris (in Fahrenheit) and in Oslo?")
    result = run.result(timeout=120)
    print(f"{result.status.value}: {result.answer}")
    print(run.tree())
