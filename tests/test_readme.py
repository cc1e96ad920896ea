"""The README's example runs and prints what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.DOTALL)
    assert code is not None
    out = subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "{'q': 'why is the sky blue?', 'turn': 3}"
    assert "think" in out.stdout and "loop" in out.stdout


def test_demo_runs_and_prints_its_step_tree() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "answer after 3 turns from 3 sources, approved=True"
    assert any("sources" in line and "3 branches" in line for line in lines)
    assert any("recovered" in line for line in lines)


def test_agent_example_runs_with_its_scripted_model() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "agent.py")], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "finished: Paris is sunny at 24 °C (75.2 °F); Oslo has rain at 11 °C."
    assert any("zip" in line and "2 branches" in line for line in lines)


def test_readme_agent_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Agents\n.*?```python\n(.*?)```", text, re.DOTALL)
    assert code is not None
    out = subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["Sunny, 24 °C."]
