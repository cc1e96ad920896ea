"""The framework's own cost per agent turn, side by side: dflow's ToolCallAgent (local mode,
and Redis Streams with one worker process) against LangGraph's prebuilt ReAct agent without a
checkpointer, with InMemorySaver and with PostgresSaver.

    python benchmarks/bench_agents.py           # writes benchmarks/results/agents.{json,md}
    python benchmarks/bench_agents.py --quick   # fewer rounds, prints only

Every system plays the same scripted conversation with a model that answers at once:
``TURNS`` turns of three calls of a trivial ``add`` tool, then the answer (a run is
``TURNS + 1`` model calls). dflow runs with its defaults (the loop guard on). Per turn = a
run's wall time / (TURNS + 1), runs one at a time after warm-up. Rounds take the systems in
turn; each round's figure is the median of its runs, and the ratios are medians of per-round
ratios. The peers come from ``benchmarks/requirements.txt``; one that cannot run is reported
as such. Redis: a server of the benchmark's own (``redis-server`` on PATH). PostgreSQL:
``BENCH_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432``), in a database this
script creates and drops.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dflow
from benchmarks import _bench_agents as app
from benchmarks._fair import NOISE, Load, ms, ratio, rounds, spread, table
from benchmarks._procs import one_worker
from benchmarks._results import quick, report

SECRET = "bench-agents-secret-0123456789abcdef"
PER_RUN = app.TURNS + 1
POSTGRES = os.environ.get("BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432")
NAMES = {
    "dflow_local": "dflow ToolCallAgent, local mode",
    "dflow_redis": "dflow ToolCallAgent, Redis Streams, 1 worker process",
    "langgraph": "LangGraph create_react_agent, no checkpointer (in process)",
    "langgraph_memory": "LangGraph + InMemorySaver",
    "langgraph_postgres": "LangGraph + PostgresSaver (local PostgreSQL)",
}


def per_turn_of_runs(one: Callable[[], Any], runs: int) -> Callable[[], float]:
    """A round's figure: the median per-turn wall time of ``runs`` runs of ``one``."""

    def measure() -> float:
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            one()
            walls.append((time.perf_counter() - t0) / PER_RUN)
        return statistics.median(walls)

    return measure


class DflowModes:
    """This process as dflow's local mode or as the client of the Redis worker, switched
    between rounds (outside the timing), with a few warm-up runs after each switch."""

    def __init__(self, transport: str, store: str) -> None:
        self.urls, self.mode = (transport, store), ""

    def use(self, mode: str) -> None:
        if mode == self.mode:
            return
        dflow.shutdown()
        if mode == "local":
            dflow.global_init_for_test()
        else:
            dflow.configure(*self.urls, secret=SECRET, consume=False)
        self.mode = mode
        for _ in range(3):
            self.run()

    @staticmethod
    def run() -> None:
        assert app.agent.run("go").result(60).ok

    def system(self, mode: str, runs: int) -> Callable[[], float]:
        measure = per_turn_of_runs(self.run, runs)

        def one_round() -> float:
            self.use(mode)
            return measure()

        return one_round


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A database of this benchmark's own on ``POSTGRES``, dropped afterwards; yields its URL."""
    import psycopg

    name = f"dflow_bench_agents_{os.getpid()}"
    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{POSTGRES}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def langgraph_agent(checkpointer: Any = None) -> Callable[[], None]:
    """One run of LangGraph's prebuilt ReAct agent playing the script (a new thread each run)."""
    import warnings

    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import create_react_agent

    class ScriptedChat(BaseChatModel):
        """The same script as the dflow agent's model, as a LangChain chat model."""

        def _generate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
        ) -> ChatResult:
            turn = sum(isinstance(m, AIMessage) for m in messages)
            calls = [
                {"name": "add", "args": {"a": turn, "b": i}, "id": f"c{turn}_{i}"}
                for i in range(app.TOOLS_PER_TURN)
            ]
            done = turn >= app.TURNS
            msg = AIMessage(content="done") if done else AIMessage(content="", tool_calls=calls)
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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(ScriptedChat(), tools=[add], checkpointer=checkpointer)

    def one() -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = graph.invoke({"messages": [("user", "go")]}, config)
        assert out["messages"][-1].content == "done"

    for _ in range(10):
        one()
    return one


