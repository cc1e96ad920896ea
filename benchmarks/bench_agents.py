"""The framework's own cost per agent turn: dflow's ToolCallAgent (local mode, and Redis
Streams with one worker process) against LangGraph's prebuilt ReAct agent.

    python benchmarks/bench_agents.py           # writes benchmarks/results/agents.{json,md}
    python benchmarks/bench_agents.py --quick   # fewer runs, prints only

Every system plays the same scripted conversation with a model that answers at once:
``TURNS`` turns of three calls of a trivial ``add`` tool, then the answer (so a run is
``TURNS + 1`` model calls). Per turn = wall time of a run / (TURNS + 1), runs one at a
time, after warm-up; ``work`` is the time of the model function and the tool calls made
directly, which every system pays. LangGraph (``pip install langgraph``) is optional: a
peer that cannot run is reported as such. Redis needs 127.0.0.1:6379 (db 12, flushed).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks import _bench_agents as app
from benchmarks._procs import one_worker
from benchmarks._results import quick, report, system_rows
from dflow_agents import ChatMessage

SECRET = "bench-agents-secret-0123456789abcdef"
REDIS = "redis://127.0.0.1:6379/12"
PER_RUN = app.TURNS + 1


def per_turn(walls: list[float]) -> dict[str, float]:
    turns = [w / PER_RUN for w in walls]
    return {"median_us": statistics.median(turns) * 1e6, "min_us": min(turns) * 1e6,
            "mean_us": statistics.fmean(turns) * 1e6, "runs": len(walls)}


def timed(fn: Any, runs: int) -> list[float]:
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return walls


def work_per_run() -> float:
    """The model function and the tools called directly, as one run calls them."""
    messages = [ChatMessage.user("go")]
    t0 = time.perf_counter()
    for _ in range(200):
        conversation = list(messages)
        while True:
            reply = app.decide(conversation, [])
            conversation.append(reply.to_message())
            if not reply.tool_calls:
                break
            for c in reply.tool_calls:
                conversation.append(ChatMessage.tool(str(app.add.fn(**c.arguments)), tool_call_id=c.id))
    return (time.perf_counter() - t0) / 200


def bench_local(runs: int) -> dict[str, Any]:
    dflow.global_init_for_test()
    try:
        for _ in range(20):
            assert app.agent.run("go").result(30).ok
        walls = timed(lambda: app.agent.run("go").result(30), runs)
        t0 = time.perf_counter()
        many = [app.agent.run("go") for _ in range(runs)]
        for r in many:
            r.result(120)
        concurrent = (time.perf_counter() - t0) / (runs * PER_RUN)
    finally:
        dflow.shutdown()
    return {**per_turn(walls), "concurrent_us": concurrent * 1e6}


def bench_redis(runs: int) -> dict[str, Any]:
    with one_worker("benchmarks._bench_agents", REDIS, "bench-agents", SECRET, 64):
        for _ in range(10):
            assert app.agent.run("go").result(30).ok
        walls = timed(lambda: app.agent.run("go").result(60), runs)
        return per_turn(walls)


def bench_langgraph(runs: int) -> dict[str, Any]:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import create_react_agent

    class ScriptedChat(BaseChatModel):
        """The same script as the dflow agent's model, as a LangChain chat model."""

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
            turn = sum(isinstance(m, AIMessage) for m in messages)
            if turn >= app.TURNS:
                msg = AIMessage(content="done")
            else:
                calls = [{"name": "add", "args": {"a": turn, "b": i}, "id": f"c{turn}_{i}"}
                         for i in range(app.TOOLS_PER_TURN)]
                msg = AIMessage(content="", tool_calls=calls)
            return ChatResult(generations=[ChatGeneration(message=msg)])

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    @lc_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(ScriptedChat(), tools=[add])

    def one() -> None:
        out = graph.invoke({"messages": [("user", "go")]})
        assert out["messages"][-1].content == "done"

    for _ in range(20):
        one()
    return per_turn(timed(one, runs))


def main() -> None:
    is_quick = quick(__doc__)
    runs = 30 if is_quick else 200
    results: dict[str, Any] = {"turns_per_run": PER_RUN, "tools_per_turn": app.TOOLS_PER_TURN,
                               "work_per_turn_us": work_per_run() / PER_RUN * 1e6}
    results["dflow_local"] = bench_local(runs)
    try:
        results["dflow_redis_streams_1_worker"] = bench_redis(max(10, runs // 4))
    except Exception as exc:
        results["dflow_redis_streams_1_worker"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        results["langgraph"] = bench_langgraph(runs)
    except ImportError as exc:
        results["langgraph"] = {"error": f"not installed ({exc})"}
    report("agents", results, render(results), keep=not is_quick)


def render(results: dict[str, Any]) -> str:
    work = results["work_per_turn_us"]
    lines = [
        f"Agent turn: one model call + {results['tools_per_turn']} tool calls (a run: "
        f"{results['turns_per_run']} turns; the model and tools answer at once; work done by them "
        f"≈ {work:.0f} µs per turn, included below)",
        "",
        "| system | per turn, median | min | mean | concurrent runs, per turn |",
        "|---|---:|---:|---:|---:|",
    ]
    names = {"dflow_local": "dflow ToolCallAgent, local mode",
             "dflow_redis_streams_1_worker": "dflow ToolCallAgent, Redis Streams, 1 worker",
             "langgraph": "LangGraph create_react_agent (in process)"}

    def cells(r: dict[str, Any]) -> str:
        conc = f"{r['concurrent_us']:.0f} µs" if "concurrent_us" in r else ""
        return f"**{_t(r['median_us'])}** | {_t(r['min_us'])} | {_t(r['mean_us'])} | {conc}"

    lines += system_rows(results, names, cells, columns=4)
    local, lg = results.get("dflow_local", {}), results.get("langgraph", {})
    if "median_us" in local and "median_us" in lg:
        lines += ["", f"LangGraph / dflow local, median per turn: **{lg['median_us'] / local['median_us']:.1f}×**"]
    return "\n".join(lines)


def _t(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


if __name__ == "__main__":
    main()
