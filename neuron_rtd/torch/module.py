"""`NeuronModule`: what `trace` returns, a torch.nn.Module over a compiled NEFF.

It takes the arguments its module took at trace time (tensors in the same tuples, lists
and dicts) and answers outputs in the module's own structure; the NEFF it carries (the
`neff` buffer) is loaded on the daemon at its first call and unloaded when the module is
deleted (or the process ends).

Saving: `torch.jit.save(module, path)` writes its TorchScript form (`scripted()`: the
arguments flattened, `torch.ops.neuron.run_neff` on the NEFF buffer, the outputs rebuilt),
which `torch.jit.load` reads back in any process that imported `neuron_rtd.torch`, and
`load` as the NeuronModule it was.
`torch.save` pickles the module itself (for what TorchScript cannot carry: a dict output
whose values are of mixed kinds).
"""

from __future__ import annotations

import json
import os
import warnings
import weakref
from collections.abc import Sequence
from typing import IO, Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from neuron_rtd.torch.errors import InputMismatch, NeuronTorchError
from neuron_rtd.torch.op import standing_in
from neuron_rtd.torch.runtime import Loaded, Package, Place

METADATA = "neuron_rtd.json"  # the extra file of a saved module: its name and structures


class NeuronModule(nn.Module):
    """A traced module: its NEFF run by neuron-rtd, called as the module was."""

    neff: torch.Tensor

    def __init__(
        self,
        package: Package,
        in_spec: pytree.TreeSpec,
        out_spec: pytree.TreeSpec,
        *,
        name: str,
        place: Place | None = None,
    ) -> None:
        """`place`: where to load it (None: the process's, from the environment at the
        first call)."""
        super().__init__()
        self.register_buffer("neff", torch.from_numpy(package.data))
        self.in_spec = in_spec
        self.out_spec = out_spec
        self.traced_name = name
        self._runtime_state(package, place)

    def _runtime_state(self, package: Package, place: Place | None) -> None:
        # plain tensor arguments: their count, for `leaves` to skip pytree (None: nested)
        plain = all(child.is_leaf() for child in self.in_spec.children())
        self._arity = self.in_spec.num_leaves if plain else None
        self._single_output = self.out_spec.is_leaf()
        self.package = package
        self.loaded = Loaded(package, place)
        finalizer = weakref.finalize(self, self.loaded.unload)
        finalizer.atexit = False  # at exit the place's session ends instead: all go at once

    def forward(self, *args: Any) -> Any:
        return self.out_spec_of(self.loaded(self.leaves(args)))

    def leaves(self, args: tuple[Any, ...]) -> Sequence[torch.Tensor]:
        """The call's tensors, in the order traced; InputMismatch for another structure.
        Plain tensor arguments skip pytree (a call's fixed cost counts)."""
        if len(args) == self._arity:
            for t in args:
                if not isinstance(t, torch.Tensor):
                    break
            else:
                return args
        leaves, spec = pytree.tree_flatten(args)
        if spec != self.in_spec or not all(isinstance(t, torch.Tensor) for t in leaves):
            raise InputMismatch(
                f"{self.traced_name} was traced with arguments {shown(self.in_spec)}; "
                f"got {shown(spec, leaves)}"
            )
        return leaves

    def out_spec_of(self, outputs: list[torch.Tensor]) -> Any:
        """The outputs in the module's structure."""
        if self._single_output:
            return outputs[0]
        return pytree.tree_unflatten(outputs, self.out_spec)

    def on(self, place: Place) -> NeuronModule:
        """Another copy of this module, loaded on `place` (DataParallel's copies)."""
        return NeuronModule(
            self.package, self.in_spec, self.out_spec, name=self.traced_name, place=place
        )

    def extra_repr(self) -> str:
        ins = ", ".join(self.package.expected(t) for t in self.package.inputs)
        return f"{self.traced_name}, NEFF {self.package.data.nbytes} bytes, inputs: {ins}"

    # --- saving -----------------------------------------------------------------------
    def scripted(self) -> torch.jit.ScriptModule:
        """The TorchScript form of this module (what `torch.jit.save` writes)."""
        package = self.package
        ins = [_zeros(t.shape, t.dtype) for t in package.inputs]
        outs = [_zeros(t.shape, t.dtype) for t in package.outputs]
        args = pytree.tree_unflatten(ins, self.in_spec)
        try:
            with standing_in(outs), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.jit.trace(
                    OnNeff(self.neff, self.out_spec), args, strict=False, check_trace=False
                )
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1]
            raise NeuronTorchError(
                f"TorchScript cannot hold {self.traced_name}'s outputs "
                f"{shown(self.out_spec)} ({first}): save it with torch.save(module, path) "
                "and read it with torch.load(path, weights_only=False) after "
                "`import neuron_rtd.torch`"
            ) from None

    def save(self, f: Any, _extra_files: dict[str, Any] | None = None) -> None:
        """`torch.jit.save(module, path)` calls this: the TorchScript form, saved with
        what `load` needs to make this module again (METADATA)."""
        self.scripted().save(f, _extra_files=self._with_metadata(_extra_files))

    def save_to_buffer(self, _extra_files: dict[str, Any] | None = None) -> bytes:
        """`torch.jit.save(module, file_object)` calls this."""
        extra = self._with_metadata(_extra_files)
        data: bytes = self.scripted().save_to_buffer(_extra_files=extra)
        return data

    def _with_metadata(self, extra_files: dict[str, Any] | None) -> dict[str, Any]:
        metadata = {
            "name": self.traced_name,
            "in_spec": pytree.treespec_dumps(self.in_spec),
            "out_spec": pytree.treespec_dumps(self.out_spec),
        }
        return {**(extra_files or {}), METADATA: json.dumps(metadata)}

    # --- pickling (torch.save) ----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The module without its runtime state, its structures as pytree's JSON."""
        state = dict(self.__dict__)
        for runtime in ("package", "loaded", "_arity", "_single_output"):
            state.pop(runtime, None)
        for spec in ("in_spec", "out_spec"):
            state[spec] = pytree.treespec_dumps(state[spec])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for spec in ("in_spec", "out_spec"):
            state[spec] = pytree.treespec_loads(state[spec])
        super().__setstate__(state)
        self._runtime_state(Package.of(self.neff.numpy()), None)


