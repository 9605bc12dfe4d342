"""gRPC servicers: wire messages in, runtime calls, wire messages out.

Every call that reaches the daemon answers gRPC OK with its nerr code in `status.code`
and the log lines the daemon wrote for it in `status.details`. Methods not overridden here
answer gRPC UNIMPLEMENTED (the generated base class does that).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import grpc
import numpy as np
import psutil

import driver_sim
from neuron_rtd.errors import InvalidError, Nerr, NrtError, ResourceError
from neuron_rtd.neff import Neff, read_neff, read_neff_file
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb, pb_grpc
from neuron_rtd.runtime.inflight import Posted
from neuron_rtd.runtime.model import Job, Model
from neuron_rtd.runtime.runtime import Runtime, parse_version
from neuron_rtd.runtime.shm import ShmTable
from neuron_rtd.runtime.stats import NmgrCounters
from neuron_rtd.server.request_log import capture

log = logging.getLogger("nrtd.NMGR")

DEVICE_MEMORY_BYTES = driver_sim.DRAM_CHANNELS * driver_sim.CHANNEL_BYTES

R = TypeVar("R")


def _finish(method: str, make: Callable[[], R], empty: Callable[[], R]) -> R:
    """Run `make`, turning a runtime error into `empty()` with its nerr code; either way
    `status.details` gets the request's log lines."""
    with capture() as lines:
        try:
            response = make()
            code = Nerr(response.status.code)  # type: ignore[attr-defined]
        except NrtError as exc:
            log.error("%s", exc, extra={"fn": method})
            response, code = empty(), exc.code
        except Exception:
            log.exception("internal error", extra={"fn": method})
            response, code = empty(), Nerr.FAIL
    status = response.status  # type: ignore[attr-defined]
    status.code = int(code)
    if lines:
        status.details = "\n".join(lines).encode()
    return response


