"""The package imports one way: each unit only from its own layer or those below it.

A unit is a subpackage of ``dflow`` (``dflow.model``, ``dflow.runtime``...; the adapters are
one) or a module at the top of it (``dflow.store``). Every import statement counts, those
inside functions too (a lazy import is still a dependency); only those under
``if TYPE_CHECKING:`` do not. Within a layer, units may import each other but not in a
circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: lowest first. A unit not listed here fails the test: place it when you add it.
LAYERS: list[set[str]] = [
    {
        "errors",
        "policy",
        "transport",
        "clock",
    },  # foundations: the error tree, retry policies, the Transport and Clock seams
    {"wire"},  # what crosses a process boundary: values, step messages, run ids, keys, objects by name, URLs
    {
        "context",
        "store",
        "store_capabilities",
        "compensations",
        "mailbox",
        "shared_state",
        "schedules",
        "run_pages",
        "parts",
        "live",
        "rate_limits",
        "workers",
        "run_notes",
    },  # the seams: a run's context, Store (its optional parts, its runs' compensations flag), shared state,
    # schedules, pages, the parts of a step, live events,
    # token buckets, workers' heartbeats, run notes
    {"model", "observe"},  # the flow model and its interpreter (and its port to the runtime); observers' seam
    {
        "memory",
        "patterns",
        "adapters",
    },  # the in-memory store; saga, rerun, deadlock, State, Circuit; Redis, Kafka
    {"ops"},  # operations: the step tree, JSON logs, metrics, traces, the worker's observability flags
    {"runtime"},  # the worker loop, steps, dispatch, timers, the process's runtime, Run, stores from URLs
    {
        "client",  # the public homes: re-exports of what users import from their old paths
        "flow",
        "state",
        "circuit",
        "deadlock",
        "metrics",
        "otel",
        "server",  # the HTTP API and the console (dflow serve)
        "cli",  # the command line
        "testing",  # the contract suites for adapters
    },
    {"__init__"},  # the package's public surface
]
#: modules that only re-export names defined elsewhere, where users import them from
PUBLIC_HOMES = ("client", "flow", "state", "circuit", "deadlock", "metrics", "otel", "memory", "runtime")
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _unit(module: str) -> str | None:
    """The layering unit of a dotted module name, or ``None`` when it is not ours."""
    parts = module.split(".")
    if parts[0] == "adapters":
        return "adapters"
    if parts[0] != "dflow":
        return None
    if len(parts) == 1:
        return "__init__"
    return "adapters" if parts[1] == "adapters" else parts[1]


def _files() -> dict[Path, str]:
    """Each source file of the package and the adapters, with its dotted module name."""
    out: dict[Path, str] = {}
    for path in sorted((ROOT / "dflow").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    for path in sorted((ROOT / "adapters").rglob("*.py")):
        parts = ("dflow",) + path.relative_to(ROOT).with_suffix("").parts
        out[path] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for each import in ``path`` outside ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:  # ``from . import x``: each name is a module
                found.extend((node.lineno, f"{target}.{a.name}") for a in node.names)
            else:
                found.append((node.lineno, target))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    edges: dict[str, set[str]] = {}
    wrong: list[str] = []
    for path, module in _files().items():
        src = _unit(module)
        assert src is not None
        assert src in LAYER, f"{path.relative_to(ROOT)}: module {src!r} has no layer; add it to LAYERS"
        for line, target in _imports(path, module):
            dst = _unit(target)
            if dst is None or dst == src:
                continue
            assert dst in LAYER, f"{path.relative_to(ROOT)}:{line} imports {target}, which has no layer"
            edges.setdefault(src, set()).add(dst)
            if LAYER[dst] > LAYER[src]:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line}: {src} (layer {LAYER[src]}) imports "
                    f"{target} (layer {LAYER[dst]})"
                )
    return edges, wrong


def test_every_import_goes_down_the_layers() -> None:
    _, wrong = _graph()
    assert not wrong, "imports that go up:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    edges, _ = _graph()
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> None:
        if node in path:
            pytest.fail("import circle: " + " -> ".join(path[path.index(node) :] + [node]))
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            walk(nxt, path + [node])
        done.add(node)

    for node in sorted(edges):
        walk(node, [])


def test_the_model_imports_neither_the_runtime_nor_the_client() -> None:
    """The model is below what runs it: DFlow's entry points reach a runtime through
    ``dflow.model.running``, which the runtime fills in."""
    edges, _ = _graph()
    assert not edges.get("model", set()) & {"runtime", "client"}, sorted(edges["model"])


def test_the_public_homes_only_re_export() -> None:
    """A public home defines nothing: each name lives in the package that owns it."""
    for name in PUBLIC_HOMES:
        path = ROOT / "dflow" / name / "__init__.py"
        path = path if path.exists() else ROOT / "dflow" / f"{name}.py"
        body = ast.parse(path.read_text()).body
        for node in body[1:]:  # after the docstring
            plain = isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
            )
            assert plain, f"{path.relative_to(ROOT)}:{node.lineno} defines something; move it to its package"


def test_agents_use_only_the_public_api() -> None:
    """``dflow_agents`` stands on what users can use: no ``dflow._x``, no ``dflow.x._y``."""
    private = []
    for path in sorted((ROOT / "dflow_agents").rglob("*.py")):
        for line, target in _imports(path, "dflow_agents." + path.stem):
            parts = target.split(".")
            if parts[0] == "dflow" and any(p.startswith("_") for p in parts[1:]):
                private.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not private, "dflow_agents imports private dflow modules:\n" + "\n".join(private)


def test_the_checker_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    """The scan counts imports inside functions, and skips only ``if TYPE_CHECKING``."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .client import Pipeline\n"
        "def f():\n    from .runtime import Runtime\n    from . import flow\n"
    )
    ours = [(line, target) for line, target in _imports(src, "dflow.m") if target.startswith("dflow")]
    assert ours == [(5, "dflow.runtime"), (6, "dflow.flow")]
