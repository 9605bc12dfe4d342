"""Where a traced module's NEFF runs: a `Place` (one `Client` of the daemon at
`NEURON_RTD_ADDRESS`, with the NeuronCore Groups of `NEURONCORE_GROUP_SIZES`) and a
`Loaded` copy of the NEFF on it, loaded on its first inference.

- Each traced module (and each DataParallel copy) loads its own copy; the client places
  them on its NCGs in turn, as torch-neuron did.
- A daemon that restarted has forgotten the model: the first call that finds it gone (no
  daemon answering, or the model id unknown) loads the NEFF again and runs once more.
- Tensors cross as numpy views of the caller's contiguous CPU tensors, into the client's
  shared-memory slots; outputs come back as tensors over the client's arrays (no copy).
- Processes' places are closed at interpreter exit: their sessions end, and the daemon
  releases what they loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from neuron_rtd.client import (
    NCG_SIZES_ENV,
    Client,
    Model,
    NrtClientError,
    NrtConnectionError,
    default_address,
    parse_ncg_sizes,
)
from neuron_rtd.errors import Nerr
from neuron_rtd.neff import TensorSpec, read_neff
from neuron_rtd.torch.errors import (
    InputMismatch,
    NeuronRuntimeError,
    NeuronTorchError,
    RuntimeUnavailable,
)
from neuron_rtd.torch.export import BATCH

# numpy's dtypes by torch's, for the dtypes a NEFF carries
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype("float32"),
    torch.float64: np.dtype("float64"),
    torch.float16: np.dtype("float16"),
    torch.int8: np.dtype("int8"),
    torch.int16: np.dtype("int16"),
    torch.int32: np.dtype("int32"),
    torch.int64: np.dtype("int64"),
    torch.uint8: np.dtype("uint8"),
    torch.bool: np.dtype("bool"),
}


def ncg_sizes_from_env() -> tuple[int, ...]:
    """NEURONCORE_GROUP_SIZES as the client reads it (`2,2`, `4x2`); NeuronTorchError when
    it is no such list."""
    try:
        return parse_ncg_sizes(os.environ.get(NCG_SIZES_ENV, ""))
    except ValueError as exc:
        raise NeuronTorchError(str(exc)) from None


class Place:
    """One client of the daemon, with the NCGs models go on in turn."""

    def __init__(self, address: str | None = None, ncg_sizes: Sequence[int] = ()) -> None:
        try:
            self.client = Client(address, ncg_sizes=tuple(ncg_sizes))
        except ValueError as exc:  # an address that names none (AddressError)
            raise RuntimeUnavailable(str(exc)) from None
        self.ncg_sizes = tuple(ncg_sizes)

    def load(self, neff: np.ndarray) -> Model:
        """The NEFF loaded on the client's next NCG (an implicit one when it has none)."""
        with said_by_the_runtime():
            return self.client.load(neff.data)

    def close(self) -> None:
        with contextlib.suppress(NrtClientError, ValueError):
            self.client.close()


_places: dict[tuple[str, tuple[int, ...]], Place] = {}
_places_lock = threading.Lock()


def default_place() -> Place:
    """The process's place for the daemon at `NEURON_RTD_ADDRESS` and the groups of
    `NEURONCORE_GROUP_SIZES`, as they are set now (made once per pair)."""
    try:
        address = default_address()
    except ValueError as exc:
        raise RuntimeUnavailable(str(exc)) from None
    sizes = ncg_sizes_from_env()
    with _places_lock:
        place = _places.get((address, sizes))
        if place is None:
            place = _places[(address, sizes)] = Place(address, sizes)
        return place


@atexit.register
def _close_places() -> None:
    with _places_lock:
        places = list(_places.values())
        _places.clear()
    for place in places:
        place.close()


def said(exc: NrtClientError) -> NeuronTorchError:
    """A client error as the plugin's: one line, for raising `from None`."""
    if isinstance(exc, NrtConnectionError):
        return RuntimeUnavailable(f"neuron-rtd: {exc.details}")
    return NeuronRuntimeError(f"neuron-rtd: {exc}", exc.code)


@contextlib.contextmanager
def said_by_the_runtime() -> Iterator[None]:
    """The client's errors in the block as the plugin's (`said`), no chained traceback."""
    try:
        yield
    except NrtClientError as exc:
        raise said(exc) from None


