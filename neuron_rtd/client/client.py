"""A Python client of the daemon that drives it the way the framework plugins do.

- Address from `NEURON_RTD_ADDRESS` (default `unix:/run/neuron.sock`; a socket path, or
  `host:port` for TCP: `address.py`), message size limits off, every unary call (and
  `load`) retried once on UNAVAILABLE when the daemon is likely back soon (restarting);
  one not there is said at once, with why (`reach.py`).
- A session stream (`session_monitor`) for the client's life, opened at the first call
  that makes something on the daemon; its id goes with `create_eg`, `load` and `shm_map`,
  so whatever the client made is released when it closes or dies. With `session=False`
  there is none: what the client makes outlives it (as neuron-cli's models and NCGs do).
- IFMAPs and OFMAPs through POSIX shared memory unless `NEURON_RTD_SHM_MAP=no` (or
  `shm=False`); buffers are reused per model and freed at unload and close.
- `NEURONCORE_GROUP_SIZES` (or `ncg_sizes`): NCGs made at open, models placed on them in
  turn and started; without it a model gets an implicit NCG.
- `NEURON_RT_VISIBLE_CORES` (as Ray sets it): every NCG the client makes, those of
  `create_ncg` and `NEURONCORE_GROUP_SIZES` and the one a model without an NCG gets, lies
  within those NeuronCores (made with the ext service's `create_ncg`, which names them).
- Errors are `NrtClientError`s carrying the nerr code and the daemon's details.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Mapping, Sequence

import grpc

from neuron_rtd.client._config import (
    CHUNK_BYTES,
    DEFAULT_NINFER,
    check_ncg_sizes,
    ncg_sizes_from_env,
    shm_from_env,
)
from neuron_rtd.client._connection import Connection
from neuron_rtd.client._load import NeffSource, load_requests, neff_source, read_for_load, spec_of
from neuron_rtd.client._ncg import NcgGate
from neuron_rtd.client.address import DEFAULT_ADDRESS, default_address, grpc_target
from neuron_rtd.client.errors import SUCCESS, NrtClientError, NrtConnectionError, check
from neuron_rtd.client.model import Model, Signature
from neuron_rtd.errors import InvalidError, Nerr
from neuron_rtd.neff import Neff, read_neff
from neuron_rtd.proto import ext_pb, pb
from neuron_rtd.visible import visible_cores

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_ADDRESS",
    "SUCCESS",
    "Client",
    "Model",
    "NrtClientError",
    "default_address",
]

log = logging.getLogger("neuron_rtd.client")

ASYNC_WORKERS = 8


class Client:
    """A connection to the daemon. Use it as a context manager, or call `close()`."""

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout_s: float | None = None,
        shm: bool | None = None,
        ncg_sizes: Sequence[int] | None = None,
        ninfer: int = DEFAULT_NINFER,
        channel: grpc.Channel | None = None,
        async_workers: int = ASYNC_WORKERS,
        session: bool = True,
    ) -> None:
        """`address`: a socket path, `unix:/path` or `host:port` (`address.py`; an
        AddressError, a ValueError, when it names none), default from
        `NEURON_RTD_ADDRESS`. `timeout_s`: deadline of each
        call (None: none). `shm`: IFMAPs/OFMAPs through shared memory (default: unless
        `NEURON_RTD_SHM_MAP=no`). `ncg_sizes`: NCGs to make at open (default from
        `NEURONCORE_GROUP_SIZES`). `ninfer`: the queue depth of models loaded without
        one. `channel`: a channel to use instead of opening one (it stays the caller's).
        `session`: False opens no session; NCGs, models and shm maps are made with session
        id 0, and `close` leaves the NCGs and models on the daemon (freeing only the
        client's shared memory). Every NCG lies within the NeuronCores of
        `NEURON_RT_VISIBLE_CORES` when it is set (a ValueError when it is no list)."""
        self.address = grpc_target(address) if address else default_address()
        self.ninfer = ninfer
        sizes = ncg_sizes_from_env() if ncg_sizes is None else check_ncg_sizes(ncg_sizes)
        self.ncg_sizes = sizes
        try:
            self.visible = visible_cores()
        except InvalidError as exc:  # a malformed environment, as NEURONCORE_GROUP_SIZES's
            raise ValueError(str(exc)) from None
        self.connection = Connection(
            self.address,
            timeout_s=timeout_s,
            shm=shm_from_env() if shm is None else shm,
            async_workers=async_workers,
            channel=channel,
            session=session,
        )
        self.channel = self.connection.channel
        self.stub = self.connection.stub
        self._lock = threading.RLock()
        self._gates: list[NcgGate] = []
        self._next_gate = 0
        self._ncgs: set[int] = set()  # NCGs this client made
        self._models: dict[int, Model] = {}
        self._attached: set[int] = set()  # models loaded by others (`attach`)

    @property
    def timeout_s(self) -> float | None:
        """The deadline of each call (None: none)."""
        return self.connection.timeout_s

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        session = self.connection.session
        state = f"session {session.id}" if session else "not open"
        return f"Client({self.address!r}, {'closed' if self.closed else state})"

    # --- open / close ---------------------------------------------------------------
    def open(self) -> Client:
        """Open the session and make the NCGs of `ncg_sizes`. Calls that make something
        on the daemon do this themselves; `ping`, `version` and `list_ncgs` do not."""
        with self._lock:
            if self.connection.open_session():
                # the first open, or the daemon went away since (a new daemon holds
                # nothing of ours): new NCGs too
                self._gates = []
                stale, self._models = list(self._models.values()), {}
                for model in stale:
                    model.release_buffers(unmap=False)
            if self.ncg_sizes and not self._gates:
                self._gates = self._make_gates(self.ncg_sizes)
                self._next_gate = 0
        return self

    @property
    def session_id(self) -> int:
        """The session's id (opens it); 0 when the daemon tracks no sessions."""
        self.open()
        return self.connection.session_id()

    @property
    def closed(self) -> bool:
        return self.connection.closed

    @property
    def shm_enabled(self) -> bool:
        """True while tensors go through shared memory."""
        return self.connection.shm_enabled

    @property
    def ncgs(self) -> list[int]:
        """The ids of the NCGs made from `ncg_sizes` (empty before open)."""
        return [gate.id for gate in self._gates]

    def close(self) -> None:
        """Release what this client made and end its session. With a session the daemon
        releases the models, NCGs and shm maps itself when the stream ends (this returns
        once it has); when the daemon tracks no sessions (session id 0) the client
        unloads, destroys and unmaps them; with `session=False` it only unmaps its shared
        memory. Attached models stay loaded. Async inferences not started yet are
        cancelled; running ones finish first."""
        with self._lock:
            if self.connection.closed:
                return
            self.connection.close_pool()
        session = self.connection.session
        tracked = session is not None and session.id != 0
        release = not tracked and self.connection.use_session
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
        for model in models:
            if release and model.id not in self._attached:
                with contextlib.suppress(NrtClientError, ValueError):
                    self.connection.model_call("unload", pb.unload_request, model.id)
            model.release_buffers(unmap=not tracked)
        if release:
            for ncg_id in sorted(self._ncgs):
                with contextlib.suppress(NrtClientError, ValueError):
                    self.destroy_ncg(ncg_id)
        if session is not None and not session.close():
            log.warning("the daemon did not end session %d in time", session.id)
        self.connection.close_channel()

    # --- daemon ---------------------------------------------------------------------
    def ping(self) -> bool:
        """True when a daemon answers (the clients' liveness ping: start of model 0)."""
        try:
            self.stub.start(pb.start_request(h_nn=pb.h_nn(id=0)), timeout=self.timeout_s or 5)
        except grpc.RpcError:
            return False
        return True

    def version(self) -> str:
        response = self.connection.unary("get_version", pb.get_version_request())
        return str(response.runtime_version.full_version)

    # --- NCGs -----------------------------------------------------------------------
    def create_ncg(self, nc_count: int = 0) -> tuple[int, int]:
        """A new NCG of `nc_count` NCs (0: the largest free run): (id, nc_count). It
        belongs to this client's session. Models loaded on it start stopped."""
        self.open()
        return self._create_eg(nc_count)

    def _create_eg(self, nc_count: int, *, implicit: bool = False) -> tuple[int, int]:
        if self.visible is not None:
            return self._create_visible(nc_count, implicit)
        request = pb.create_eg_request(nc_count=nc_count, session_id=self.connection.session_id())
        response = self.connection.unary("create_eg", request)
        check("create_eg", response.status)
        self._ncgs.add(response.h_eg.id)
        return response.h_eg.id, response.nc_count

    def _create_visible(self, nc_count: int, implicit: bool) -> tuple[int, int]:
        """An NCG within `NEURON_RT_VISIBLE_CORES`, through the ext service (create_eg
        cannot name NeuronCores); `implicit`: made for one model, which the daemon starts
        at its load, and which takes the NCG with it at its unload."""
        assert self.visible is not None
        request = ext_pb.create_ncg_request(
            nc_count=nc_count,
            session_id=self.connection.session_id(),
            visible_ncs=sorted(self.visible.ncs),
            implicit=implicit,
        )
        try:
            response = self.connection.unary("create_ncg", request, stub=self.connection.ext)
        except NrtConnectionError as exc:
            if exc.grpc_code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            raise NrtClientError(
                Nerr.INVALID,
                self.visible.explain(
                    f"the runtime at {self.address} cannot place NCGs on given NeuronCores "
                    "(it serves no nrt.ext create_ncg), so it cannot honour that"
                ),
                "create_ncg",
            ) from None
        if response.status_code != Nerr.OK:
            details = response.details
            if response.status_code == Nerr.RESOURCE_NC:
                details = self.visible.explain(details)
            raise NrtClientError(response.status_code, details, "create_ncg")
        if not implicit:  # an implicit one is the daemon's to destroy, with its model
            self._ncgs.add(response.ncg_id)
        return response.ncg_id, response.nc_count

    def destroy_ncg(self, ncg_id: int) -> None:
        response = self.connection.unary(
            "destroy_eg", pb.destroy_eg_request(h_eg=pb.h_eg(id=ncg_id))
        )
        self._ncgs.discard(ncg_id)
        if any(gate.id == ncg_id for gate in self._gates):
            self._gates = []  # made again at the next load
        check("destroy_eg", response.status)

    def list_ncgs(self) -> list[dict[str, int]]:
        response = self.connection.unary("list_egs", pb.empty())
        check("list_egs", response.status)
        return [
            {"id": e.eg.id, "nc_count": e.nc_count, "vnc_start": e.vnc_start_index}
            for e in response.eg_info
        ]

    def _make_gates(self, sizes: Sequence[int]) -> list[NcgGate]:
        gates: list[NcgGate] = []
        try:
            for size in sizes:
                gates.append(NcgGate(*self._create_eg(size)))
        except BaseException:
            for gate in gates:
                with contextlib.suppress(NrtClientError):
                    self.destroy_ncg(gate.id)
            raise
        return gates

    def _take_gate(self) -> NcgGate | None:
        """The client-made NCG for the next model, in turn (None: there are none)."""
        with self._lock:
            if not self._gates:
                return None
            gate = self._gates[self._next_gate % len(self._gates)]
            self._next_gate += 1
            return gate

    # --- models ---------------------------------------------------------------------
    def load(
        self,
        neff: NeffSource,
        *,
        ncg: int | None = None,
        ninfer: int | None = None,
        timeout: float | None = None,
        timeout_s: float | None = None,
        by_path: bool = False,
        start: bool | None = None,
        profile: bool = False,
    ) -> Model:
        """Load a NEFF given as bytes, a path or a `Neff`.

        `ncg`: an NCG id (from `create_ncg`): the model loads there stopped, unless
        `start`. Without it the model goes on the next NCG of `ncg_sizes` and is started,
        or, with none, on an implicit NCG the daemon makes (and starts). `ninfer`: its
        queue depth (default: the client's, 4). `timeout` (or `timeout_s`): seconds one
        inference may take (default: the daemon's). `by_path`: the daemon reads the file
        itself (`neff_file`); else the NEFF is streamed in 1 MiB chunks. `profile`:
        load it with `enable_node_profiling` (its inferences record each op, for the
        ext `profile` RPC and `neuron-cli profile`).

        Stopped part way (Ctrl-C, any exception), a load leaves no model behind: before
        the daemon's answer the call is cancelled, and the daemon unloads a model whose
        caller left; after it, the model is unloaded here. One that could not be is named,
        with the command that unloads it, in a note on the exception (`__notes__`)."""
        if timeout is not None and timeout_s is not None:
            raise TypeError("give timeout or timeout_s, not both")
        seconds = timeout if timeout is not None else timeout_s
        depth = self.ninfer if ninfer is None else ninfer
        data, path = neff_source(neff, by_path)
        self.open()
        gate = self._take_gate() if ncg is None else None
        target = gate.id if gate is not None else ncg
        parsed: Neff | None = neff if isinstance(neff, Neff) else None
        made: int | None = None  # the implicit NCG made for it among the visible cores
        if target is None and self.visible is not None:
            # the daemon's implicit NCG could lie anywhere: one of just enough NCs, here
            if parsed is None:
                parsed = read_for_load(data)
            made, _ = self._create_eg(max(parsed.nc_count, 1), implicit=True)
            target = made
        params = pb.model_params(ninfer=pb.u32(data=depth))
        if profile:
            params.enable_node_profiling.data = 1
        if seconds is not None:
            params.timeout.data = max(1, math.ceil(seconds))
        try:
            response = self._load_stream(target, params, data, path if by_path else None)
            check("load", response.status)
        except BaseException:
            if made is not None:
                self._destroy_quietly(made)
            raise
        model_id = response.h_nn.id
        try:
            if parsed is None:
                parsed = read_neff(data)
            model = Model(
                self,
                self.connection,
                model_id,
                Signature.of(parsed),
                ninfer=depth,
                ncg=None if made is not None else target,
                gate=gate,
                neff=parsed,
            )
            with self._lock:
                self._models[model_id] = model
            if gate is not None:
                with gate.running_model(model_id, lambda: self.connection.start_model(model_id)):
                    pass
            elif start:
                self.start(model_id)
        except BaseException as stop:  # Ctrl-C too: the model would be no one's
            try:
                self.connection.unload_made(model_id, stop)
            finally:
                self._forget(model_id)
            raise
        return model

    def _destroy_quietly(self, ncg_id: int) -> None:
        """Destroy the implicit NCG made for a model whose load failed, whatever the
        daemon answers (the session's end, or unload_all, takes it otherwise)."""
        with contextlib.suppress(NrtClientError):
            self.destroy_ncg(ncg_id)

    def _load_stream(
        self, ncg: int | None, params: pb.model_params, data: memoryview, path: str | None
    ) -> pb.load_response:
        session_id = self.connection.session_id()
        return self.connection.load(lambda: load_requests(ncg, session_id, params, data, path))

    def attach(self, model_id: int) -> Model:
        """A model already on the daemon (loaded by another client, or by `neuron-cli
        load`), to infer on: its inputs and outputs as the daemon's ext snapshot states
        them. Closing this client leaves it loaded. NrtClientError (NERR_INVALID_HANDLE)
        when no such model is loaded."""
        with self._lock:
            model = self._models.get(model_id)
        if model is not None:
            return model
        snapshot = self.connection.snapshot()
        found = [m for m in snapshot.models if m.id == model_id]
        if not found:
            raise NrtClientError(
                Nerr.INVALID_HANDLE, f"no model {model_id} is loaded on the daemon", "attach"
            )
        info = found[0]
        implicit = any(g.id == info.ncg_id and g.implicit for g in snapshot.ncgs)
        signature = Signature(
            info.name,
            tuple(spec_of(t, f"model {model_id} input") for t in info.inputs),
            tuple(spec_of(t, f"model {model_id} output") for t in info.outputs),
        )
        self.open()
        model = Model(
            self,
            self.connection,
            model_id,
            signature,
            ninfer=info.ninfer or DEFAULT_NINFER,
            ncg=None if implicit else info.ncg_id,
        )
        with self._lock:
            self._models.setdefault(model_id, model)
            self._attached.add(model_id)
            return self._models[model_id]

    def start(self, model_id: int) -> None:
        """Make the model the running one of its NCG."""
        self.connection.start_model(model_id)
        model = self._models.get(model_id)
        if model is not None and model.gate is not None:
            model.gate.started(model_id)

    def stop(self, model_id: int) -> None:
        self.connection.model_call("stop", pb.stop_request, model_id)
        model = self._models.get(model_id)
        if model is not None and model.gate is not None:
            model.gate.stopped(model_id)

    def unload(self, model_id: int) -> None:
        """Unload the model; its shared memory is freed whatever the daemon answers."""
        try:
            self.connection.model_call("unload", pb.unload_request, model_id)
        finally:
            self._forget(model_id)

    def _forget(self, model_id: int) -> None:
        """A model unloaded (or on its way out): its shared memory freed."""
        with self._lock:
            model = self._models.pop(model_id, None)
            self._attached.discard(model_id)
        if model is not None:
            model.release_buffers(unmap=True)

    def unload_all(self) -> None:
        """Unload every model and destroy every NCG on the daemon (also other clients')."""
        check("unload_all", self.connection.unary("unload_all", pb.empty()))
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
            self._attached.clear()
            self._gates = []  # destroyed: made again at the next load
            self._ncgs.clear()
        for model in models:
            model.release_buffers(unmap=True)

    def infer_raw(self, model_id: int, inputs: Mapping[str, bytes]) -> dict[str, bytes]:
        """One inference with inputs and outputs as raw bytes, sent inline."""
        model = self._models.get(model_id)
        if model is not None:
            return model.infer_raw(inputs)
        request = pb.infer_request(
            h_nn=pb.h_nn(id=model_id),
            ifmap=[pb.infer_io(name=name, buf=data) for name, data in inputs.items()],
        )
        response = self.connection.unary("infer", request)
        check("infer", response.status)
        return {io.name: io.buf for io in response.ofmap}
