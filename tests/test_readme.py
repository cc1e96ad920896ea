"""The README's example runs and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_example_runs() -> None:
    text = (ROOT / "README.md").read_text()
    code = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S)
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
