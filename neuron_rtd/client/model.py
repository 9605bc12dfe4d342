"""A model loaded through a `Client`: call it with numpy arrays, get numpy arrays back.

At most `ninfer` inferences of a model are in flight from one client (a semaphore), so the
client never provokes NERR_QUEUE_FULL. Each in-flight inference uses one slot of shared
memory buffers: one per input, and one per output when every output has a fixed size (the
daemon answers the byte count of a varying output only inline). Slots are made when first
needed, reused, and freed when the model is unloaded or the client closes.

`Model.stage()` lends a slot's input buffers as arrays for the caller to fill in place
(decoding straight into them, say), sent with no copy by `infer` or `infer_async`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np

from neuron_rtd.client._config import DEFAULT_NINFER
from neuron_rtd.client._connection import ClientClosed
from neuron_rtd.client._ncg import NcgGate
from neuron_rtd.client._shm import ShmBuffer
from neuron_rtd.client._slots import Slot, Slots, Staged
from neuron_rtd.client.errors import (
    NrtClientError,
    NrtConnectionError,
    check,
    transport_errors,
    wait_reconnected,
)
from neuron_rtd.errors import BadInput, Nerr
from neuron_rtd.neff import Neff, TensorSpec, input_array
from neuron_rtd.proto import pb

if TYPE_CHECKING:
    from neuron_rtd.client._connection import Connection
    from neuron_rtd.client.client import Client

Inputs = Mapping[str, Any]  # numpy arrays (or anything np.asarray takes), by input name


@dataclasses.dataclass(frozen=True)
class Signature:
    """What a client needs to know of a model to infer on it: its name, inputs, outputs."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def of(cls, neff: Neff) -> Signature:
        return cls(neff.name, neff.inputs, neff.outputs)


