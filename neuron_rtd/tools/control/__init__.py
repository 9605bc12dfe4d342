"""`neuron-cli`'s runtime control: NCGs (`ncgs`), models (`models`), one inference
(`infer`), over what every such command shares (`command`: address, `--json`, a
session-less client, errors as one line and exit code 1).

The names below are imported when first asked for, so that a subcommand imports only its
own module (`list-model` not `infer`'s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_rtd.tools.control.command import Answer, Command, Failure
    from neuron_rtd.tools.control.infer import Infer
    from neuron_rtd.tools.control.models import ListModel, Load, Reset, Start, Stop, Unload
    from neuron_rtd.tools.control.ncgs import CreateNcg, DestroyNcg, ListNcg

# each name, and the module of this package that defines it
_WHERE = {
    "Answer": "command",
    "Command": "command",
    "Failure": "command",
    "Infer": "infer",
    "ListModel": "models",
    "Load": "models",
    "Reset": "models",
    "Start": "models",
    "Stop": "models",
    "Unload": "models",
    "CreateNcg": "ncgs",
    "DestroyNcg": "ncgs",
    "ListNcg": "ncgs",
}

__all__ = [
    "Answer",
    "Command",
    "CreateNcg",
    "DestroyNcg",
    "Failure",
    "Infer",
    "ListModel",
    "ListNcg",
    "Load",
    "Reset",
    "Start",
    "Stop",
    "Unload",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
