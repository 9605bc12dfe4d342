"""A Python client of the daemon, the way framework plugins drive it.

Address from `NEURON_RTD_ADDRESS` (default `unix:/run/neuron.sock`), message size limits
off, every unary call retried once on UNAVAILABLE. Errors are `NrtClientError`s carrying
the nerr code and the daemon's details.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from neuron_rtd.errors import Nerr
from neuron_rtd.neff import Neff, read_neff, read_neff_file
from neuron_rtd.proto import pb, pb_grpc

DEFAULT_ADDRESS = "unix:/run/neuron.sock"
CHUNK_BYTES = 1 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
SUCCESS = (Nerr.OK, Nerr.INFER_COMPLETED_WITH_NUM_ERR)


def default_address() -> str:
    return os.environ.get("NEURON_RTD_ADDRESS") or DEFAULT_ADDRESS


class NrtClientError(Exception):
    """The daemon answered with an nerr code other than success."""

    def __init__(self, code: int, details: str, method: str) -> None:
        self.code = code
        self.details = details
        self.method = method
        try:
            name = f"NERR_{Nerr(code).name}"
        except ValueError:
            name = f"nerr {code}"
        super().__init__(f"{method}: {name}: {details}")


def _check(method: str, status: Any) -> None:
    if status.code not in SUCCESS:
        raise NrtClientError(status.code, status.details.decode(errors="replace"), method)


class Client:
    def __init__(self, address: str | None = None, *, timeout_s: float | None = None) -> None:
        self.address = address or default_address()
        self.timeout_s = timeout_s
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.nmgr_v1Stub(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def _unary(self, method: str, request: Any) -> Any:
        call: Callable[..., Any] = getattr(self.stub, method)
        try:
            return call(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return call(request, timeout=self.timeout_s)

    # --- daemon ---------------------------------------------------------------------
    def ping(self) -> bool:
        """True when a daemon answers (the clients' liveness ping: start of model 0)."""
        try:
            self.stub.start(pb.start_request(h_nn=pb.h_nn(id=0)), timeout=self.timeout_s or 5)
        except grpc.RpcError:
            return False
        return True

    def version(self) -> str:
        response = self._unary("get_version", pb.get_version_request())
        return str(response.runtime_version.full_version)

    # --- NCGs -----------------------------------------------------------------------
    def create_ncg(self, nc_count: int = 0) -> tuple[int, int]:
        """A new NCG of `nc_count` NCs (0: the largest free run): (id, nc_count)."""
        response = self._unary("create_eg", pb.create_eg_request(nc_count=nc_count))
        _check("create_eg", response.status)
        return response.h_eg.id, response.nc_count

    def destroy_ncg(self, ncg_id: int) -> None:
        response = self._unary("destroy_eg", pb.destroy_eg_request(h_eg=pb.h_eg(id=ncg_id)))
        _check("destroy_eg", response.status)

    def list_ncgs(self) -> list[dict[str, int]]:
        response = self._unary("list_egs", pb.empty())
        _check("list_egs", response.status)
        return [
            {"id": e.eg.id, "nc_count": e.nc_count, "vnc_start": e.vnc_start_index}
            for e in response.eg_info
        ]

    # --- models ---------------------------------------------------------------------
    def load(
        self,
        neff: bytes | str | Path,
        *,
        ncg: int | None = None,
        ninfer: int | None = None,
        timeout_s: int | None = None,
        by_path: bool = False,
    ) -> Model:
        """Load a NEFF given as bytes or a path; with `by_path` the daemon reads the file
        itself (`neff_file`), else it is streamed in 1 MiB chunks."""
        if isinstance(neff, bytes):
            if by_path:
                raise ValueError("by_path needs the NEFF as a path, not bytes")
            parsed, path = read_neff(neff), None
        else:
            path = str(Path(neff).resolve())
            parsed = read_neff_file(path)  # mmapped: the file is read once, for chunks too
        data = memoryview(neff) if isinstance(neff, bytes) else parsed.buffer
        assert data is not None
        params = pb.model_params()
        if ninfer is not None:
            params.ninfer.data = ninfer
        if timeout_s is not None:
            params.timeout.data = timeout_s

        def stream() -> Iterator[Any]:
            if ncg is not None:
                yield pb.load_request(h_eg=pb.h_eg(id=ncg))
            if by_path:
                yield pb.load_request(model_params=params)
                yield pb.load_request(neff_file=path)
                return
            yield pb.load_request(neff_size=data.nbytes)
            yield pb.load_request(model_params=params)
            for i in range(0, data.nbytes, CHUNK_BYTES):
                chunk = bytes(data[i : i + CHUNK_BYTES])
                yield pb.load_request(neff_chunk=pb.file_chunk(chunk=chunk))

        response = self.stub.load(stream(), timeout=self.timeout_s)
        _check("load", response.status)
        return Model(self, response.h_nn.id, parsed)

    def _model_call(self, method: str, request_cls: Any, model_id: int) -> None:
        response = self._unary(method, request_cls(h_nn=pb.h_nn(id=model_id)))
        _check(method, response.status)

    def start(self, model_id: int) -> None:
        self._model_call("start", pb.start_request, model_id)

    def stop(self, model_id: int) -> None:
        self._model_call("stop", pb.stop_request, model_id)

    def unload(self, model_id: int) -> None:
        self._model_call("unload", pb.unload_request, model_id)

    def unload_all(self) -> None:
        _check("unload_all", self._unary("unload_all", pb.empty()))

    def infer_raw(self, model_id: int, inputs: Mapping[str, bytes]) -> dict[str, bytes]:
        request = pb.infer_request(
            h_nn=pb.h_nn(id=model_id),
            ifmap=[pb.infer_io(name=name, buf=data) for name, data in inputs.items()],
        )
        response = self._unary("infer", request)
        _check("infer", response.status)
        return {io.name: io.buf for io in response.ofmap}


class Model:
    """A model loaded through a `Client`; call it with numpy arrays by input name."""

    def __init__(self, client: Client, model_id: int, neff: Neff) -> None:
        self.client = client
        self.id = model_id
        self.neff = neff

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        return self.infer(inputs)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        specs = {t.name: t for t in self.neff.inputs}
        raw = {}
        for name, array in inputs.items():
            spec = specs.get(name)
            dtype = spec.dtype if spec is not None else array.dtype
            raw[name] = np.ascontiguousarray(array, dtype=dtype).tobytes()
        outputs = self.client.infer_raw(self.id, raw)
        return {
            t.name: t.array_from(outputs[t.name]) for t in self.neff.outputs if t.name in outputs
        }

    def start(self) -> None:
        self.client.start(self.id)

    def stop(self) -> None:
        self.client.stop(self.id)

    def unload(self) -> None:
        self.client.unload(self.id)
