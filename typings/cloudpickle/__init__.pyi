# What dflow uses of cloudpickle, which ships no type hints. Read by mypy (mypy_path) and
# pyright (its default stubPath, typings/) when they check the package.
import pickle
from typing import Any

__version__: str

class Pickler(pickle.Pickler): ...

CloudPickler = Pickler

def __getattr__(name: str) -> Any: ...  # the rest of the module, untyped
