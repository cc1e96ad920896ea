"""The examples in ``examples/`` run as users run them and print what they say."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_fallback_model_example_degrades_and_compensates() -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "fallback_model.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "A short answer to 'why is the sky blue?'", "the small model's answer"
    assert any(
        re.match(r"├─ #\d+ +big-model", line) and " fallback " in line and "StepTimeoutError" in line
        for line in lines
    ), out.stdout
    assert any("small-model" in line and " done " in line for line in lines), out.stdout
    assert "compensated: LookupError: no rooms left; cancelled car-ada, cancelled flight-ada" in lines
    assert any("hotel" in line and " failed " in line for line in lines), out.stdout
    assert took < 10, f"the example took {took:.1f}s: the slow model was waited for?"
