"""An inference's shapes: each input's shape from its byte count (a string input's from
its element count; an input may have one axis whose size varies by inference, a dynamic
dimension, worked out from the bytes and checked across inputs), the bucket that holds
its sizes (`variant_for`), and the moves between those shapes and a bucket's fixed-size
slot: inputs copied in (`fill_slot`: bytes, arrays, or read straight in from shared
memory or a batch's row blocks), padded with zeros up to it (a string input with copies
of its last row), outputs cut back down.

An input with free axes (`dynamic` on a model input: sizes the caller chooses, read by
CPU nodes only) takes the shape of the array it comes as (or of a batch's row blocks);
given as bytes, only when it has one varying axis in all, which the count tells. Its slot
holds a new array per inference (a `DynamicBuffer`), the bucket's axes padded as above."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from neuron_rtd.errors import BadInput
from neuron_rtd.neff import TensorSpec
from neuron_rtd.neff.dtypes import dtype_name, is_string
from neuron_rtd.runtime.driver import DynamicBuffer
from neuron_rtd.runtime.variant import Variant

Shape = tuple[int, ...]


class InputShapes:
    """The inputs of one model (`model_id`, `name`, in messages), and the shapes the
    bytes of an inference make of them."""

    def __init__(self, specs: Sequence[TensorSpec], model_id: int, name: str) -> None:
        self.specs = {t.name: t for t in specs}
        self.model_id = model_id
        self.name = name
        self._axis = {t.name: symbol_axis(t) for t in specs}  # worked out once
        self._free = {t.name: t.dynamic for t in specs if t.dynamic}  # free axes
        # String inputs, which come as arrays and are measured in elements, not bytes.
        self._strings = frozenset(t.name for t in specs if is_string(t.dtype))
        # Per input of fixed shape, its byte count (a spec works it out at every ask), or
        # its element count for a string input.
        self._fixed = {
            t.name: _size_of(t, t.name in self._strings)
            for t in specs
            if self._axis[t.name] is None and not t.dynamic
        }

    def check(self, inputs: Mapping[str, Any]) -> tuple[dict[str, Shape], dict[str, int]]:
        """The shape of each input, and the size each dynamic dimension takes in them."""
        shapes: dict[str, Shape] = {}
        sizes: dict[str, int] = {}
        fixed = self._fixed
        for name, data in inputs.items():
            spec = self.specs.get(name)
            if spec is None:
                raise BadInput(
                    f"model {self.model_id} ({self.name}) has no input named '{name}'; "
                    f"its inputs are: {', '.join(self.specs)}"
                )
            if name in self._strings:  # an array of str (`DataPath`): its elements count
                size = data.size
            else:
                size = len(data) if type(data) is bytes else nbytes(data)
            if fixed.get(name) == size:  # the common case: a fixed shape, all its bytes
                shapes[name] = spec.shape
            elif name in self._free:
                shapes[name] = self._free_shape(spec, data, size, sizes)
            else:
                shapes[name] = self._shape(spec, size, sizes)
        if len(shapes) < len(self.specs):  # every name given is an input's: some are missing
            missing = [name for name in self.specs if name not in shapes]
            raise BadInput(
                f"model {self.model_id} ({self.name}) is missing input(s): "
                + ", ".join(
                    f"'{n}' ({describe(self.specs[n])}"
                    + ("" if n in self._free else f", {self.specs[n].nbytes} bytes")
                    + ")"
                    for n in missing
                )
            )
        return shapes, sizes

    def _shape(self, spec: TensorSpec, size: int, sizes: dict[str, int]) -> Shape:
        """The shape `size` bytes make of input `spec`: its own, or with its one symbolic
        axis worked out from the byte count (and checked against the other inputs)."""
        axis = self._axis[spec.name]
        strings = spec.name in self._strings
        unit = "string elements" if strings else "bytes"
        whole = _size_of(spec, strings)
        if axis is None:
            if size != whole:
                raise BadInput(
                    f"input '{spec.name}' of model {self.model_id}: expected {whole} {unit} "
                    f"({describe(spec)}), received {size}"
                )
            return spec.shape
        symbol = spec.symbols[axis]
        assert symbol is not None
        row = whole // spec.shape[axis]
        if size % row or size == 0:
            raise BadInput(
                f"input '{spec.name}' of model {self.model_id}: {size} {unit} is not a whole "
                f"number of {describe(spec)} rows of {row} {unit} along axis {axis}"
            )
        count = size // row
        if sizes.setdefault(symbol, count) != count:
            raise BadInput(
                f"input '{spec.name}' of model {self.model_id} has {symbol}={count}, another "
                f"input has {symbol}={sizes[symbol]}"
            )
        return (*spec.shape[:axis], count, *spec.shape[axis + 1 :])

    def _free_shape(self, spec: TensorSpec, data: Any, size: int, sizes: dict[str, int]) -> Shape:
        """The shape of an input with free axes: its array's (or row blocks'), checked
        against its spec; from bytes, only when it varies along one axis in all."""
        shape = getattr(data, "shape", None)
        rank = len(spec.shape)
        if shape is None or len(shape) != rank:
            varying = spec.varying_axes
            if len(varying) > 1:
                raise BadInput(
                    f"input '{spec.name}' of model {self.model_id} ({describe(spec)}) varies "
                    f"along axes {list(varying)}, so its {size} bytes alone do not tell its "
                    "shape: give it as an array of its shape (the KServe front does)"
                )
            (axis,) = varying
            strings = spec.name in self._strings
            unit = "string elements" if strings else "bytes"
            row = math.prod(d for a, d in enumerate(spec.shape) if a != axis)
            row *= 1 if strings else spec.dtype.itemsize
            if row == 0 or size % row:
                raise BadInput(
                    f"input '{spec.name}' of model {self.model_id}: {size} {unit} is not a "
                    f"whole number of {describe(spec)} rows of {row} {unit} along axis {axis}"
                )
            shape = (*spec.shape[:axis], size // row, *spec.shape[axis + 1 :])
        shape = tuple(int(d) for d in shape)
        for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
            symbol = spec.symbols[axis] if spec.symbols else None
            if symbol is not None:
                if sizes.setdefault(symbol, got) != got:
                    raise BadInput(
                        f"input '{spec.name}' of model {self.model_id} has {symbol}={got}, "
                        f"another input has {symbol}={sizes[symbol]}"
                    )
            elif axis in spec.dynamic:
                if want and got > want:
                    raise BadInput(
                        f"input '{spec.name}' of model {self.model_id} has {got} on axis "
                        f"{axis}; it takes at most {want} there ({describe(spec)})"
                    )
            elif got != want:
                raise BadInput(
                    f"input '{spec.name}' of model {self.model_id} has shape {list(shape)}; "
                    f"it takes {describe(spec)}"
                )
        return shape


def _size_of(spec: TensorSpec, strings: bool) -> int:
    """An input's size at its declared shape: its bytes, or a string input's elements."""
    return math.prod(spec.shape) if strings else spec.nbytes


def symbol_axis(spec: TensorSpec) -> int | None:
    """The one axis of an input whose size varies by inference, if it has one."""
    axes = [a for a, sym in enumerate(spec.symbols) if sym is not None]
    return axes[0] if axes else None


def nbytes(data: Any) -> int:
    """The bytes of an input: a bytes-like object's, or a `Source`'s (shared memory)."""
    return int(data.nbytes) if hasattr(data, "read_into") else memoryview(data).nbytes


def describe(spec: TensorSpec) -> str:
    dims = [
        f"{spec.symbols[a]}<={d}"
        if spec.symbols and spec.symbols[a]
        else (f"?<={d}" if d else "?")
        if a in spec.dynamic
        else str(d)
        for a, d in enumerate(spec.shape)
    ]
    return f"{dtype_name(spec.dtype)}[{','.join(dims)}]"


def copy_padded(target: np.ndarray, array: np.ndarray) -> None:
    """Copy `array` into `target`; a smaller array goes to its start, the rest zeroed. A
    string tensor's rest repeats its last row along each axis instead: an empty string
    is no value a model need take (a Cast to a number refuses it), a copy of a real row
    is, and the padded rows' results are cut away."""
    if target.shape == array.shape:
        np.copyto(target, array, casting="no")
        return
    if target.dtype.hasobject:
        grow = [(0, want - have) for want, have in zip(target.shape, array.shape, strict=True)]
        np.copyto(target, np.pad(array, grow, mode="edge"), casting="no")
        return
    target[...] = 0
    np.copyto(target[tuple(slice(0, n) for n in array.shape)], array, casting="no")


