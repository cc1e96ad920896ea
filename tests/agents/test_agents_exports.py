"""The public surface of dflow_agents: explicit, sorted, documented, on public dflow only."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import dflow_agents

PACKAGE = pathlib.Path(dflow_agents.__file__).parent


@pytest.mark.parametrize(
    "name", ["dflow_agents", "dflow_agents.testing", "dflow_agents.qwen", "dflow_agents.tools"]
)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    names = list(module.__all__)
    assert names == sorted(names) and len(names) == len(set(names))
    for public in names:
        assert hasattr(module, public), f"{name}.__all__ names {public!r}, which it does not define"


def test_public_modules_are_re_exported() -> None:
    for path in PACKAGE.glob("*.py"):
        if path.name.startswith("_") or path.stem == "testing":
            continue
        module = importlib.import_module(f"dflow_agents.{path.stem}")
        missing = set(module.__all__) - set(dflow_agents.__all__)
        assert not missing, (
            f"dflow_agents.{path.stem} defines {sorted(missing)} but dflow_agents does not export them"
        )


@pytest.mark.parametrize("name", ["dflow_agents", "dflow_agents.testing"])
def test_public_callables_have_docstrings(name: str) -> None:
    module = importlib.import_module(name)
    for public in module.__all__:
        obj = getattr(module, public)
        if callable(obj) and not isinstance(obj, dflow_agents.Tool) and not hasattr(obj, "__origin__"):
            assert obj.__doc__, f"{name}.{public} has no docstring"


def test_only_the_public_dflow_api_is_imported() -> None:
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert not node.module.startswith("dflow."), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("dflow."), f"{path.name} imports {alias.name}"
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "dflow"
            ):
                assert not node.attr.startswith("_"), f"{path.name} uses dflow.{node.attr}"
