"""The documentation site builds strictly, its runnable examples print what the pages say, and its
API reference covers every public name.

Runnable examples. In the Markdown of ``docs/`` (and of the README), an HTML comment marks a code
block, invisible on the rendered page:

    <!-- run -->          before a ```python block: a whole program, run on its own (a fresh
                          interpreter, an empty working directory, no DFLOW_* or OPENAI_*
                          variables) in local mode; it must exit 0.
    <!-- prints -->       before a ```text block that follows a runnable block: exactly what that
                          program prints (its stdout, line by line).

A block without a marker is not run (a worker command, a snippet that needs Redis or a model).
A marker that is not followed by its kind of block is an error here, not a block quietly skipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = [sys.executable, "-m", "mkdocs"]

_MARKER = re.compile(r"^<!-- (run|prints) -->[ \t]*$")
_FENCE = re.compile(r"^```(\w*)")


@dataclasses.dataclass(frozen=True)
class Example:
    """A runnable block of a page: where it is, its code and what it prints (``None``: unsaid)."""

    page: str
    line: int
    code: str
    prints: list[str] | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _fenced(lines: list[str], start: int, where: str, language: str) -> tuple[str, int]:
    """The body of the fenced block that opens at the first non-blank line from ``start``."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    opened = _FENCE.match(lines[i]) if i < len(lines) else None
    if opened is None or opened.group(1) != language:
        raise AssertionError(f"{where}: the marker must be followed by a ```{language} block")
    end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
    if end is None:
        raise AssertionError(f"{where}: the ```{language} block is not closed")
    return "".join(line + "\n" for line in lines[i + 1 : end]), end + 1


def runnable_blocks(path: Path) -> Iterator[Example]:
    """The examples of one Markdown file marked runnable, in page order."""
    page = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        if marker is None:
            i += 1
            continue
        if marker.group(1) == "prints":
            raise AssertionError(f"{page}:{i + 1}: <!-- prints --> must follow a <!-- run --> block")
        line = i + 1  # the marker's line, as an editor numbers it
        code, i = _fenced(lines, i + 1, f"{page}:{line}", "python")
        prints = None
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        after = _MARKER.match(lines[j]) if j < len(lines) else None
        if after is not None and after.group(1) == "prints":
            text, i = _fenced(lines, j + 1, f"{page}:{j + 1}", "text")
            prints = text.splitlines()
        yield Example(page, line, code, prints)


def run_example(example: Example, cwd: Path) -> list[str]:
    """Run an example as a program of its own; its stdout's lines (it must exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLOW_", "OPENAI_"))}
    env["PYTHONPATH"] = str(ROOT)  # the checkout's packages, as a reader's install has them
    done = subprocess.run(
        [sys.executable, "-c", example.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, f"{example} failed:\n{done.stderr}"
    return done.stdout.splitlines()


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


EXAMPLES = [example for page in _pages() for example in runnable_blocks(page)]


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_a_runnable_example_prints_what_its_page_says(example: Example, tmp_path: Path) -> None:
    out = run_example(example, tmp_path)
    if example.prints is not None:
        assert out == example.prints, f"{example} printed something else than its page says"


def test_the_pages_mark_examples_runnable_and_say_what_most_print() -> None:
    # Guards the convention itself: a renamed marker would leave every example unrun.
    assert len(EXAMPLES) >= 20, [str(e) for e in EXAMPLES]
    assert sum(e.prints is not None for e in EXAMPLES) >= 15


def test_a_marker_without_its_block_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- run -->\n\n```sh\nmake demo\n```\n")
    with pytest.raises(AssertionError, match=r"page.md:1: the marker must be followed by a ```python block"):
        list(runnable_blocks(page))
    page.write_text("<!-- prints -->\n\n```text\nhello\n```\n")
    with pytest.raises(AssertionError, match=r"must follow a <!-- run --> block"):
        list(runnable_blocks(page))


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor
    # Not --quiet: it hides the warnings that --strict counts, and the build passes.
    return subprocess.run(
        [*MKDOCS, "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_site_builds_strictly_with_its_api_reference(tmp_path: Path) -> None:
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    reference = (tmp_path / "site" / "reference" / "dflow" / "index.html").read_text()
    for anchor in ("dflow.DFlow", "dflow.DFlow.flat_map", "dflow.Run.result", "dflow.configure"):
        assert f'id="{anchor}"' in reference, f"the API reference has no entry {anchor}"
    adapters = (tmp_path / "site" / "reference" / "adapters" / "index.html").read_text()
    assert 'id="dflow.adapters.redis.RedisStore"' in adapters


def test_a_broken_link_or_reference_fails_the_strict_build(tmp_path: Path) -> None:
    """The site's own settings on a page with a broken link, then on one with an unknown object."""
    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    python = settings["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT / p) for p in python["paths"]]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    for text, said in (
        ("[nowhere](no-such-page.md)\n", "no-such-page.md"),
        ("::: dflow.NoSuchThing\n", "dflow.NoSuchThing"),
    ):
        docs = tmp_path / said / "docs"
        docs.mkdir(parents=True)
        (docs / "index.md").write_text("# A page\n\n" + text)
        config = tmp_path / said / "mkdocs.yml"
        config.write_text(yaml.safe_dump({**settings, "docs_dir": str(docs), "nav": ["index.md"]}))
        built = _build(config, tmp_path / said / "site")
        assert built.returncode != 0, f"a page with {text.strip()!r} built"
        assert said in built.stdout + built.stderr


# The public modules whose every name the API reference documents; dflow.adapters' classes are
# documented in the submodule that holds each (dflow.adapters.redis, dflow.adapters.kafka).
PUBLIC = ("dflow", "dflow.testing", "dflow.adapters", "dflow_agents", "dflow_agents.testing")


def _documented() -> set[str]:
    found = set()
    for page in (DOCS / "reference").glob("*.md"):
        found |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.MULTILINE))
    return found


def test_the_api_reference_documents_every_public_name() -> None:
    documented = _documented()
    missing = []
    for name in PUBLIC:
        module = importlib.import_module(name)
        for public in module.__all__:
            paths = {f"{name}.{public}"}
            if name == "dflow.adapters":
                paths |= {f"dflow.adapters.redis.{public}", f"dflow.adapters.kafka.{public}"}
            if not paths & documented:
                missing.append(f"{name}.{public}")
    assert not missing, f"add a '::: NAME' line to a page of docs/reference/ for each of {missing}"
