"""`neuron-cli`'s runtime control: NCGs (`ncgs`), models (`models`), one inference
(`infer`), over what every such command shares (`command`: address, `--json`, a
session-less client, errors as one line and exit code 1)."""

from neuron_rtd.tools.control.command import Answer, Command, Failure
from neuron_rtd.tools.control.infer import Infer
from neuron_rtd.tools.control.models import ListModel, Load, Reset, Start, Stop, Unload
from neuron_rtd.tools.control.ncgs import CreateNcg, DestroyNcg, ListNcg

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
