"""The runtime: what runs flows, in a worker process or in local mode.

The worker loop (``worker``: ``Runtime``, made of the parts that follow), a step's way from
its claim to its commit (``cycle``), what a claimed step does (``step``), its client side
(``dispatch``: start runs, deliver calls, cancel), timers and lease renewal (``upkeep``), the
observers of the step path (``observers``), whether it is stopping (``lifecycle``), this process's runtime on its event loop
(``process``: ``configure``, ``global_init_for_test``, ``attach``), the ``Run`` handle
(``run``), stores and transports from URLs (``connect``), and the model's port (``runner``:
how ``DFlow``'s entry points reach this process's runtime). Importing the package installs
that port. Public: ``Runtime`` here; ``Run``, ``configure`` and the rest through ``dflow``
and ``dflow.client``.
"""

from __future__ import annotations

from . import runner as _runner  # noqa: F401 - installs the model's port (dflow.model.running)
from .worker import Runtime

__all__ = ["Runtime"]
