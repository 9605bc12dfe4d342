"""`torch.ops.neuron.run_neff(neff, inputs) -> outputs`: the operator a traced module's
TorchScript form calls, so that `torch.jit.save` stores the NEFF (a uint8 tensor) inside
the file and `torch.jit.load` gives back a module that runs it, once `neuron_rtd.torch` is
imported (it registers the operator; without it TorchScript says "Unknown builtin op:
neuron::run_neff").

The operator's kernel runs the NEFF on the daemon through the process's place: one copy
per loaded module, loaded at its first inference and unloaded when the module goes, as a
traced module's own copy is (`runtime.Loaded`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from collections.abc import Iterator, Sequence

import torch

from neuron_rtd.torch.runtime import Loaded, Package

NAMESPACE = "neuron"
SCHEMA = "run_neff(Tensor neff, Tensor[] inputs) -> Tensor[]"

_library = torch.library.Library(NAMESPACE, "DEF")
_library.define(SCHEMA)

# While a module's TorchScript form is traced, the operator answers these (copies of
# them) instead of running: the trace records the call, not an inference.
_stand_in: contextvars.ContextVar[Sequence[torch.Tensor] | None] = contextvars.ContextVar(
    "neuron_run_neff_stand_in", default=None
)
_copies: dict[int, Loaded] = {}  # by id() of the module's NEFF buffer
_copies_lock = threading.Lock()


def run_neff(neff: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The kernel of `neuron::run_neff`: `neff`'s outputs on `inputs`."""
    stand_in = _stand_in.get()
    if stand_in is not None:
        return [t.clone() for t in stand_in]
    return _copy_of(neff)(inputs)


_library.impl("run_neff", run_neff, "CPU")


def _copy_of(neff: torch.Tensor) -> Loaded:
    """The copy of the NEFF in `neff`, the buffer of one loaded module: made at its first
    inference, unloaded when the buffer goes (torch keeps one Python object per tensor
    while the module holds it, so its id names the module's copy)."""
    with _copies_lock:
        loaded = _copies.get(id(neff))
        if loaded is None:
            loaded = _copies[id(neff)] = Loaded(Package.of(neff.numpy()))
            weakref.finalize(neff, _forget, id(neff), loaded).atexit = False
        return loaded


def _forget(key: int, loaded: Loaded) -> None:
    with _copies_lock:
        if _copies.get(key) is loaded:
            del _copies[key]
    loaded.unload()


@contextlib.contextmanager
def standing_in(outputs: Sequence[torch.Tensor]) -> Iterator[None]:
    """In the block, `run_neff` answers `outputs` without running (for tracing)."""
    token = _stand_in.set(tuple(outputs))
    try:
        yield
    finally:
        _stand_in.reset(token)