def peers(stack: contextlib.ExitStack, runs: int, errors: dict[str, str]) -> dict[str, Callable[[], float]]:
    """LangGraph's three systems, each that can run (why not in ``errors``)."""
    out: dict[str, Callable[[], float]] = {}
    try:
        from langgraph.checkpoint.memory import InMemorySaver

        out["langgraph"] = per_turn_of_runs(langgraph_agent(), runs)
        out["langgraph_memory"] = per_turn_of_runs(langgraph_agent(InMemorySaver()), runs)
    except ImportError as exc:
        errors["langgraph"] = errors["langgraph_memory"] = f"not installed ({exc})"
    try:
        from langgraph.checkpoint.postgres import PostgresSaver

        saver = stack.enter_context(PostgresSaver.from_conn_string(stack.enter_context(postgres_database())))
        saver.setup()
        out["langgraph_postgres"] = per_turn_of_runs(langgraph_agent(saver), runs)
    except Exception as exc:  # not installed, or no PostgreSQL here
        errors["langgraph_postgres"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return out


def main() -> None:
    is_quick = quick(__doc__ or "")
    count, runs = (3, 2) if is_quick else (15, 5)
    load, errors = Load(), {}
    with contextlib.ExitStack() as stack:
        urls = stack.enter_context(one_worker("benchmarks._bench_agents", "bench-agents", SECRET, 64))
        modes = DflowModes(*urls)
        systems = {"dflow_local": modes.system("local", runs), "dflow_redis": modes.system("redis", runs)}
        systems.update(peers(stack, runs, errors))
        seen = rounds(systems, count, load=load)
    results: dict[str, Any] = {
        "turns_per_run": PER_RUN,
        "tools_per_turn": app.TOOLS_PER_TURN,
        "rounds": count,
        "runs_per_round": runs,
        "load": load.summary(),
        "per_round_s": seen,
        "errors": errors,
    }
    report("agents", results, render(results), keep=not is_quick)


def render(res: dict[str, Any]) -> str:
    seen, errors = res["per_round_s"], res["errors"]
    bases = [b for b in ("langgraph", "langgraph_postgres") if b in seen]
    header = [
        "per agent turn (model call + 3 tool calls)",
        "median of rounds",
        "spread of rounds",
        "mean of rounds",
    ]
    header += [
        {"langgraph": "÷ LangGraph, no checkpointer", "langgraph_postgres": "÷ LangGraph + PostgresSaver"}[b]
        for b in bases
    ]
    rows = []
    for key, name in NAMES.items():
        if key not in seen:
            rows.append([name, errors.get(key, "not run"), "", "", *[""] * len(bases)])
            continue
        xs = seen[key]
        cells = [f"**{ms(statistics.median(xs))}**", spread(xs), ms(statistics.fmean(xs))]
        rows.append([name, *cells, *(f"{ratio(seen, key, b):.2f}×" for b in bases)])
    lines = [
        f"Agent turn: one model call + {res['tools_per_turn']} tool calls; a run is {res['turns_per_run']} turns, "
        f"one run at a time; {res['rounds']} interleaved rounds of {res['runs_per_round']} runs per system.",
        "",
        *table(header, rows),
        "",
        f"- {NOISE} Here: {Load.text(res['load'])}.",
        "- The model and the tools answer at once, so this is each framework's own cost per turn; "
        "with a real model a turn's time is the model's.",
        "- dflow runs with its defaults (the loop guard on); every turn's state is committed to the store, and "
        "on Redis a turn's tool calls are one step any worker may take, each call's result kept as it "
        "ends. LangGraph without a checkpointer "
        "persists nothing (a crash loses the run); InMemorySaver keeps checkpoints in the process only; "
        "PostgresSaver is the durable comparison.",
        "- Redis and PostgreSQL run on the same 2 cores as the client and the worker.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
