"""The switch that keeps model requests on this machine (for tests).

On when ``block_network_models()`` was called or ``DFLOW_AGENTS_BLOCK_NETWORK`` is set to a
true value (``1``, ``true``, ``yes``, ``on``). Loopback hosts stay allowed, so tests can talk
to a server they started on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from .errors import ModelRequestBlockedError

__all__ = ["ENV_VAR", "check_allowed", "is_blocked", "set_blocked"]

ENV_VAR = "DFLOW_AGENTS_BLOCK_NETWORK"
_TRUE = {"1", "true", "yes", "on"}
_blocked = False


def set_blocked(blocked: bool) -> bool:
    """Turn the process-wide switch on or off; returns the previous setting."""
    global _blocked
    before, _blocked = _blocked, bool(blocked)
    return before


def is_blocked() -> bool:
    """Whether requests to non-loopback hosts are refused now."""
    return _blocked or os.environ.get(ENV_VAR, "").strip().lower() in _TRUE


def _is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_allowed(url: str) -> None:
    """Raise ``ModelRequestBlockedError`` if the switch is on and ``url`` leaves this machine."""
    if not is_blocked():
        return
    host = urlsplit(url).hostname or ""
    if not _is_loopback(host):
        raise ModelRequestBlockedError(
            f"model request to {host or url!r} refused: network model requests are blocked "
            f"({ENV_VAR} is set or dflow_agents.testing.block_network_models() was called). Use "
            "ScriptedModel / FunctionModel from dflow_agents.testing, or a server on 127.0.0.1",
            endpoint=url,
        )