class NmgrServicer(pb_grpc.nmgr_v1Servicer):
    def __init__(self, runtime: Runtime, shm: ShmTable | None = None) -> None:
        self.runtime = runtime
        self.shm = shm if shm is not None else ShmTable()

    def _finish(self, method: str, make: Callable[[], R], empty: Callable[[], R]) -> R:
        """`_finish` of a call that needs the devices: while their init keeps failing,
        every such call answers NERR_HW_ERROR."""

        def ready_then_make() -> R:
            self.runtime.ensure_ready()
            return make()

        return _finish(method, ready_then_make, empty)

    # --- model lifecycle -------------------------------------------------------------
    def load(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            req = _read_load_stream(request_iterator)
            params = self.runtime.params(timeout_s=req.timeout_s, ninfer=req.ninfer)
            model = self.runtime.load(
                req.neff, ncg_id=req.ncg_id, params=params, session_id=req.session_id
            )
            return pb.load_response(h_nn=pb.h_nn(id=model.id))

        return self._finish("load", make, pb.load_response)

    def unload(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.unload(request.h_nn.id)
            return pb.unload_response()

        return self._finish("unload", make, pb.unload_response)

    def start(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.h_nn.id == 0:  # the clients' liveness ping
            return pb.start_response(status=pb.status(code=Nerr.OK))

        def make() -> Any:
            self.runtime.start(request.h_nn.id)
            return pb.start_response()

        return self._finish("start", make, pb.start_response)

    def stop(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.stop(request.h_nn.id)
            return pb.stop_response()

        return self._finish("stop", make, pb.stop_response)

    def unload_all(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.unload_all()
            return _StatusOnly()

        return self._finish("unload_all", make, _StatusOnly).to_wire()

    # --- inference ----------------------------------------------------------------
    def infer(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            model = self.runtime.model(request.h_nn.id)
            shm_outputs = self._shm_ofmaps(request)
            job = model.submit(self._ifmaps(request, model))
            model.run(job)
            return self._respond(model, job, shm_outputs)

        return self._finish("infer", make, pb.infer_response)

    def _respond(self, model: Model, job: Job, shm_outputs: Mapping[str, str]) -> Any:
        """The infer_response of an ended inference: outputs inline, or written straight
        from its slot to the client's shared memory when it named any there."""
        response = pb.infer_response()
        with model.answer(job) as outputs:
            for name, value in outputs.items():
                if name in shm_outputs:
                    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8).data
                    self.shm.write(shm_outputs[name], data, f"shm_ofmap '{name}'")
                elif not shm_outputs:
                    response.ofmap.append(pb.infer_io(name=name, buf=value.tobytes()))
        response.status.code = int(job.code)
        return response

    # --- asynchronous inference -----------------------------------------------------
    def infer_post(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            model = self.runtime.model(request.h_nn.id)
            shm_outputs = self._shm_ofmaps(request)
            cookie = self.runtime.post(model.id, self._ifmaps(request, model), shm_outputs)
            return pb.infer_post_response(cookie=cookie)

        return self._finish("infer_post", make, pb.infer_post_response)

    def infer_wait(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            return self._answer(self.runtime.inflight.wait(request.cookie), request)

        return self._finish("infer_wait", make, pb.infer_response)

    def infer_poll(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            if not self.runtime.poll(request.cookie):
                response = pb.infer_response()
                response.status.code = int(Nerr.INFER_PENDING)
                return response
            return self._answer(self.runtime.inflight.wait(request.cookie), request)

        return self._finish("infer_poll", make, pb.infer_response)

    def infer_check_completion(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            done = self.runtime.inflight.completed(request.cookie)
            return pb.infer_check_completion_response(cookie=done)

        return self._finish("infer_check_completion", make, pb.infer_check_completion_response)

    def _answer(self, posted: Posted, request: Any) -> Any:
        """The response for an ended posted inference; the OFMAP buffers named by the
        wait, else those named by the post."""
        shm_outputs = self._shm_ofmaps(request) or posted.extra or {}
        return self._respond(posted.model, posted.job, shm_outputs)

    def _ifmaps(self, request: Any, model: Model) -> dict[str, Any]:
        """The inputs by name: inline bytes, or a source the model reads from the client's
        shared memory straight into its slot (as many bytes as the input takes; for an
        input whose size varies, the whole object)."""
        specs = model.input_specs
        inputs: dict[str, Any] = {}
        for io in request.ifmap:
            if io.name in inputs:
                raise InvalidError(f"ifmap '{io.name}' is given twice")
            if io.WhichOneof("data") == "buf_shm":
                spec = specs.get(io.name)
                fixed = spec is not None and not spec.varying_axes
                size = spec.nbytes if spec is not None and fixed else None
                inputs[io.name] = self.shm.source(io.buf_shm.path, size, f"ifmap '{io.name}'")
            else:
                inputs[io.name] = io.buf
        return inputs

    def _shm_ofmaps(self, request: Any) -> dict[str, str]:
        """The outputs the client wants written to its shared memory: name -> path."""
        paths: dict[str, str] = {}
        for io in request.shm_ofmap:
            if io.WhichOneof("data") != "buf_shm":
                raise InvalidError(f"shm_ofmap '{io.name}' names no shared memory (buf_shm)")
            if io.name in paths:
                raise InvalidError(f"shm_ofmap '{io.name}' is given twice")
            paths[io.name] = io.buf_shm.path
        return paths

    # --- counters -------------------------------------------------------------------
    def read_nc_counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            counters = self.runtime.nc_counters(request.vnc_id)
            return pb.read_nc_counters_response(nc_counters=_nc_counters(request.vnc_id, counters))

        return self._finish("read_nc_counters", make, pb.read_nc_counters_response)

    def read_nc_time_in_use(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            counters = self.runtime.nc_counters(request.vnc_id)
            return pb.read_nc_time_in_use_response(
                nc_time_in_use=pb.nc_time_in_use(
                    virtual_nc_id=request.vnc_id, time_in_use=counters.busy_ns
                )
            )

        return self._finish("read_nc_time_in_use", make, pb.read_nc_time_in_use_response)

    def get_hw_counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            which = request.WhichOneof("device")
            if which == "bdf":
                device = self.runtime.device(bdf=request.bdf)
            elif which == "device_id":
                device = self.runtime.device(index=request.device_id)
            else:
                raise InvalidError("get_hw_counters needs a bdf or a device_id")
            return pb.get_hw_counters_response(
                counters=_hw_counters(device, self.runtime.transfer_adjustment)
            )

        return self._finish("get_hw_counters", make, pb.get_hw_counters_response)

    def get_all_hw_counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            return pb.get_all_hw_counters_response(
                counters=[
                    _hw_counters(d, self.runtime.transfer_adjustment) for d in self.runtime.devices
                ]
            )

        return self._finish("get_all_hw_counters", make, pb.get_all_hw_counters_response)

    def read_inference_counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Its response has no status field: every failure here is a bug, logged.
        return pb.read_inference_counters_response(
            nmgr_counters=_nmgr_counters(self.runtime.stats.snapshot())
        )

    def read_all_counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            runtime = self.runtime
            ncs = [
                _nc_counters(vnc, runtime.nc_counters(vnc)) for vnc in range(runtime.ncgs.total_ncs)
            ]
            host = psutil.Process().memory_info().rss
            memory = [
                pb.memory_counters(
                    infa_id=device.index,
                    mem_used_host=host,
                    mem_used_infa_0=device.dram_used()[0],
                    mem_used_infa_1=device.dram_used()[1],
                )
                for device in runtime.devices
            ]
            logs = runtime.stats.logs
            return pb.read_all_counters_response(
                nc_counters=ncs,
                nmgr_counters=_nmgr_counters(runtime.stats.snapshot()),
                system_counters=pb.system_counters(
                    num_logs_error=logs.errors,
                    num_logs_warning=logs.warnings,
                    memory_counters=memory,
                ),
            )

        return self._finish("read_all_counters", make, pb.read_all_counters_response)

    def read_all_metrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            metrics = []
            for series in self.runtime.stats.read_metrics(request.summarize_period):
                data = [
                    pb.metric_data(ts_nanos_since_epoch=ts, value_double=value)
                    for ts, value in series.samples
                ]
                data += [
                    pb.metric_data(
                        ts_nanos_since_epoch=agg.start_ns,
                        value_agg=pb.aggregate(
                            min=agg.min,
                            max=agg.max,
                            count=agg.count,
                            sum=agg.sum,
                            values=agg.values,
                            counts=agg.counts,
                        ),
                    )
                    for agg in series.aggregates
                ]
                metrics.append(
                    pb.metric(
                        metric_type=pb.metric_type.Name(series.metric),
                        data=data,
                        overflow=series.overflow,
                    )
                )
            return pb.read_all_metrics_response(nmgr_metrics=metrics)

        return self._finish("read_all_metrics", make, pb.read_all_metrics_response)

    def random_seed(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.random_seed(request.h_eg.id, request.seed)
            return pb.random_seed_response()

        return self._finish("random_seed", make, pb.random_seed_response)

    def set_static_transfer_adjustment(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.set_transfer_adjustment(request.transfer_adjust_cnt)
            return pb.set_static_transfer_adjustment_response()

        return self._finish(
            "set_static_transfer_adjustment", make, pb.set_static_transfer_adjustment_response
        )

    # --- shared memory --------------------------------------------------------------
    def shm_map(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            if request.WhichOneof("data") != "path":
                raise InvalidError("shm_map: hugetlb shared memory is not supported; give a path")
            self.runtime.check_session(request.session_id)
            self.shm.map(request.path, request.mmap_prot, request.session_id)
            return pb.shm_map_response()

        return self._finish("shm_map", make, pb.shm_map_response)

    def shm_unmap(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.shm.unmap(request.path)
            return pb.shm_unmap_response()

        return self._finish("shm_unmap", make, pb.shm_unmap_response)

    # --- NeuronCore groups ----------------------------------------------------------
    def create_eg(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            ncg = self.runtime.create_ncg(request.nc_count, session_id=request.session_id)
            return pb.create_eg_response(h_eg=pb.h_eg(id=ncg.id), nc_count=ncg.nc_count)

        return self._finish("create_eg", make, pb.create_eg_response)

    def destroy_eg(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            self.runtime.destroy_ncg(request.h_eg.id)
            return pb.destroy_eg_response()

        return self._finish("destroy_eg", make, pb.destroy_eg_response)

    def list_egs(self, request: Any, context: grpc.ServicerContext) -> Any:
        def make() -> Any:
            table = self.runtime.ncgs
            infos = []
            for ncg in self.runtime.list_ncgs():
                loc = table.locate(ncg.start)
                infos.append(
                    pb.eg_info(
                        eg=pb.h_eg(id=ncg.id),
                        vnc_start_index=ncg.start,
                        nc_count=ncg.nc_count,
                        mla_start_index=self.runtime.devices[loc.device_slot].index,
                        nc_start_index=loc.nc,
                    )
                )
            return pb.out_list_egs(
                eg_info=infos, mla_count=len(self.runtime.devices), nc_count=table.total_ncs
            )

        return self._finish("list_egs", make, pb.out_list_egs)

    def get_version(self, request: Any, context: grpc.ServicerContext) -> Any:
        major, minor = parse_version(self.runtime.version)
        return pb.get_version_response(
            runtime_version=pb.version(
                full_version=self.runtime.version, major_num=major, minor_num=minor
            )
        )


NC_COUNTER_FIELDS = (
    "pe_num_idle_cycles",
    "pe_num_wait_event_cycles",
    "pe_matmul_num_wait_event_cycles",
    "pe_num_executed_instr",
    "pe_matmul_num_executed_instr",
    "pool_num_idle_cycles",
    "pool_num_wait_event_cycles",
    "pool_num_executed_instr",
    "act_num_idle_cycles",
    "act_num_wait_event_cycles",
    "act_num_executed_instr",
    "sb_rmw_count",
    "macs_count",
)


def _nc_counters(vnc: int, counters: Any) -> Any:
    return pb.nc_counters(virtual_nc_id=vnc, **{f: getattr(counters, f) for f in NC_COUNTER_FIELDS})


def _nmgr_counters(c: NmgrCounters) -> Any:
    msg = pb.nmgr_counters(
        infer_queue_drop_count=c.infer_queue_drop_count,
        infer_count=c.infer_count,
        model_start_count=c.model_start_count,
        model_stop_count=c.model_stop_count,
        model_load_count=c.model_load_count,
        model_unload_count=c.model_unload_count,
        neff_version_max_major=c.neff_version_max[0],
        neff_version_max_minor=c.neff_version_max[1],
        neff_version_min_major=c.neff_version_min[0],
        neff_version_min_minor=c.neff_version_min[1],
        neff_size_bytes_max=c.neff_size_bytes_max,
        neff_num_ncs_max=c.neff_num_ncs_max,
    )
    for subtype, count in sorted(c.error_subtype.items()):
        msg.infer_error_subtype_counts.add(
            error_subtype=pb.infer_error_subtype.Name(subtype), count=count
        )
    for status, count in sorted(c.infer_status.items()):
        msg.infer_status_counts.add(infer_status=pb.infer_status.Name(status), count=count)
    return msg


def _hw_counters(device: Any, transfer_adjustment: int) -> Any:
    ecc = device.hw_counters()
    return pb.hw_counters(
        bdf=device.bdf,
        device_index=device.index,
        mem_ecc_corr=ecc.mem_ecc_corr,
        mem_ecc_uncorr=ecc.mem_ecc_uncorr,
        sram_ecc_corr=ecc.sram_ecc_corr,
        sram_ecc_uncorr=ecc.sram_ecc_uncorr,
        transfer_adjustment_cnt=transfer_adjustment,
    )


class _StatusOnly:
    """`unload_all` answers a bare `status`; this gives it the `.status` shape."""

    def __init__(self) -> None:
        self.status = pb.status()

    def to_wire(self) -> Any:
        return self.status


class _LoadRequest:
    def __init__(self) -> None:
        self.ncg_id: int | None = None
        self.session_id = 0
        self.timeout_s: float | None = None
        self.ninfer: int | None = None
        self.neff: Neff


def _read_load_stream(requests: Iterator[Any]) -> _LoadRequest:
    """Collect one load stream: NCG, session, params, and the NEFF by chunks or by path."""
    req = _LoadRequest()
    size: int | None = None
    buffer: bytearray | None = None
    filled = 0
    path: str | None = None
    for msg in requests:
        kind = msg.WhichOneof("content")
        if kind == "h_eg":
            req.ncg_id = msg.h_eg.id
        elif kind == "session_id":
            req.session_id = msg.session_id
        elif kind == "model_params":
            p = msg.model_params
            req.timeout_s = p.timeout.data if p.HasField("timeout") else None
            req.ninfer = p.ninfer.data if p.HasField("ninfer") else None
        elif kind == "neff_size":
            if size is not None:
                raise InvalidError("load stream gives neff_size twice")
            size = msg.neff_size
            buffer = _host_buffer(size)
        elif kind == "neff_chunk":
            chunk = msg.neff_chunk.chunk
            if buffer is None or size is None:
                raise InvalidError("load stream sends a neff_chunk before neff_size")
            if filled + len(chunk) > size:
                raise InvalidError(
                    f"NEFF chunks exceed the declared neff_size of {size} bytes "
                    f"(at least {filled + len(chunk)} sent)"
                )
            buffer[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        elif kind == "neff_file":
            path = msg.neff_file
    if path is not None:
        if size is not None:
            raise InvalidError("load stream gives both neff_file and neff_size/chunks")
        req.neff = _read_file(path)
    elif buffer is not None and size is not None:
        if filled != size:
            raise InvalidError(
                f"NEFF chunks add up to {filled} bytes, but neff_size declared {size}"
            )
        req.neff = read_neff(buffer)
    else:
        raise InvalidError("load stream holds no NEFF (neither neff_size+chunks nor neff_file)")
    return req


def _host_buffer(size: int) -> bytearray:
    available = psutil.virtual_memory().available
    if size > available // 2:
        raise ResourceError(
            f"neff_size {size} bytes is more than the host can hold now "
            f"({available} bytes available)"
        )
    return bytearray(size)


def _read_file(path: str) -> Neff:
    if not os.path.isabs(path):
        raise InvalidError(f"neff_file '{path}' must be an absolute path")
    try:
        return read_neff_file(path)
    except OSError as exc:
        raise InvalidError(f"cannot read neff_file '{path}': {exc.strerror}") from exc


class ExtServicer(ext_pb_grpc.nmgr_extServicer):
    """Our own additions: what this daemon is and what it serves."""

    def __init__(self, runtime: Runtime, *, address: str, sim_root: str, instance_type: str):
        self.runtime = runtime
        self.address = address
        self.sim_root = sim_root
        self.instance_type = instance_type

    def describe(self, request: Any, context: grpc.ServicerContext) -> Any:
        devices = []
        for device in self.runtime.devices:
            used = sum(device.dram_used())
            devices.append(
                ext_pb.ext_device(
                    index=device.index,
                    bdf=device.bdf,
                    nc_count=self.runtime.ncgs.ncs_per_device,
                    memory_bytes=DEVICE_MEMORY_BYTES,
                    memory_used=used,
                )
            )
        return ext_pb.describe_response(
            runtime_version=self.runtime.version,
            pid=os.getpid(),
            address=self.address,
            sim_root=self.sim_root,
            instance_type=self.instance_type,
            devices=devices,
            start_time_ns=self.runtime.started_ns,
        )


class StreamServicer(pb_grpc.nmgr_streamServicer):
    """`infer_stream`: one infer_response per infer_request, in order, each answered as
    `nmgr_v1.infer` answers it."""

    def __init__(self, nmgr: NmgrServicer) -> None:
        self.nmgr = nmgr

    def infer_stream(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        for request in request_iterator:
            yield self.nmgr.infer(request, context)


class SessionServicer(pb_grpc.nmgr_session_managerServicer):
    """`session_monitor`: a client's stream for its whole life. When the stream ends (the
    client exited or was killed) the models, NCGs and shm maps made with its session id
    are released."""

    def __init__(self, runtime: Runtime, shm: ShmTable) -> None:
        self.runtime = runtime
        self.shm = shm
        self._open: dict[int, grpc.ServicerContext] = {}
        self._stopping = False
        self._lock = threading.Lock()

    def session_monitor(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Any:
        if next(request_iterator, None) is None:
            return
        session_id = self.runtime.open_session()
        with self._lock:
            self._open[session_id] = context
        ended = threading.Event()

        def end() -> None:
            if ended.is_set():
                return
            ended.set()
            with self._lock:
                self._open.pop(session_id, None)
                stopping = self._stopping
            self.runtime.close_session(session_id)
            if stopping:  # the daemon's drain unloads everything itself
                log.info("Session %d ended: the daemon stops", session_id, extra=_SESSION)
            else:
                self._release(session_id)

        context.add_callback(end)
        log.info("Session %d opened", session_id, extra=_SESSION)
        major, minor = parse_version(self.runtime.version)
        yield pb.session_monitor_response(
            session_id=session_id,
            runtime_version=pb.version(
                full_version=self.runtime.version, major_num=major, minor_num=minor
            ),
        )
        with contextlib.suppress(grpc.RpcError):
            for _ in request_iterator:  # the client keeps the stream open while it lives
                pass
        end()

    def close(self) -> None:
        """End every session stream (the daemon stops): they would hold up its drain."""
        with self._lock:
            self._stopping = True
            contexts = list(self._open.values())
        for context in contexts:
            context.cancel()

    def _release(self, session_id: int) -> None:
        try:
            models, ncgs = self.runtime.release_session(session_id)
            maps = self.shm.unmap_session(session_id)
        except Exception:
            log.exception("releasing session %d failed", session_id, extra=_SESSION)
            return
        log.info(
            "Session %d ended: unloaded models %s, destroyed NCGs %s, unmapped %s",
            session_id,
            models or "none",
            ncgs or "none",
            maps or "none",
            extra=_SESSION,
        )


_SESSION = {"fn": "session_monitor"}


def add_servicers(
    server: grpc.Server, runtime: Runtime, shm: ShmTable | None = None, **ext: Any
) -> SessionServicer:
    """Add every service to `server`; the session service, which the daemon closes at
    its stop."""
    shm = shm if shm is not None else ShmTable()
    nmgr = NmgrServicer(runtime, shm)
    sessions = SessionServicer(runtime, shm)
    pb_grpc.add_nmgr_v1Servicer_to_server(nmgr, server)
    pb_grpc.add_nmgr_streamServicer_to_server(StreamServicer(nmgr), server)
    pb_grpc.add_nmgr_session_managerServicer_to_server(sessions, server)
    ext_pb_grpc.add_nmgr_extServicer_to_server(ExtServicer(runtime, **ext), server)
    return sessions
