"""The package's types, checked: mypy (strict) and basedpyright over the packages, and over
``tests/typecheck/user_code.py``, whose ``assert_type`` lines are what users' code can lean
on and whose marked lines are misuse that must be reported (see that file).

The checkers read the packages as they install: ``pyproject.toml`` may map a package to a
folder of another name (the folder ``adapters/`` installs as ``dflow.adapters``), which no
type checker follows, so the sources are copied into that layout first, in the system temp
dir. The checkers are in the ``dev`` extra. Under ``CI=true`` a missing one fails the test;
locally it is skipped. Each takes about 10 s cold on the CI machine (mypy keeps its cache
beside the copy: a warm run takes a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import dflow

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: where the copy and mypy's cache are kept between runs: one place per checkout
WORK = Path(tempfile.gettempdir()) / f"dflow-typecheck-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"

#: the top-level packages each checker reads, besides tests/typecheck (those that exist)
MYPY_PACKAGES = ("dflow", "dflow_agents", "adapters")
PYRIGHT_PACKAGES = ("dflow", "dflow_agents", "adapters")
#: copied beside the packages: the checkers' settings, local stubs, the user code
EXTRAS = ("pyproject.toml", "typings", "tests/typecheck")


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed: pip install -e '.[dev]'"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def _setuptools_config() -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        config: dict[str, Any] = tomllib.load(f).get("tool", {}).get("setuptools", {})
    return config


def installed_layout() -> dict[str, Path]:
    """Each package as it installs, by dotted name, with the folder its modules are in:
    ``[tool.setuptools] packages`` and ``package-dir`` of pyproject.toml, or, where it lists
    no packages, those found under dflow/, dflow_agents/ and adapters/ as they are."""
    config = _setuptools_config()
    package_dir: dict[str, str] = config.get("package-dir", {})
    packages = config.get("packages")
    if not isinstance(packages, list):
        packages = [
            ".".join(init.parent.relative_to(ROOT).parts)
            for top in ("dflow", "dflow_agents", "adapters")
            for init in sorted((ROOT / top).rglob("__init__.py"))
            if "_old_name" not in init.parts
        ]
    layout: dict[str, Path] = {}
    for name in packages:
        parts = name.split(".")
        for i in range(len(parts), -1, -1):  # the longest mapped prefix, as setuptools reads it
            prefix = ".".join(parts[:i])
            if prefix in package_dir:
                layout[name] = ROOT / package_dir[prefix] / Path(*parts[i:])
                break
        else:  # pragma: no cover - "" is not mapped: the root
            layout[name] = ROOT / Path(*parts)
    return layout


@pytest.fixture(scope="module")
def tree() -> Path:
    """A copy of the packages in their installed layout, with the EXTRAS (mtimes kept, so
    that mypy's cache stays warm), one for each process of the run: under ``make test`` the two
    checkers may run at once on two processes."""
    out = WORK / f"tree-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    shutil.rmtree(out, ignore_errors=True)
    for name, folder in installed_layout().items():
        dest = out / Path(*name.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            if f.is_file() and (f.suffix in (".py", ".pyi") or f.name == "py.typed"):
                shutil.copy2(f, dest / f.name)
    for extra in EXTRAS:
        src = ROOT / extra
        if src.is_dir():
            shutil.copytree(src, out / extra, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, out / extra)
    return out


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=540, check=False
    )


def _check(args: list[str], tool: str, cwd: Path, cache: Path | None = None) -> None:
    proc = _run(args, cwd)
    if cache is not None and "INTERNAL ERROR" in proc.stdout + proc.stderr:
        # mypy crashed reading its incremental cache (seen once, never again from a clean
        # one): what a cold run says is the answer, as on a fresh CI machine
        shutil.rmtree(cache, ignore_errors=True)
        proc = _run(args, cwd)
    if proc.returncode != 0:
        pytest.fail(
            f"{tool} reported errors (exit {proc.returncode}; paths are the installed layout, "
            f"copied to {cwd}):\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )


def _targets(tree: Path, packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if (tree / p).is_dir()] + ["tests/typecheck"]


@pytest.mark.timeout(600)
def test_mypy_strict(tree: Path) -> None:
    _require("mypy")
    cache = WORK / "mypy-cache"
    _check(
        ["mypy", "--strict", "--cache-dir", str(cache), *_targets(tree, MYPY_PACKAGES)], "mypy", tree, cache
    )


@pytest.mark.timeout(600)
def test_basedpyright(tree: Path) -> None:
    _require("basedpyright")
    _check(
        ["basedpyright", "--pythonpath", sys.executable, *_targets(tree, PYRIGHT_PACKAGES)],
        "basedpyright",
        tree,
    )


# -- the user code runs as well: what it asserts of the types holds of the values ------------


@pytest.fixture
def user_code() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(
        "dflow_typecheck_user_code", ROOT / "tests/typecheck/user_code.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def test_user_code_builds_its_flows(user_code: ModuleType) -> None:
    for name in ("sources_and_map", "flat_maps", "error_handlers", "joins", "calls"):
        getattr(user_code, name)()


def test_user_code_runs(user_code: ModuleType, local: dflow.Runtime) -> None:
    user_code.pipelines_and_runs()
    asyncio.run(user_code.runs_async())
