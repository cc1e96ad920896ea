"""The packages of the ``agents`` extra, checked before anything of ``dflow_agents`` imports them.

Without them ``import dflow_agents`` (or of any of its modules) fails with the command that
installs them, as ``dflow.metrics`` and ``dflow.otel`` do, rather than a bare ``No module named``.
``openai`` is not among them: :class:`OpenAIChatModel` imports it when first used, and says so.
"""

from __future__ import annotations

import importlib

NEEDED = ("httpx", "html_to_markdown", "w3lib")  # what the crawler's fetcher imports at load


def check_installed() -> None:
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(
                f"dflow_agents needs the 'agents' extra: pip install 'dflow-runtime[agents]' ({exc})"
            ) from exc


check_installed()