def load(f: str | os.PathLike[str] | IO[bytes]) -> NeuronModule:
    """A module saved by `torch.jit.save` from a traced module, as the `NeuronModule` it
    was (its errors said plainly, DataParallel-able), where `torch.jit.load` gives its
    TorchScript form (which runs too, its errors inside TorchScript's)."""
    extra = {METADATA: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's, not the caller's
        scripted = torch.jit.load(f, _extra_files=extra)
    if not extra[METADATA]:
        raise NeuronTorchError(
            f"{f!r} holds a TorchScript module, not one saved from neuron_rtd.torch.trace's "
            "result: load it with torch.jit.load"
        )
    metadata = json.loads(extra[METADATA])
    neff = scripted.neff
    return NeuronModule(
        Package.of(neff.numpy()),
        pytree.treespec_loads(metadata["in_spec"]),
        pytree.treespec_loads(metadata["out_spec"]),
        name=metadata["name"],
    )


class OnNeff(nn.Module):
    """The TorchScript form's module: flat arguments to `neuron::run_neff`, outputs
    rebuilt in `out_spec`'s structure (the trace keeps the structure, not the code)."""

    def __init__(self, neff: torch.Tensor, out_spec: pytree.TreeSpec) -> None:
        super().__init__()
        self.register_buffer("neff", neff)
        self.out_spec = out_spec

    def forward(self, *args: Any) -> Any:
        leaves, _ = pytree.tree_flatten(args)
        outputs = torch.ops.neuron.run_neff(self.neff, leaves)
        return pytree.tree_unflatten(list(outputs), self.out_spec)


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    return torch.from_numpy(np.zeros(shape, dtype))


def shown(spec: pytree.TreeSpec, leaves: list[Any] | None = None) -> str:
    """A structure for a message: `(Tensor, {'mask': Tensor})`."""
    names = [
        "Tensor" if leaves is None or isinstance(leaf, torch.Tensor) else type(leaf).__name__
        for leaf in (leaves if leaves is not None else [None] * spec.num_leaves)
    ]
    return repr(pytree.tree_unflatten([_Name(n) for n in names], spec))


class _Name(str):
    """A leaf's name, shown bare in a repr."""

    def __repr__(self) -> str:
        return str(self)
