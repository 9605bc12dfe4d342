"""Which NeuronCores and devices a process may use, as the original SDK reads them:

- `NEURON_RT_VISIBLE_CORES`: the NeuronCores a client process (our `Client`, or
  `LocalRuntime`) puts its NCGs on, as machine-wide indices (device index * 4 + the NC on
  it): `4-7`, `0,1`, `4-7,9`. Ray sets it for each task and actor that asks for
  `neuron_cores`.
- `AWS_NEURON_VISIBLE_DEVICES`: the devices a daemon serves, as device indices (`1`,
  `0-1`), where `-t BDF` does not name them.

One parser for both lists (`parse_indices`), one way to show one (`show_indices`).
Unset or empty: no restriction. Bad syntax is an InvalidError naming the variable.

Shared by every layer and importing none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from neuron_rtd.errors import InvalidError

CORES_ENV = "NEURON_RT_VISIBLE_CORES"
DEVICES_ENV = "AWS_NEURON_VISIBLE_DEVICES"

_MOST = 1 << 16  # far beyond any machine's devices or NeuronCores: a typo, not a list


def parse_indices(text: str, variable: str, *, what: str = "NeuronCore") -> frozenset[int]:
    """`"4-7,9"` as {4, 5, 6, 7, 9}: comma-separated indices and inclusive ranges `a-b`
    (a <= b), spaces allowed around them. InvalidError naming `variable` for anything
    else, an empty list included."""
    indices: set[int] = set()
    for part in text.split(","):
        low, dash, high = (piece.strip() for piece in part.partition("-"))
        bounds = (low, high) if dash else (low,)
        if not all(b.isdigit() and b.isascii() for b in bounds):
            entry = part.strip()
            why = f"{entry!r} is not an index or a range" if entry else "an entry is empty"
            raise _syntax(text, variable, what, why)
        first, last = int(bounds[0]), int(bounds[-1])
        if first > last:
            raise _syntax(text, variable, what, f"the range {part.strip()} runs backwards")
        if last >= _MOST:
            raise _syntax(text, variable, what, f"{last} is no {what} index of any machine")
        indices.update(range(first, last + 1))
    return frozenset(indices)


def _syntax(text: str, variable: str, what: str, why: str) -> InvalidError:
    return InvalidError(
        f"{variable}={text!r}: {why}; give {what} indices and ranges separated by commas, "
        f"as in '4-7,9' or '0,1'"
    )


def show_indices(indices: Iterable[int]) -> str:
    """{4, 5, 6, 7, 9} as `4-7,9` (what `parse_indices` reads back)."""
    ordered = sorted(set(indices))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


@dataclass(frozen=True)
class VisibleCores:
    """The NeuronCores a process may use (machine-wide indices), as its environment said."""

    ncs: frozenset[int]
    text: str  # as given, for messages
    variable: str = CORES_ENV

    def explain(self, message: str) -> str:
        """A refusal of an NCG among these cores, saying where the restriction comes from
        and what to do."""
        return (
            f"{self.variable}={self.text} lets this process use NeuronCores "
            f"{show_indices(self.ncs)} only: {message}; widen {self.variable} (Ray sets it "
            "from the neuron_cores a task or actor asks for)"
        )


def visible_cores(environ: Mapping[str, str] | None = None) -> VisibleCores | None:
    """The NeuronCores `NEURON_RT_VISIBLE_CORES` names (None: unset or empty, any)."""
    env = os.environ if environ is None else environ
    text = env.get(CORES_ENV, "").strip()
    if not text:
        return None
    return VisibleCores(parse_indices(text, CORES_ENV), text)


def visible_devices(environ: Mapping[str, str] | None = None) -> frozenset[int] | None:
    """The device indices `AWS_NEURON_VISIBLE_DEVICES` names (None: unset or empty)."""
    env = os.environ if environ is None else environ
    text = env.get(DEVICES_ENV, "").strip()
    if not text:
        return None
    return parse_indices(text, DEVICES_ENV, what="device")
