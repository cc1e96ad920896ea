"""``adapters``, the old import name of ``dflow.adapters``: deprecated in dflow-runtime 0.2,
removed in 0.3.

``alias_old_name()`` warns, then makes ``adapters`` the module ``dflow.adapters`` and each
``adapters.x`` the module ``dflow.adapters.x``: the same module objects, so an object pickled
under an old name (``adapters.redis.store.RedisStore``) loads as the same class. It runs when
``adapters`` is imported: from the small package installed under that name
(``adapters/_old_name``), or from this folder itself when a checkout's root is on ``sys.path``.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

OLD, NEW = "adapters", "dflow.adapters"


class _OldNames(MetaPathFinder, Loader):
    """Finds ``adapters.x`` as ``dflow.adapters.x`` (a meta path finder and its loader)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        return ModuleSpec(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(NEW + spec.name[len(OLD) :])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the module's __spec__ to the alias's: give it back its own.
        alias = module.__spec__
        assert alias is not None
        module.__spec__ = alias.loader_state


def alias_old_name() -> None:
    """Warn about the old name, and make it an alias of the new one (see above)."""
    warnings.warn(
        "the import name 'adapters' is deprecated and goes in dflow-runtime 0.3: import 'dflow.adapters' "
        "(e.g. from dflow.adapters.redis import RedisStore)",
        DeprecationWarning,
        stacklevel=3,  # past this function and the module being imported: the line that imports it
    )
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())  # before the path finders, which would load a second copy
    sys.modules[OLD] = importlib.import_module(NEW)
