"""A package face whose names load their modules when first asked for (`lazy_names`):
a command that needs one name of a package does not import every module behind it (the
client's numpy, the fronts' waitress)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: a name of `where` from the module it names
    there (imported then), a submodule by its own name, else AttributeError."""

    def attribute(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":  # the submodule's own import failed
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return attribute
