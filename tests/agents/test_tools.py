"""@tool: schemas from hints and docstrings, validation, errors and timeouts as observations,
flow tools, pickling."""

from __future__ import annotations

import asyncio
import math
import pickle
import threading
from enum import Enum
from typing import Annotated, Any, Literal, Optional

import cloudpickle
import pytest
from pydantic import BaseModel, Field

import dflow
from dflow import DFlow
from dflow_agents import (
    ChatMessage,
    Tool,
    ToolCall,
    ToolResult,
    ToolSpec,
    terminate,
    terminate_status,
    terminate_tool,
    tool,
)


class Unit(str, Enum):
    """Temperature unit."""

    C = "celsius"
    F = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str = "FR"


class Node(BaseModel):
    name: str
    children: list[Node] = []


@tool
def search(
    query: str,
    limit: int = 10,
    mode: Literal["web", "news"] = "web",
    site: Optional[str] = None,  # noqa: UP045 - the old spelling must work too
    tags: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Search the web for pages.

    Returns the best pages first; this paragraph is not part of the description.

    Args:
        query: what to look for.
        limit (int): how many results
            to return at most.
        mode: where to search.

    Returns:
        A list of pages.
    """
    return [{"query": query, "limit": limit, "mode": mode, "site": site, "tags": tags}]


@tool(name="weather", description="Weather for places.")
async def get_weather(
    places: list[Place],
    unit: Unit = Unit.C,
    days: Annotated[int, Field(ge=1, le=7, description="forecast days")] = 1,
) -> dict[str, Any]:
    """Ignored: the description is given.

    Args:
        days: ignored too, the annotation has a description.
    """
    await asyncio.sleep(0)
    return {"cities": [p.city for p in places], "unit": unit.value, "days": days}


@tool
def fetch_page(url: str) -> DFlow[str]:
    """Fetch a page (as steps of the agent's flow)."""
    return DFlow.just(url).map(lambda u: f"<html>{u}</html>").id("fetch")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_schema_from_hints_and_docstring() -> None:
    assert search.name == "search"
    assert search.description == "Search the web for pages."
    assert search.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for."},
            "limit": {"type": "integer", "default": 10, "description": "how many results to return at most."},
            "mode": {
                "type": "string",
                "enum": ["web", "news"],
                "default": "web",
                "description": "where to search.",
            },
            "site": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "default": None,
            },
        },
        "required": ["query"],
    }
    assert search.spec == ToolSpec(
        name="search", description="Search the web for pages.", parameters=search.parameters
    )


def test_schema_with_nested_models_enums_and_annotated_fields() -> None:
    assert get_weather.name == "weather"
    assert get_weather.description == "Weather for places."
    assert get_weather.parameters == {
        "type": "object",
        "properties": {
            "places": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "country": {"type": "string", "default": "FR"},
                    },
                    "required": ["city"],
                },
            },
            "unit": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "default": "celsius",
                "description": "Temperature unit.",
            },
            "days": {
                "type": "integer",
                "minimum": 1,
                "maximum": 7,
                "default": 1,
                "description": "forecast days",
            },
        },
        "required": ["places"],
    }


def test_recursive_models_keep_their_definitions() -> None:
    @tool
    def draw(root: Node) -> str:
        """Draw a tree."""
        return root.name

    node = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []},
        },
        "required": ["name"],
    }
    assert draw.parameters == {
        "type": "object",
        "properties": {"root": node},
        "required": ["root"],
        "$defs": {"Node": node},
    }


