"""The web console of ``dflow serve`` (under ``/console``): runs listed, filtered and followed
live, a run's step tree, its calls answered, cancels and reruns, behind a login. ``routes``
holds the pages and the login (``console_router``, which ``create_app`` adds), ``api`` the
JSON the pages read and the actions, ``shared`` what both use (the ``Console``, the runs
list's query), ``auth`` the login and anti-forgery tokens, ``html`` the pages' HTML,
``tree`` a run's step tree with its branches and ``tree_html`` that tree drawn, ``views``
the conversation views of shared objects (an agent's chat), ``static/`` the stylesheet and
script. Nothing here is imported by users: ``dflow.server.create_app(console=True)``
serves it.
"""

from __future__ import annotations

from .routes import console_router
from .shared import Console

__all__ = ["Console", "console_router"]