def cut(value: np.ndarray, spec: TensorSpec, sizes: Mapping[str, int]) -> np.ndarray:
    """An output of a bucket cut down to the sizes of this inference."""
    if not spec.symbols:
        return value
    index = tuple(
        slice(0, sizes[sym]) if sym is not None and sym in sizes else slice(None)
        for sym in spec.symbols
    )
    return value[index]


def variant_for(variants: Sequence[Variant], sizes: Mapping[str, int], model: str) -> Variant:
    """The first of a model's bucket variants that holds `sizes`; BadInput if none does."""
    for variant in variants:
        if variant.holds(sizes):
            return variant
    ranges = ", ".join(
        f"{sym} {lo}..{hi}" for v in variants for sym, (lo, hi) in v.bucket.symbols.items()
    )
    given = ", ".join(f"{sym}={n}" for sym, n in sizes.items())
    raise BadInput(f"{model} has no bucket for {given} (buckets: {ranges})")


def fill_slot(
    slot: Mapping[str, Any],
    slot_bytes: Mapping[str, memoryview],
    specs: Mapping[str, TensorSpec],
    inputs: Mapping[str, Any],
    shapes: Mapping[str, Shape],
    buckets: Mapping[str, TensorSpec],
) -> None:
    """Copy an inference's checked inputs (of `shapes`) into its slot: inline bytes of a
    whole input straight into the slot's bytes; a source (shared memory, a batch's row
    blocks) read straight into its array when it fills it, else through a buffer; any
    other bytes-like value padded into it (`copy_padded`)."""
    for name, data in inputs.items():
        target, shape = slot[name], shapes[name]
        if type(data) is bytes and name in slot_bytes and target.shape == shape:
            slot_bytes[name][:] = data  # the common case: inline bytes, a whole input
            continue
        if isinstance(target, DynamicBuffer):  # an input with free axes: an array of its own
            target.accept(_free_input(data, specs[name], shape, buckets[name]))
            continue
        if target.dtype.hasobject:  # a string input: an array of str (`DataPath`)
            copy_padded(target, data.reshape(shape))
            continue
        whole = type(data) is np.ndarray and data.shape == shape == target.shape
        if whole and data.dtype == target.dtype:  # a numpy caller's whole input, as the slot's
            np.copyto(target, data, casting="no")
            continue
        if not isinstance(data, bytes | bytearray | memoryview | np.ndarray):
            if target.shape == shape and target.flags.c_contiguous:
                data.read_into(target.reshape(-1).view(np.uint8).data)
                continue
            buffer = bytearray(data.nbytes)
            data.read_into(memoryview(buffer))
            data = buffer
        copy_padded(target, np.frombuffer(data, dtype=specs[name].dtype).reshape(shape))


