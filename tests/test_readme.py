"""The README: a short front door whose example runs and prints what it says (the marker
convention of tests/test_docs.py), and the demo and the agent example it points to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.test_docs import run_example, runnable_blocks

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    (example,) = list(runnable_blocks(ROOT / "README.md"))
    assert example.prints == ["{'q': 'why is the sky blue?', 'turn': 3}"]
    assert run_example(example, tmp_path) == example.prints
    assert len(example.code.splitlines()) <= 20, "the README's example stays short"


def test_the_readme_is_a_short_front_door_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "pip install 'dflow-runtime[redis]'" in text and "dflow worker " in text
    assert "make demo" in text and "make test" in text
    for words in ("targets met", "not met", "this session", "issue "):
        assert words not in text.lower(), f"the README reads like a report: {words!r}"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert any(link.startswith("docs/") for link in links)
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to files that are not there: {missing}"


def test_demo_runs_and_prints_its_step_tree() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "answer after 3 turns from 3 sources, approved=True"
    assert any("sources" in line and "3 branches" in line for line in lines)
    assert any("recovered" in line for line in lines)


def test_make_demo_says_what_it_installs_naming_each_core_dependency() -> None:
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block is not None
    core = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block.group(1), re.M)
    out = subprocess.run(["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (said,) = [line for line in lines if line.startswith("echo") and "core dependencies" in line]
    assert core and [d for d in core if d not in said] == [], f"{said} does not name all of {core}"
    installs = [line for line in lines if "pip install" in line and "-e ." in line]
    assert installs and all("--quiet" not in line for line in installs), "the install shows what it installs"


def test_agent_example_runs_with_its_scripted_model() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "finished: Paris is sunny at 24 °C (75.2 °F); Oslo has rain at 11 °C."
    tool_steps = [line for line in lines if re.search(r"#\d+\s+tool\s+done", line)]
    assert len(tool_steps) == 3, (
        "a turn's calls are one step: both weather calls, then convert, then terminate"
    )
    assert "'name': 'weather'" in tool_steps[0]