@dataclasses.dataclass(frozen=True)
class Package:
    """A compiled NEFF as a traced module carries it: its bytes (a uint8 array) and the
    tensors it takes and gives. `batch_limit`: with a dynamic batch, the largest batch
    one inference takes (a larger one runs in parts of that size); else None."""

    data: np.ndarray
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch_limit: int | None

    @classmethod
    def of(cls, data: np.ndarray) -> Package:
        neff = read_neff(data.data)
        batched = bool(neff.inputs) and all(
            t.symbols[:1] == (BATCH,) for t in (*neff.inputs, *neff.outputs)
        )
        limit = neff.inputs[0].shape[0] if batched else None
        return cls(data, neff.inputs, neff.outputs, limit)

    def expected(self, spec: TensorSpec) -> str:
        """A tensor as the NEFF takes it, for a message: "float32 (N, 3, 32, 32)"."""
        batched = self.batch_limit is not None
        dims = ["N" if batched and axis == 0 else str(d) for axis, d in enumerate(spec.shape)]
        shape = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
        return f"{spec.dtype} {shape}" + (" for any batch size N" if self.batch_limit else "")

    def arrays(self, tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """The input tensors as numpy views of their memory, each checked against the
        NEFF's input (InputMismatch names what was expected). A view may be strided: the
        client's one copy into shared memory gathers it.

        Each tensor is touched once (`.numpy()`) and checked as the array it gives: after
        the wait for the previous answer torch's code is cold, and each call into it
        costs microseconds."""
        if len(tensors) != len(self.inputs):
            raise InputMismatch(
                f"expected {len(self.inputs)} input tensors (as traced), got {len(tensors)}"
            )
        arrays = []
        for index, (tensor, spec) in enumerate(zip(tensors, self.inputs, strict=True)):
            try:
                array = tensor.numpy()
            except (RuntimeError, TypeError):  # requires grad, not on the CPU, no numpy dtype
                array = self._array_of(index, tensor, spec)
            shape = array.shape
            if (array.dtype is not spec.dtype and array.dtype != spec.dtype) or (
                shape != spec.shape and not self._other_batch(shape, spec.shape)
            ):
                got = str(tensor.dtype).removeprefix("torch.")
                raise InputMismatch(
                    f"input {index}: expected {self.expected(spec)}, got {got} {tuple(shape)}"
                    + self._batch_hint(shape, spec.shape)
                )
            arrays.append(array)
        if self.batch_limit is not None and len({a.shape[0] for a in arrays}) > 1:
            sizes = [a.shape[0] for a in arrays]
            raise InputMismatch(f"inputs have different batch sizes {sizes}: give one size")
        return arrays

    def _batch_hint(self, shape: tuple[int, ...], traced: tuple[int, ...]) -> str:
        """What to do about a batch other than the traced one, in a module traced for
        that one batch only ("" when the shapes differ elsewhere)."""
        if self.batch_limit is not None or not traced or len(shape) != len(traced):
            return ""
        if shape[1:] != traced[1:]:
            return ""
        return (
            f": this module was traced for a batch of {traced[0]} only; trace it with "
            "trace(..., dynamic_batch_size=True) to take any batch size"
        )

    def _other_batch(self, shape: tuple[int, ...], traced: tuple[int, ...]) -> bool:
        """`shape` is `traced` but for its batch, and this NEFF takes any batch."""
        return (
            self.batch_limit is not None and len(shape) == len(traced) and shape[1:] == traced[1:]
        )

    def _array_of(self, index: int, tensor: torch.Tensor, spec: TensorSpec) -> np.ndarray:
        """The array of a tensor `.numpy()` refused: one that requires grad (detached),
        else InputMismatch saying why."""
        if tensor.device.type != "cpu":
            raise InputMismatch(
                f"input {index} is on {tensor.device}: neuron-rtd takes CPU tensors "
                "(call .cpu() on it)"
            )
        if tensor.dtype not in _NUMPY_DTYPES:
            got = str(tensor.dtype).removeprefix("torch.")
            raise InputMismatch(
                f"input {index}: expected {self.expected(spec)}, got {got} {tuple(tensor.shape)}"
            )
        return tensor.detach().numpy()


class Loaded:
    """One copy of a NEFF on a place, loaded at its first inference (and again, once,
    after the daemon forgot it), unloaded by `unload`."""

    def __init__(self, package: Package, place: Place | None = None) -> None:
        self.package = package
        self.place = place  # None: the process's, as the environment says at first load
        self._model: Model | None = None
        self._lock = threading.Lock()
        self._input_names = [spec.name for spec in package.inputs]
        self._output_names = [spec.name for spec in package.outputs]

    def __call__(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The NEFF run on `tensors` (checked against its inputs): its outputs."""
        arrays = self.package.arrays(tensors)
        limit = self.package.batch_limit
        if limit is not None and arrays[0].shape[0] == 0:  # an empty batch: as eager, empty
            outputs = [np.empty((0, *t.shape[1:]), t.dtype) for t in self.package.outputs]
        elif limit is None or arrays[0].shape[0] <= limit:  # (a batched NEFF has inputs)
            outputs = self._infer(arrays)
        else:  # in parts of the largest bucket, the last one smaller
            starts = range(0, arrays[0].shape[0], limit)
            parts = [self._infer([a[i : i + limit] for a in arrays]) for i in starts]
            outputs = [np.concatenate(pieces) for pieces in zip(*parts, strict=True)]
        return [_tensor(array) for array in outputs]

    def _infer(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self._input_names, arrays, strict=True))
        model = self._model or self._loaded()
        try:
            got = model.infer(feeds)
        except NrtClientError as exc:
            if not _forgotten(exc):
                raise said(exc) from None
            self._drop(model)  # the daemon restarted (or went): load again, once
            with said_by_the_runtime():
                got = self._loaded().infer(feeds)
        return [got[name] for name in self._output_names]

    def _loaded(self) -> Model:
        """The loaded copy, loaded now if it is not (callers read `_model` first: once
        loaded, a call takes no lock)."""
        with self._lock:
            if self._model is None:
                if self.place is None:
                    self.place = default_place()
                self._model = self.place.load(self.package.data)
            return self._model

    def _drop(self, model: Model) -> None:
        with self._lock:
            if self._model is model:
                self._model = None
        with contextlib.suppress(NrtClientError, ValueError):
            model.unload()

    @property
    def model(self) -> Model | None:
        """The client's model while loaded (None before the first inference)."""
        return self._model

    def unload(self) -> None:
        """Unload the copy (a no-op when it was never loaded or the daemon is gone)."""
        with self._lock:
            model, self._model = self._model, None
        if model is not None:
            with contextlib.suppress(NrtClientError, ValueError):
                model.unload()


def _forgotten(exc: NrtClientError) -> bool:
    """The daemon lost the model: none answered, or it knows no such model."""
    return isinstance(exc, NrtConnectionError) or exc.code == Nerr.INVALID_HANDLE


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over `array` (copied only when numpy's is read-only: an inline answer)."""
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)
