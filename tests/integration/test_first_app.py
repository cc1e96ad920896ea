"""The documentation's "Your first distributed app", as a user runs it: two ``dflow worker``
processes serving ``examples.orders.flows`` on Redis, and ``python -m examples.orders.client``,
which prints what the page says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.workers import Workers, streams_transport

from .conftest import SECRET

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "running" / "first-app.md"


def _printed_on_the_page() -> list[str]:
    found = re.search(r"<!-- the client prints -->\n```text\n(.*?)```", PAGE.read_text(), re.S)
    assert found is not None, "the page shows what the client prints"
    return found.group(1).splitlines()


def test_the_first_app_runs_on_two_workers_and_prints_what_its_page_says(redis_url: str, prefix: str) -> None:
    env = {
        "DFLOW_SECRET": SECRET,
        "DFLOW_STORE": f"{redis_url}?prefix={prefix}",
        "DFLOW_TRANSPORT": streams_transport(redis_url, prefix),
    }
    workers = Workers("examples.orders.flows", env["DFLOW_TRANSPORT"], env["DFLOW_STORE"], env)
    workers.start(2)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "examples.orders.client"],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        codes = workers.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == _printed_on_the_page()
    assert codes == [0, 0], workers.output()
    served = "".join(log.read_text() for log in workers.logs)
    assert served.count("serving examples.orders.flows") == 2
