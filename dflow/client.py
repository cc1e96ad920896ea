"""Starting runs, resuming them, and waiting for their results, from sync or async code.

The public home of ``Entry``, ``Pipeline`` (``dflow.model.pipeline``), ``MockedPipeline``
(``dflow.model.mocks``), ``Run``, ``gather``
(``dflow.runtime.run``) and the functions that make, reach and stop this process's runtime
(``dflow.runtime.process``). The runtime lives on its own event loop in a background
thread. Sync calls hand their work to that loop and wait; async calls await it from any
loop. Inside a step (on the runtime's loop) use the async forms: a sync call there cannot
wait without blocking the very loop it waits for.
"""

from __future__ import annotations

from .model.mocks import MockedPipeline
from .model.pipeline import Entry, Pipeline
from .model.pipeline import Out_co as Out_co
from .model.pipeline import Start as Start
from .model.pipeline import entry_run as entry_run
from .model.pipeline import new_trace as new_trace
from .runtime.process import (
    _current as _current,  # (as attach and detach: for the command line and the server)
)
from .runtime.process import _Host as _Host
from .runtime.process import attach as attach
from .runtime.process import configure, current_runtime, global_init_for_test, shutdown
from .runtime.process import detach as detach
from .runtime.run import Run, gather
from .runtime.runner import acall as acall
from .runtime.runner import astart as astart
from .runtime.runner import call as call
from .runtime.runner import start as start

__all__ = [
    "Entry",
    "MockedPipeline",
    "Pipeline",
    "Run",
    "configure",
    "current_runtime",
    "gather",
    "global_init_for_test",
    "shutdown",
]
