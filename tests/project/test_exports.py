"""Each package face says what it exports, in trio's manner: every name in its `__all__`
is there, once, and is no module's private name, and every public name the face binds
itself (defined there or imported from the project) is in `__all__`, so a name added to a
face without a thought for its users fails here."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The faces: packages that code outside them imports by their __init__ only (the import
# contracts of pyproject.toml), and the other packages that declare what they export.
FACES = (
    "neuron_rtd.runtime",
    "neuron_rtd.client",
    "neuron_rtd.serving",
    "neuron_rtd.server",
    "neuron_rtd.compiler",
    "neuron_rtd.neff",
    "driver_sim",
)
PROJECT = ("neuron_rtd", "driver_sim")


def bound_names(source: str, package: str) -> set[str]:
    """The public names a module binds at its top level by its own statements: its
    definitions and assignments, and what it imports from the project (an import from
    outside, `typing` or `grpc`, is the module's business, not its face)."""
    names: set[str] = set()
    tree = ast.parse(source)
    body = list(tree.body)
    for node in body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports name the face too
            body.extend(node.body)
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            source_module = "." * node.level + (node.module or "")
            if node.level or source_module.split(".")[0] in (*PROJECT, package.split(".")[0]):
                names.update(alias.asname or alias.name for alias in node.names)
    return {name for name in names if not name.startswith("_")}


def problems(module: ModuleType) -> list[str]:
    """What is wrong with `module`'s `__all__`, one line each."""
    exported = getattr(module, "__all__", None)
    if exported is None:
        return [f"{module.__name__} has no __all__"]
    found = []
    seen: set[str] = set()
    for name in exported:
        if name in seen:
            found.append(f"{name} is in __all__ twice")
        seen.add(name)
        if name.startswith("_"):
            found.append(f"{name} is private, and in __all__")
            continue
        try:
            value = getattr(module, name)
        except AttributeError:
            found.append(f"{name} is in __all__ and not in the module")
            continue
        own = (
            getattr(value, "__name__", None) if inspect.isclass(value) or callable(value) else None
        )
        if isinstance(own, str) and own.startswith("_"):
            found.append(f"{name} is {value.__module__}'s private {own}")
    source = inspect.getsource(module)
    for name in sorted(bound_names(source, module.__name__) - set(exported)):
        if not isinstance(getattr(module, name, None), ModuleType):
            found.append(f"{name} is bound in the face and not in __all__")
    return found


@pytest.mark.parametrize("face", FACES)
def test_each_face_exports_what_it_binds_once(face: str) -> None:
    assert problems(importlib.import_module(face)) == []


def test_a_broken_face_fails_each_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: a face with each fault is caught, fault by fault."""
    package = tmp_path / "broken_face"
    package.mkdir()
    (package / "impl.py").write_text(
        "class _Hidden:\n    pass\n\ndef helper() -> None:\n    pass\n\nclass Shown:\n    pass\n"
    )
    (package / "__init__.py").write_text(
        "from typing import Any\n"
        "from broken_face.impl import Shown, helper\n"
        "from broken_face.impl import _Hidden as Hidden\n"
        "LIMIT = 3\n"
        "__all__ = ['Shown', 'Shown', 'Hidden', 'Gone', '_private']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        found = problems(importlib.import_module("broken_face"))
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "broken_face"]:
            del sys.modules[name]
    assert sorted(found) == sorted(
        [
            "Shown is in __all__ twice",
            "Hidden is broken_face.impl's private _Hidden",
            "Gone is in __all__ and not in the module",
            "_private is private, and in __all__",
            "LIMIT is bound in the face and not in __all__",
            "helper is bound in the face and not in __all__",
        ]
    )
