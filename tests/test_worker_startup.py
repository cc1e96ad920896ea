"""``dflow worker`` checks what it starts with: a module name not found is told apart from a
module that fails inside (whose traceback is shown), modules that build no pipeline and
pipelines of one name built twice are warned about, a bad log level is one line,
``--version`` says the version, and ``--help`` names every environment variable read. The real
command line, in a process of its own (``--help``: in this one)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import dflow
from dflow.cli import main

ROOT = Path(__file__).resolve().parent.parent
SECRET = "test-secret-of-the-startup-tests-0123456789"


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


def _worker(app: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    url = _closed_url()  # (nothing there: the worker stops at its first ping, after the checks)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dflow.cli",
            "worker",
            *args,
            "--store",
            url,
            "--transport",
            url,
            "--app-dir",
            str(app),
        ],
        cwd=app,
        env={**os.environ, "PYTHONPATH": str(ROOT), "DFLOW_SECRET": SECRET, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "needs_dep.py").write_text("import a_dependency_not_installed_0123  # noqa\n")
    (tmp_path / "empty_app.py").write_text("X = 1\n")
    (tmp_path / "twice_app.py").write_text(
        "from dflow import DFlow\n"
        "a = DFlow.from_call('a').map(lambda x: x).id('one').init('orders')\n"
        "b = DFlow.from_call('b').map(lambda x: x).id('two').init('orders')\n"
    )
    return tmp_path


def test_a_module_name_not_found_gets_a_hint_and_no_traceback(app: Path) -> None:
    done = _worker(app, "tpyo_app")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"dflow worker: no module named 'tpyo_app': looked in --app-dir {app} and the installed packages; "
        "check its name, run from the app's directory, or pass --app-dir DIR"
    ]


def test_a_module_that_fails_inside_shows_the_traceback_of_what_failed(app: Path) -> None:
    done = _worker(app, "needs_dep")
    assert done.returncode == 2
    assert f'File "{app / "needs_dep.py"}", line 1, in <module>' in done.stderr
    assert "ModuleNotFoundError: No module named 'a_dependency_not_installed_0123'" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "dflow worker: module 'needs_dep' was found but failed to import (a dependency it imports is not "
        "installed): ModuleNotFoundError: No module named 'a_dependency_not_installed_0123'"
    )


def test_a_module_that_builds_no_pipeline_is_warned_about(app: Path) -> None:
    done = _worker(app, "empty_app")
    assert "WARNING dflow.worker: dflow worker: module 'empty_app' builds no pipeline" in done.stderr
    assert "cannot reach the store" in done.stderr and done.returncode == 2


def test_two_pipelines_of_one_name_are_warned_about(app: Path) -> None:
    done = _worker(app, "twice_app")
    assert "dflow worker: 2 different pipelines are named 'orders'" in done.stderr, done.stderr


def test_a_bad_log_level_is_one_line_with_the_choices(app: Path) -> None:
    done = _worker(app, "empty_app", "--log-level", "LOUD")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "argument --log-level: invalid choice: 'LOUD' (choose from 'DEBUG', 'INFO'" in done.stderr
    from_env = _worker(app, "empty_app", env={"DFLOW_LOG_LEVEL": "loud"})
    assert from_env.returncode == 2 and "Traceback" not in from_env.stderr
    assert from_env.stderr.strip() == (
        "dflow worker: the log level is one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'"
    )
    lower = _worker(app, "empty_app", "--log-level", "debug")  # (lower case is fine: on to the store)
    assert lower.returncode == 2 and "cannot reach the store" in lower.stderr


def test_the_version_is_printed() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dflow.cli", "--version"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"dflow {dflow.__version__}"


@pytest.mark.parametrize(
    ("queues", "said"),
    [
        (
            "",
            "--queues '' names no queue (or an empty one): give queue names separated by commas, e.g. --queues gpu,default",
        ),
        (
            "gpu,g.p",
            "--queues 'gpu,g.p': queue name 'g.p' is not allowed: use letters, digits, '_' and '-', 1 to 64 of them",
        ),
    ],
)
def test_an_empty_or_odd_queues_list_stops_the_worker_in_one_line_naming_it(
    app: Path, queues: str, said: str
) -> None:
    done = _worker(app, "empty_app", "--queues", queues)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"dflow worker: {said}"]


@pytest.mark.parametrize(
    ("command", "sources"),
    [("worker", ["worker.py", "options.py"]), ("serve", ["serve.py", "options.py"])],
)
def test_the_help_of_a_command_names_every_environment_variable_it_reads(
    command: str, sources: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    read = {
        v for name in sources for v in re.findall(r"DFLOW_[A-Z_]+", (ROOT / "dflow/cli" / name).read_text())
    }
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # (argparse wraps its lines)
    assert len(read) > 3, read
    assert [v for v in sorted(read) if v not in shown] == [], f"dflow {command} --help does not name them"
