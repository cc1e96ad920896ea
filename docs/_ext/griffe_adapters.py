"""A griffe extension for the API reference: the folder ``adapters/`` installs as ``dflow.adapters``
(a package-dir mapping in pyproject.toml), which griffe cannot follow from the sources. When it has
loaded ``dflow``, this loads the folder and hangs it under ``dflow`` as ``adapters``, so that
``::: dflow.adapters.redis.RedisStore`` documents the class at the path users import it from.
"""

from __future__ import annotations

from typing import Any

import griffe


class AdaptersUnderDflow(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "dflow" or "adapters" in pkg.members:
            return
        adapters = loader.load("adapters")  # the folder, found on the handler's paths
        assert isinstance(adapters, griffe.Module)
        # Its own imports were resolved under the name "adapters", which stays in the collection
        # (the same object) so that they resolve; its path is now dflow.adapters.
        pkg.set_member("adapters", adapters)