def test_strict_schema_and_null_for_defaults() -> None:
    @tool(strict=True)
    def find(q: str, n: int = 3, tags: Optional[list[str]] = None) -> dict[str, Any]:  # noqa: UP045
        """Find things."""
        return {"q": q, "n": n, "tags": tags}

    assert find.parameters == {
        "type": "object",
        "properties": {
            "q": {"type": "string"},
            "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        },
        "required": ["q", "n", "tags"],
        "additionalProperties": False,
    }
    assert find.spec.to_openai()["function"]["strict"] is True
    result = run(find.run({"q": "x", "n": None, "tags": None}))
    assert result.output == {"q": "x", "n": 3, "tags": None}
    extra = run(find.run({"q": "x", "n": 1, "tags": None, "color": "red"}))
    assert not extra.ok and "color: Extra inputs are not permitted" in extra.observation


def test_sync_and_async_tools_return_observations_and_data() -> None:
    result = run(search.run({"query": "dflow", "limit": "3"}, call_id="c1"))
    assert result == ToolResult(
        name="search",
        observation='[{"query": "dflow", "limit": 3, "mode": "web", "site": null, "tags": null}]',
        output=[{"query": "dflow", "limit": 3, "mode": "web", "site": None, "tags": None}],
        call_id="c1",
    )
    weather = run(
        get_weather.run(
            ToolCall(id="c2", name="weather", arguments={"places": [{"city": "巴黎"}], "days": 2})
        )
    )
    assert weather.ok and weather.call_id == "c2"
    assert weather.output == {"cities": ["巴黎"], "unit": "celsius", "days": 2}
    assert weather.observation == '{"cities": ["巴黎"], "unit": "celsius", "days": 2}'
    assert weather.to_message() == ChatMessage.tool(weather.observation, tool_call_id="c2", name="weather")


def test_return_values_become_text() -> None:
    @tool
    def nothing() -> None:
        """Do nothing."""

    @tool
    def text() -> str:
        """Say hi."""
        return "hi"

    @tool
    def model() -> Place:
        """A place."""
        return Place(city="Lyon")

    assert run(nothing.run()).observation == "(the tool returned nothing)"
    assert run(text.run()) == ToolResult(name="text", observation="hi", output="hi")
    assert run(model.run()).observation == '{"city": "Lyon", "country": "FR"}'


def test_validation_errors_come_back_as_observations() -> None:
    calls: list[Any] = []

    @tool
    def book(city: str, nights: int, kind: Literal["hotel", "hostel"] = "hotel") -> str:
        """Book a room."""
        calls.append(city)
        return "booked"

    result = run(book.run({"nights": "many", "kind": "tent"}, call_id="c9"))
    assert not result.ok and result.error == "ValidationError" and result.call_id == "c9"
    assert result.observation == (
        "Error: invalid arguments for tool 'book': city: Field required; "
        "nights: Input should be a valid integer, unable to parse string as an integer (got 'many'); "
        "kind: Input should be 'hotel' or 'hostel' (got 'tent'). Call the tool again with corrected arguments."
    )
    bad_json = run(book.run(ToolCall(id="c10", name="book", arguments={}, raw_arguments="{city: Paris")))
    assert not bad_json.ok and bad_json.call_id == "c10"
    assert "not a JSON object: {city: Paris" in bad_json.observation
    assert calls == []


def test_a_raising_tool_gives_an_error_observation() -> None:
    @tool
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    result = run(divide.run({"a": 1, "b": 0}))
    assert result == ToolResult(
        name="divide",
        observation="Error: tool 'divide' failed: ZeroDivisionError: float division by zero",
        ok=False,
        error="ZeroDivisionError",
    )


def test_timeout_of_an_async_tool() -> None:
    cancelled = []

    @tool(timeout=0.1)
    async def slow() -> str:
        """Take long."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    result = run(slow.run())
    assert result.ok is False and result.error == "TimeoutError"
    assert result.observation == "Error: tool 'slow' did not finish within 0.1 seconds and was abandoned."
    assert cancelled == [True]


def test_timeout_of_a_sync_tool_runs_it_in_a_thread() -> None:
    release = threading.Event()
    threads: list[str] = []

    @tool(timeout=0.1)
    def blocking() -> str:
        """Block."""
        threads.append(threading.current_thread().name)
        release.wait(5)
        return "late"

    async def main() -> ToolResult:
        try:
            return await blocking.run()
        finally:
            release.set()

    result = run(main())
    assert result.error == "TimeoutError" and "within 0.1 seconds" in result.observation
    assert threads and threads[0] != threading.main_thread().name

    @tool(timeout=5)
    def quick(x: int) -> int:
        """Quick."""
        return x * 2

    assert run(quick.run({"x": 21})).output == 42


def test_a_default_timeout_applies_to_tools_without_their_own() -> None:
    release = threading.Event()

    @tool
    def stuck() -> str:
        """Never answers (a call with no timeout of its own)."""
        release.wait(5)
        return "late"

    @tool(timeout=math.inf)
    async def patient() -> str:
        """Takes its time, and may."""
        await asyncio.sleep(0.3)
        return "in time"

    @tool(timeout=0.1)
    async def own() -> str:
        """Has its own timeout, shorter than the default."""
        await asyncio.sleep(1)
        return "never"

    async def main() -> list[ToolResult]:
        try:
            return [
                await stuck.run(default_timeout=0.2),
                await patient.run(default_timeout=0.1),
                await own.run(default_timeout=30),
            ]
        finally:
            release.set()

    abandoned, waited, shorter = run(main())
    assert abandoned.observation == "Error: tool 'stuck' did not finish within 0.2 seconds and was abandoned."
    assert waited.output == "in time", "math.inf: never abandoned"
    assert "within 0.1 seconds" in shorter.observation, "a tool's own timeout wins"
    release.clear()
    assert run(patient.run()).ok and stuck.timeout is None


def test_flow_tools_are_detected_and_embedded(local: dflow.Runtime) -> None:
    assert fetch_page.is_flow and not search.is_flow
    assert tool(flow=True, name="echo")(lambda url: DFlow.just(url)).is_flow
    assert not tool(flow=False)(fetch_page.fn).is_flow
    built = fetch_page.flow({"url": "https://example.org"})
    assert isinstance(built, DFlow)
    assert DFlow.direct_run("https://example.org", lambda u: fetch_page.flow({"url": u})).result(
        timeout=10
    ) == ("<html>https://example.org</html>")
    assert fetch_page.result("<html/>", call_id="c1") == ToolResult(
        name="fetch_page", observation="<html/>", output="<html/>", call_id="c1"
    )
    invalid = fetch_page.flow(ToolCall(id="c2", name="fetch_page", arguments={}))
    assert isinstance(invalid, ToolResult) and not invalid.ok and "url: Field required" in invalid.observation
    with pytest.raises(TypeError, match="flow tool"):
        run(fetch_page.run({"url": "x"}))
    with pytest.raises(TypeError, match="not a flow tool"):
        search.flow({"query": "x"})
    not_a_flow = tool(flow=True, name="text")(lambda: "text").flow()
    assert isinstance(not_a_flow, ToolResult) and "returned str, not a DFlow" in not_a_flow.observation


def test_bad_tool_definitions_are_refused() -> None:
    with pytest.raises(ValueError, match="tool name 'bad name'"):
        tool(name="bad name")(lambda: None)
    with pytest.raises(ValueError, match="tool name '<lambda>'"):
        tool(lambda: None)
    with pytest.raises(TypeError, match=r"\*args"):
        tool(name="varargs")(lambda *args: None)
    with pytest.raises(ValueError, match="timeout"):
        tool(timeout=0, name="zero")(lambda: None)

    async def async_flow() -> DFlow[str]:
        return DFlow.just("x")

    with pytest.raises(ValueError, match="flow tool"):
        tool(async_flow)


def test_any_parameter_name_works() -> None:
    @tool
    def odd(json: str, model_config: int = 1, schema: bool = False) -> list[Any]:
        """Odd names."""
        return [json, model_config, schema]

    assert set(odd.parameters["properties"]) == {"json", "model_config", "schema"}
    assert run(odd.run({"json": "{}", "schema": True})).output == ["{}", 1, True]
    assert odd("a", 2) == ["a", 2, False]  # the Tool still calls like the function


def test_sphinx_docstrings() -> None:
    @tool
    def lookup(key: str, default: str = "") -> str:
        """Look a key up.

        :param key: the key to find.
        :param str default: returned when the key is missing.
        """
        return default

    assert lookup.description == "Look a key up."
    assert lookup.parameters["properties"]["key"]["description"] == "the key to find."
    assert lookup.parameters["properties"]["default"]["description"] == "returned when the key is missing."


def test_terminate_reads_a_validated_status() -> None:
    assert terminate.parameters == {
        "type": "object",
        "properties": {
            "status": {
                "type": "string",
                "enum": ["success", "failure"],
                "description": "how the interaction ended.",
            },
            "conclusion": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "default": None,
                "description": "the final answer or a summary of what was done.",
            },
        },
        "required": ["status"],
    }
    done = run(terminate.run({"status": "success", "conclusion": "It is 18°C."}, call_id="t1"))
    assert done == ToolResult(
        name="terminate",
        observation="The interaction has been completed with status: success. It is 18°C.",
        output={"status": "success", "conclusion": "It is 18°C."},
        call_id="t1",
    )
    assert run(terminate.run({"status": "failure"})).output == {"status": "failure", "conclusion": None}
    sneaky = run(terminate.run({"status": "not a success"}))  # no substring test
    assert not sneaky.ok and sneaky.error == "ValidationError"
    custom = terminate_tool(name="finish", description="Stop.")
    assert custom.spec.name == "finish" and custom.spec.description == "Stop."


@pytest.mark.parametrize(
    ("said", "status"),
    [
        ("Success", "success"),
        (" success ", "success"),
        ("succeeded", "success"),
        ("SUCCESSFUL.", "success"),
        ("completed", "success"),
        ("failure", "failure"),
        ("Failed", "failure"),
        ("error!", "failure"),
        ("'unsuccessful'", "failure"),
    ],
)
def test_terminate_reads_the_status_leniently(said: str, status: str) -> None:
    assert terminate_status(said) == status
    assert run(terminate.run({"status": said})).output == {"status": status, "conclusion": None}


@pytest.mark.parametrize("said", ["maybe", "not a success", "partly done", "", 1, None])
def test_terminate_refuses_a_status_it_cannot_read(said: object) -> None:
    assert terminate_status(said) is None
    refused = run(terminate.run({"status": said}))
    assert (
        not refused.ok
        and refused.error == "ValidationError"
        and "'success' or 'failure'" in refused.observation
    )


def test_pickling_round_trips() -> None:
    by_reference = pickle.dumps(search)  # a module-level @tool travels by name
    assert pickle.loads(by_reference) is search
    assert len(by_reference) < 200

    suffix = "!"

    @tool(timeout=3, name="shout")
    def local_tool(text: str) -> str:
        """Shout."""
        return text.upper() + suffix

    for original in (local_tool, get_weather, terminate, fetch_page):
        copy = cloudpickle.loads(cloudpickle.dumps(original))
        assert isinstance(copy, Tool)
        assert (copy.spec, copy.timeout, copy.is_flow) == (original.spec, original.timeout, original.is_flow)
    copy = cloudpickle.loads(cloudpickle.dumps(local_tool))
    assert run(copy.run({"text": "hi"})).observation == "HI!"


class Counter:
    """Count words."""

    async def __call__(self, text: str) -> int:
        return len(text.split())


def test_callable_objects_and_partials_are_tools() -> None:
    import functools

    counter = tool(name="count_words")(Counter())
    assert counter.description == "Count words."
    assert counter.parameters == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    assert run(counter.run({"text": "one two three"})).output == 3

    def power(base: int, exponent: int) -> int:
        return base**exponent

    square = tool(name="square", description="Square a number.")(functools.partial(power, exponent=2))
    assert square.parameters["required"] == ["base"]
    assert run(square.run({"base": 7})).output == 49