class Model:
    """A model loaded through a `Client`; call it with numpy arrays by input name."""

    def __init__(
        self,
        client: Client,
        connection: Connection,
        model_id: int,
        signature: Signature,
        *,
        ninfer: int = DEFAULT_NINFER,
        ncg: int | None = None,
        gate: NcgGate | None = None,
        neff: Neff | None = None,
    ) -> None:
        self.client = client
        self.connection = connection
        self.id = model_id
        self.signature = signature
        self.neff = neff  # the NEFF it was loaded from (None: attached, loaded by another)
        self.ninfer = ninfer
        self.ncg = ncg  # the NCG it was loaded on; None: an implicit one
        self.gate = gate
        self._specs = {t.name: t for t in signature.inputs}
        # string tensors, which `infer` does not carry (`infer_raw` does, encoded)
        self._strings = [
            t.name for t in (*signature.inputs, *signature.outputs) if t.dtype.hasobject
        ]
        outputs = signature.outputs
        # Outputs go to shared memory (each buffer at its largest shape, the answer then
        # small enough for the fast lane) when their shapes follow from the inputs': fixed,
        # or varying only along symbols an input carries (a dynamic batch, a bucketed
        # sequence length), not along sizes the values decide (NonZero's count).
        carried = {symbol for t in signature.inputs for symbol in t.symbols if symbol}
        shm_outputs = bool(outputs) and all(
            not t.dynamic and all(t.symbols[axis] in carried for axis in t.varying_axes)
            for t in outputs
        )
        self._in_flight = threading.BoundedSemaphore(ninfer)
        self._slots = Slots(
            connection, signature.inputs, outputs if shm_outputs else (), lambda: client.session_id
        )

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.signature.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.signature.outputs

    def __repr__(self) -> str:
        where = f"ncg={self.ncg}" if self.ncg is not None else "implicit NCG"
        return f"Model(id={self.id}, name={self.signature.name!r}, {where})"

    # --- inference ------------------------------------------------------------------
    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        """`infer` with the inputs by keyword, and `cast=True` as `infer` takes it (for a
        model with an input named `cast` that is the input: cast through `infer` then)."""
        cast = "cast" in inputs and "cast" not in self._specs and bool(inputs.pop("cast"))
        return self.infer(inputs, cast=cast)

    def infer(self, inputs: Inputs | Staged, *, cast: bool = False) -> dict[str, np.ndarray]:
        """Run one inference: the outputs by name, shaped and typed by the NEFF.

        Each input is an array of the NEFF's shape (any size along an axis it says may
        vary, a dynamic batch's, up to its largest bucket) and dtype, or one whose every
        value that dtype holds: a safe cast (int32 for int64, float16 for float32) or
        values that survive the conversion (float64 zeros for float32; Python floats are
        rounded to a float input's precision). Anything else is refused before it is
        sent, NrtClientError NERR_INFER_BAD_INPUT naming the input and what the model
        takes: the shape it expects, or its dtype and a value that does not fit
        (docs/dtypes.md). `cast`: convert as numpy's unsafe cast does instead, losing
        precision, overflowing to inf, wrapping integers."""
        if isinstance(inputs, Staged):
            slot = inputs.take(self)
            return self._run(inputs.inputs, posted=False, slot=slot, cast=cast)
        return self._run(inputs, posted=False, cast=cast)

    def stage(self) -> Staged | None:
        """Input arrays of this model's shapes and dtypes in shared memory, for the caller
        to fill in place and send by `infer`/`infer_async` with no copy; None when this
        client's tensors go inline (shared memory off)."""
        self._check_loaded()
        slot = self._slots.take()
        if slot is None:
            return None
        slot.views = {t.name: slot.inputs[t.name].view(t.dtype, t.shape) for t in self.inputs}
        return Staged(self, slot)

    def unstage(self, staged: Staged) -> None:
        """Staged inputs given back unsent (a no-op once they were sent)."""
        with contextlib.suppress(ValueError):
            self._slots.give_back(staged.take(self), keep=True)

    def infer_async(
        self, inputs: Inputs | Staged, *, posted: bool = True, cast: bool = False
    ) -> Future[dict[str, np.ndarray]]:
        """Start one inference (`infer_post`, then `infer_wait` on the client's thread
        pool; with `posted` False one `infer`: half the calls, for a caller that keeps
        enough in flight itself); the future gives what `infer` returns (inputs taken,
        refused or `cast` as `infer` says). Leave the arrays unchanged until it is done.

        With `posted` False, while fewer than `ninfer` are in flight and the model has
        its NCG to itself, the `infer` is sent at once as a gRPC future, no thread waiting
        on it (a transport failure is then retried once through the pool, as `infer`
        retries); else it waits its turn in the pool."""
        self._check_loaded()
        slot, arrays = (
            (inputs.take(self), inputs.inputs) if isinstance(inputs, Staged) else (None, inputs)
        )
        if not posted and self.gate is None and self._in_flight.acquire(blocking=False):
            try:  # (`_send` gives the slot back itself when it sends nothing)
                return self._send(dict(arrays), slot, cast)
            except NrtClientError as exc:  # inputs refused, nothing sent: as in the pool
                self._in_flight.release()
                refused: Future[dict[str, np.ndarray]] = Future()
                refused.set_exception(exc)
                return refused
            except BaseException:
                self._in_flight.release()
                raise
        try:
            pool = self.connection.executor()
            return pool.submit(self._run, dict(arrays), posted=posted, slot=slot, cast=cast)
        except BaseException:
            if slot is not None:  # never sent: the slot is free again
                self._slots.give_back(slot, keep=True)
            raise

    def _send(
        self, inputs: dict[str, Any], slot: Slot | None, cast: bool = False
    ) -> Future[dict[str, np.ndarray]]:
        """One `infer` as a gRPC future, holding an in-flight place (taken by the caller)
        and a slot (the one given, else one taken), both given back when it completes."""
        result: Future[dict[str, np.ndarray]] = Future()
        result.set_running_or_notify_cancel()  # as the pool's running ones: not cancellable
        if slot is None:
            slot = self._slots.take()

        def done(call: grpc.Future) -> None:
            # the slot and the in-flight place are given back before the caller hears:
            # its next inference finds them free
            try:
                response = call.result()
            except grpc.RpcError as exc:
                self._in_flight.release()
                self._retry(exc, inputs, result, slot, cast)
                return
            try:
                check("infer", response.status)
                outputs = self._outputs(response, slot)
            except BaseException as exc:
                self._slots.give_back(slot, keep=True)  # the daemon answered: done with it
                self._in_flight.release()
                result.set_exception(exc)
                return
            self._slots.give_back(slot, keep=True)
            self._in_flight.release()
            result.set_result(outputs)

        try:
            self.connection.unary_future("infer", self._request(inputs, slot, cast), done)
        except BaseException:
            self._slots.give_back(slot, keep=True)  # nothing was sent
            raise
        return result

    def _retry(
        self,
        exc: grpc.RpcError,
        inputs: dict[str, Any],
        result: Future[dict[str, np.ndarray]],
        slot: Slot | None,
        cast: bool = False,
    ) -> None:
        """A sent `infer` the transport failed, dealt with as `infer` deals with it (one
        retry once the daemon is back from UNAVAILABLE, else an NrtConnectionError), its
        slot dropped (the daemon may still write into it): in the pool, never on gRPC's
        thread, which this can hold for seconds."""
        connection = self.connection

        def again_in_pool() -> dict[str, np.ndarray]:
            try:
                with transport_errors("infer", connection.address, connection.timeout_s):
                    wait_reconnected(exc, connection.channel)
            finally:
                self._slots.give_back(slot, keep=False)
            return self._run(inputs, posted=False, cast=cast)

        try:
            again = self.connection.executor().submit(again_in_pool)
        except ClientClosed as exc:
            self._slots.give_back(slot, keep=False)
            result.set_exception(exc)
            return

        def settle(again: Future[dict[str, np.ndarray]]) -> None:
            error = again.exception()
            if error is None:
                result.set_result(again.result())
            else:
                result.set_exception(error)

        again.add_done_callback(settle)

    def infer_raw(self, inputs: Mapping[str, bytes]) -> dict[str, bytes]:
        """Inputs and outputs as raw bytes, inline."""
        self._check_loaded()
        with self._in_flight, self._running():
            request = pb.infer_request(
                h_nn=pb.h_nn(id=self.id),
                ifmap=[pb.infer_io(name=name, buf=data) for name, data in inputs.items()],
            )
            response = self.connection.unary("infer", request)
            check("infer", response.status)
        return {io.name: io.buf for io in response.ofmap}

    def _run(
        self, inputs: Inputs, *, posted: bool, slot: Slot | None = None, cast: bool = False
    ) -> dict[str, np.ndarray]:
        self._check_loaded()
        with self._in_flight, self._slot(slot) as slot, self._running():
            request = self._request(inputs, slot, cast)
            if posted:
                answer = self.connection.unary("infer_post", request)
                check("infer_post", answer.status)
                wait = pb.infer_wait_request(cookie=answer.cookie)
                response = self.connection.unary("infer_wait", wait)
                check("infer_wait", response.status)
            else:
                response = self.connection.infer(request)
                check("infer", response.status)
            return self._outputs(response, slot)

    def _request(self, inputs: Inputs, slot: Slot | None, cast: bool = False) -> Any:
        """The infer request of `inputs`, copied into `slot`'s shared memory where they fit
        (else inline). One whose every input is in the slot names only the slot's objects:
        the slot keeps it, and a next call with the same inputs sends it again."""
        if self._strings:
            raise NrtClientError(
                Nerr.INFER_BAD_INPUT,
                f"model {self.signature.name!r} has string tensors "
                f"({', '.join(map(repr, self._strings))}), which this client's infer does not "
                "carry: send and read them in Triton's encoding with infer_raw "
                "(neuron_rtd.neff.strings.encode and decode), or serve the model through the "
                "KServe v2 front (tritonclient)",
                "infer",
            )
        views = slot.views if slot is not None else None
        if views is not None and (
            set(inputs) != set(views) or any(inputs[n] is not v for n, v in views.items())
        ):
            raise ValueError("staged inputs are sent as they are: fill Staged.inputs in place")
        if slot is not None:
            slot.sizes = {}
        ifmap: list[tuple[str, ShmBuffer | bytes]] = []  # in shm, or inline
        for name, value in inputs.items():
            spec = self._specs.get(name)
            buffer = slot.inputs.get(name) if slot is not None else None
            if spec is None:  # not an input of this model: the daemon says so
                ifmap.append((name, np.asarray(value).tobytes()))
                continue
            array = _of_dtype(value, spec, cast)
            nbytes = array.size * spec.dtype.itemsize
            if slot is not None and spec.symbols and array.ndim == len(spec.symbols):
                for symbol, size in zip(spec.symbols, array.shape, strict=True):
                    if symbol:
                        slot.sizes[symbol] = size
            if buffer is not None and spec.varying_axes:
                buffer.resize(nbytes)  # the daemon reads all of a varying input's object
            if buffer is not None and nbytes == buffer.size:
                if views is None:  # staged inputs are in the buffer already: no copy
                    buffer.write(array, spec.dtype)  # of that dtype: a plain copy
                ifmap.append((name, buffer))
            else:  # a size the NEFF does not take: inline, for the daemon's own error
                ifmap.append((name, array.tobytes()))
        names = tuple(name for name, _ in ifmap)
        in_slot = slot is not None and not any(isinstance(place, bytes) for _, place in ifmap)
        if in_slot and slot is not None and slot.request is not None and slot.request[0] == names:
            return slot.request[1]
        request = pb.infer_request(h_nn=pb.h_nn(id=self.id))
        for name, place in ifmap:
            if isinstance(place, bytes):
                request.ifmap.append(pb.infer_io(name=name, buf=place))
            else:
                shm = pb.shared_mem_buf(path=place.path)
                request.ifmap.append(pb.infer_io(name=name, buf_shm=shm))
        if slot is not None:
            for name, buffer in slot.outputs.items():
                shm = pb.shared_mem_buf(path=buffer.path)
                request.shm_ofmap.append(pb.infer_io(name=name, buf_shm=shm))
            if in_slot:
                slot.request = (names, request)
        return request

    def _outputs(self, response: Any, slot: Slot | None) -> dict[str, np.ndarray]:
        if response.ofmap or slot is None or not slot.outputs:
            got = {io.name: io.buf for io in response.ofmap}
            return {t.name: t.array_from(got[t.name]) for t in self.outputs if t.name in got}
        return {
            t.name: slot.outputs[t.name].read(t.dtype, t.shape_with(slot.sizes))
            for t in self.outputs
        }

    # --- slots ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _slot(self, given: Slot | None = None) -> Iterator[Slot | None]:
        """A slot of shm buffers for one inference, the one `given` or one taken (None:
        everything goes inline)."""
        slot = given if given is not None else self._slots.take()
        keep = False
        try:
            yield slot
            keep = True
        except NrtConnectionError:
            raise  # no answer: the daemon may still write into the buffers
        except NrtClientError:
            keep = True  # the daemon answered: it is done with the buffers
            raise
        finally:
            self._slots.give_back(slot, keep)

    def release_buffers(self, *, unmap: bool) -> None:
        """The model is gone: free its idle slots now, busy ones when they come back."""
        self._slots.release(unmap=unmap)

    def _check_loaded(self) -> None:
        if self._slots.released:
            raise NrtClientError(
                Nerr.INVALID_HANDLE,
                f"model {self.id} is not loaded any more (unloaded through this client, "
                "or the daemon it was loaded on went away)",
                "infer",
            )

    # --- NCG ------------------------------------------------------------------------
    def _running(self) -> contextlib.AbstractContextManager[None]:
        """On a client-made NCG shared with other models: make this one the running one."""
        if self.gate is None:
            return contextlib.nullcontext()
        return self.gate.running_model(self.id, lambda: self.connection.start_model(self.id))

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self.client.start(self.id)

    def stop(self) -> None:
        self.client.stop(self.id)

    def unload(self) -> None:
        self.client.unload(self.id)

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._slots.released:
            self.unload()


def _of_dtype(value: Any, spec: TensorSpec, cast: bool) -> np.ndarray:
    """An input's value as an array of its NEFF dtype and shape, under the one dtype
    policy and shape check (`neuron_rtd.neff.casting.input_array`), before anything is
    sent; a value refused is the client's NERR_INFER_BAD_INPUT, as an input the daemon
    refuses is."""
    try:
        return input_array(value, spec, cast=cast)
    except BadInput as exc:
        raise NrtClientError(exc.code, str(exc), "infer") from None
