"""What ``dflow worker`` imports: the app's modules, checked as it starts.

A module name that cannot be found is told apart from a module that was found and failed
to import (a dependency missing inside it, a syntax error): the first gets a hint about
where modules are looked for (the current directory, ``--app-dir``), the second the
traceback of what failed inside it. Modules that build no pipeline, and pipelines of one
name built twice, are logged as warnings: a worker without the pipeline of a step parks it.
"""

from __future__ import annotations

import importlib
import logging
import os
import traceback
from collections import Counter
from collections.abc import Sequence

from ..errors import ConfigurationError
from ..model import registry

__all__ = ["import_app_modules"]

log = logging.getLogger("dflow.worker")


def _missing_itself(module: str, exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` says ``module`` itself (or a package above it) is not there."""
    name = exc.name or ""
    return name == module or module.startswith(name + ".")


def _import(module: str, app_dir: str | None) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if _missing_itself(module, exc):
            where = f"--app-dir {app_dir}" if app_dir else f"the current directory ({os.getcwd()})"
            raise ConfigurationError(
                f"no module named {module!r}: looked in {where} and the installed packages; check its "
                "name, run from the app's directory, or pass --app-dir DIR"
            ) from None
        raise ConfigurationError(_failed_inside(module, exc)) from None
    except Exception as exc:
        raise ConfigurationError(_failed_inside(module, exc)) from None


def _failed_inside(module: str, exc: BaseException) -> str:
    """The one line to raise for ``module`` failing inside with ``exc``; its traceback (the
    app's frames, not the import machinery's) goes to the log first."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not (f.filename.startswith("<frozen") or f.filename == __file__ or "importlib" in f.filename)
    ]
    tb = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
    log.error(
        "dflow worker: importing module %r failed:\nTraceback (most recent call last):\n%s",
        module,
        tb.rstrip(),
    )
    hint = " (a dependency it imports is not installed)" if isinstance(exc, ModuleNotFoundError) else ""
    return f"module {module!r} was found but failed to import{hint}: {type(exc).__name__}: {exc}"


def import_app_modules(modules: Sequence[str], app_dir: str | None = None) -> None:
    """Import ``modules`` (see the module): ``ConfigurationError`` for one that cannot be
    imported; warnings for modules that build no pipeline and names built twice."""
    for module in modules:
        before = len(registry.pipelines())
        _import(module, app_dir)
        if len(registry.pipelines()) == before:
            log.warning(
                "dflow worker: module %r builds no pipeline (no .init() ran when it was imported): this "
                "worker parks the steps of pipelines it lacks",
                module,
            )
    if not registry.pipelines():
        log.warning("dflow worker: the modules %s build no pipeline at all", ", ".join(modules))
    twice = [name for name, n in Counter(p.name for p in registry.pipelines()).items() if n > 1]
    for name in twice:
        log.warning(
            "dflow worker: %d different pipelines are named %r: runs list and count them as one; give each "
            "its own name in .init(NAME)",
            sum(p.name == name for p in registry.pipelines()),
            name,
        )
