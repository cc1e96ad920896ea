"""What bench_agents.py, bench_crawler.py and bench_pulling.py share around their
measurements: the ``--quick`` switch, the rows of a table of systems, and the table printed
and, for a full run, kept in ``benchmarks/results/<name>.md`` with the results and the
machine in ``<name>.json``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def quick(doc: str) -> bool:
    """Whether the command line asks for ``--quick`` (fewer runs, print only); ``doc`` is the
    script's docstring, whose first line describes it in ``--help``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    return bool(ap.parse_args().quick)


def system_rows(
    results: Mapping[str, Any], names: Mapping[str, str], cells: Callable[[dict[str, Any]], str], columns: int
) -> list[str]:
    """A markdown row for each system of ``names`` (its key in ``results`` → the name shown):
    the name, then ``cells(its results)``, or its ``error`` and empty cells up to
    ``columns`` (those after the name)."""
    rows = []
    for key, name in names.items():
        r = results.get(key, {})
        rows.append(
            f"| {name} | {r['error']} |" + " |" * (columns - 1)
            if "error" in r
            else f"| {name} | {cells(r)} |"
        )
    return rows


def machine() -> dict[str, Any]:
    """What the results were measured on, and when."""
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }


def report(name: str, results: dict[str, Any], table: str, *, keep: bool, into: Path = RESULTS) -> None:
    """Print ``table``; with ``keep``, write it to ``<into>/<name>.md`` and ``results`` with
    :func:`machine` (``meta``) to ``<into>/<name>.json``."""
    print(table)
    if keep:
        into.mkdir(exist_ok=True)
        (into / f"{name}.json").write_text(json.dumps({"meta": machine(), **results}, indent=2) + "\n")
        (into / f"{name}.md").write_text(table + "\n")
