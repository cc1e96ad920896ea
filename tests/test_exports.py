"""The public surface: explicit, sorted, complete."""

from __future__ import annotations

import importlib

import pytest

import dflow

PUBLIC_MODULES = ["client", "context", "errors", "flow", "memory", "policy", "runtime", "store", "transport"]
# Seams for adapter authors, reached as dflow.store / dflow.transport, not re-exported.
ADAPTER_SEAM = {
    "Advance",
    "BlobsMissingError",
    "BranchResult",
    "Claim",
    "Committed",
    "Compensations",
    "Fail",
    "Finish",
    "Fork",
    "Frames",
    "FusedDispatch",
    "NewRun",
    "Parent",
    "RunReader",
    "RunWriter",
    "Taken",
    "Transition",
    "Wait",
    "compensations_in",
    "deadline_text",
    "fused_variant",
    "timed_out_error",
}


@pytest.mark.parametrize("package", ["dflow", "dflow.testing", "dflow.adapters", "dflow_agents"])
def test_all_is_sorted_and_resolves(package: str) -> None:
    mod = importlib.import_module(package)
    names = list(mod.__all__)
    assert names == sorted(names), f"{package}.__all__ is not sorted"
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(mod, name), f"{package}.__all__ names {name!r}, which it does not define"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_is_exported(module: str) -> None:
    mod = importlib.import_module(f"dflow.{module}")
    missing = set(mod.__all__) - set(dflow.__all__) - ADAPTER_SEAM
    assert not missing, f"dflow.{module} defines {sorted(missing)} but dflow does not export them"


def test_public_callables_have_docstrings() -> None:
    for name in dflow.__all__:
        obj = getattr(dflow, name)
        if callable(obj):
            assert obj.__doc__, f"dflow.{name} has no docstring"


def test_core_imports_no_infrastructure_clients() -> None:
    import subprocess
    import sys

    code = "import dflow, dflow.adapters, sys; print([m for m in ('redis', 'kafka', 'openai') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