def _free_input(data: Any, spec: TensorSpec, shape: Shape, bucket: TensorSpec) -> np.ndarray:
    """An input with free axes as its slot takes it: of `shape`, each axis that follows a
    symbol padded up to the bucket's size (`bucket`, the bucket's own spec)."""
    if isinstance(data, np.ndarray):
        same = data.dtype == spec.dtype or spec.dtype.hasobject
        array = (data if same else data.view(spec.dtype)).reshape(shape)  # a narrow type's bytes
    elif hasattr(data, "blocks"):  # a batch's row blocks (`Rows`)
        array = np.concatenate(data.blocks)
    else:
        if not isinstance(data, bytes | bytearray | memoryview):
            buffer = bytearray(data.nbytes)
            data.read_into(memoryview(buffer))
            data = buffer
        array = np.frombuffer(data, dtype=spec.dtype).reshape(shape)
    padded = tuple(
        top if axis not in spec.dynamic else got
        for axis, (got, top) in enumerate(zip(shape, bucket.shape, strict=True))
    )
    if padded == array.shape:
        return np.ascontiguousarray(array)
    target = np.empty(padded, dtype=spec.dtype)
    copy_padded(target, array)
    return target


def plain_outputs(variant: Variant, names: Sequence[str]) -> list[dict[str, np.ndarray]] | None:
    """Per slot of a variant of fixed shapes, its outputs by name, when every one is a
    plain array (not a `DynamicBuffer`, whose array each run makes anew); else None."""
    if not all(isinstance(slot[n], np.ndarray) for slot in variant.slots for n in names):
        return None
    return [{n: slot[n] for n in names} for slot in variant.slots]
