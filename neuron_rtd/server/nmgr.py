"""The nmgr service (`nrt.nmgr_v1`) and the streamed inference (`nrt.nmgr_stream`): each
RPC is one runtime call and its conversion to and from the wire.

Every call that reaches the daemon answers gRPC OK with its nerr code in `status.code`
and the log lines the daemon wrote for it in `status.details` (see `calls`). Methods not
overridden here answer gRPC UNIMPLEMENTED (the generated base class does that).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import grpc

from neuron_rtd.errors import Nerr, NrtError
from neuron_rtd.proto import pb, pb_grpc
from neuron_rtd.runtime import Runtime, SessionId
from neuron_rtd.server import wire
from neuron_rtd.server.caller import presented_session
from neuron_rtd.server.calls import finish
from neuron_rtd.server.load_stream import LoadReader, LoadRequest, read_load_stream
from neuron_rtd.server.stream_io import broke_off

log = logging.getLogger("nrtd.NMGR")


def answer_infer(
    runtime: Runtime, request: pb.infer_request, session: Callable[[], SessionId | None]
) -> pb.infer_response:
    """One synchronous infer, answered: over gRPC (`NmgrServicer.infer`) or on the peer
    socket's fast lane, with the session the call presents (`session()`, whose error, a
    malformed id, is answered as any other)."""

    def make() -> pb.infer_response:
        result = runtime.infer(
            request.h_nn.id,
            wire.ifmaps(request.ifmap),
            wire.shm_ofmaps(request.shm_ofmap),
            session=session(),
        )
        return wire.infer_response(result)

    return finish("infer", make, pb.infer_response)


class NmgrServicer(pb_grpc.nmgr_v1Servicer):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # The runtime's version does not change: its answer is made once (the cheapest
        # call stays at the transport's cost; a message only read is shared by calls).
        self._version = pb.get_version_response(runtime_version=wire.version(runtime.version))

    # --- model lifecycle -------------------------------------------------------------
    def load(
        self, request_iterator: Iterator[pb.load_request], context: grpc.ServicerContext
    ) -> pb.load_response:
        """One load, its stream read on this thread (the daemon reads it as it comes
        instead, `LoadAnswers`)."""
        buffer = self.runtime.neff_buffer
        return self.answer_load(lambda: read_load_stream(request_iterator, buffer), context)

    def answer_load(
        self, read: Callable[[], LoadRequest], context: grpc.ServicerContext
    ) -> pb.load_response:
        """The load `read()` gives, answered; a model made for a caller that left before
        its answer (it cancelled the call, Ctrl-C in neuron-cli, went away or ran out of
        time) is unloaded again: no one would ever learn its id."""
        made: list[int] = []

        def make() -> pb.load_response:
            req = read()
            model = self.runtime.load(
                req.neff,
                ncg_id=req.ncg_id,
                timeout_s=req.timeout_s,
                ninfer=req.ninfer,
                session_id=req.session_id,
                profile=req.profile,
            )
            made.append(model.id)
            return pb.load_response(h_nn=pb.h_nn(id=model.id))

        response = finish("load", make, pb.load_response)
        if made and not context.is_active():
            self._unload_unanswered(made[0])
        return response

    def _unload_unanswered(self, model_id: int) -> None:
        log.warning(
            "Model %d: the caller of its load left before the answer (cancelled, went away "
            "or ran out of time); unloading it",
            model_id,
            extra={"fn": "load"},
        )
        try:
            self.runtime.unload(model_id)
        except NrtError as exc:  # unloaded meanwhile (reset, the session's end)
            log.info("Model %d: %s", model_id, exc, extra={"fn": "load"})

    def unload(
        self, request: pb.unload_request, context: grpc.ServicerContext
    ) -> pb.unload_response:
        def make() -> pb.unload_response:
            self.runtime.unload(request.h_nn.id)
            return pb.unload_response()

        return finish("unload", make, pb.unload_response)

    def start(self, request: pb.start_request, context: grpc.ServicerContext) -> pb.start_response:
        if request.h_nn.id == 0:  # the clients' liveness ping
            return pb.start_response(status=pb.status(code=Nerr.OK))

        def make() -> pb.start_response:
            self.runtime.start(request.h_nn.id)
            return pb.start_response()

        return finish("start", make, pb.start_response)

    def stop(self, request: pb.stop_request, context: grpc.ServicerContext) -> pb.stop_response:
        def make() -> pb.stop_response:
            self.runtime.stop(request.h_nn.id)
            return pb.stop_response()

        return finish("stop", make, pb.stop_response)

    def unload_all(self, request: pb.empty, context: grpc.ServicerContext) -> pb.status:
        def make() -> _StatusOnly:
            self.runtime.unload_all()
            return _StatusOnly()

        return finish("unload_all", make, _StatusOnly).status

    # --- inference ----------------------------------------------------------------
    def infer(self, request: pb.infer_request, context: grpc.ServicerContext) -> pb.infer_response:
        return answer_infer(self.runtime, request, lambda: presented_session(context))

    def infer_post(
        self, request: pb.infer_request, context: grpc.ServicerContext
    ) -> pb.infer_post_response:
        def make() -> pb.infer_post_response:
            cookie = self.runtime.post(
                request.h_nn.id,
                wire.ifmaps(request.ifmap),
                wire.shm_ofmaps(request.shm_ofmap),
                session=presented_session(context),
            )
            return pb.infer_post_response(cookie=cookie)

        return finish("infer_post", make, pb.infer_post_response)

    def infer_wait(
        self, request: pb.infer_wait_request, context: grpc.ServicerContext
    ) -> pb.infer_response:
        def make() -> pb.infer_response:
            outputs, session = wire.shm_ofmaps(request.shm_ofmap), presented_session(context)
            # for the inference: other calls may compute meanwhile
            with self.runtime.compute_gate.waiting():
                result = self.runtime.wait(request.cookie, outputs, session=session)
            return wire.infer_response(result)

        return finish("infer_wait", make, pb.infer_response)

    def infer_poll(
        self, request: pb.infer_wait_request, context: grpc.ServicerContext
    ) -> pb.infer_response:
        def make() -> pb.infer_response:
            result = self.runtime.poll(
                request.cookie,
                wire.shm_ofmaps(request.shm_ofmap),
                session=presented_session(context),
            )
            if result is None:
                return pb.infer_response(status=pb.status(code=Nerr.INFER_PENDING))
            return wire.infer_response(result)

        return finish("infer_poll", make, pb.infer_response)

    def infer_check_completion(
        self, request: pb.infer_check_completion_request, context: grpc.ServicerContext
    ) -> pb.infer_check_completion_response:
        def make() -> pb.infer_check_completion_response:
            done = self.runtime.completed(request.cookie)
            return pb.infer_check_completion_response(cookie=done)

        return finish("infer_check_completion", make, pb.infer_check_completion_response)

    # --- counters -------------------------------------------------------------------
    def read_nc_counters(
        self, request: pb.read_nc_counters_request, context: grpc.ServicerContext
    ) -> pb.read_nc_counters_response:
        def make() -> pb.read_nc_counters_response:
            counters = self.runtime.nc_counters(request.vnc_id)
            return pb.read_nc_counters_response(
                nc_counters=wire.nc_counters(request.vnc_id, counters)
            )

        return finish("read_nc_counters", make, pb.read_nc_counters_response)

    def read_nc_time_in_use(
        self, request: pb.read_nc_time_in_use_request, context: grpc.ServicerContext
    ) -> pb.read_nc_time_in_use_response:
        def make() -> pb.read_nc_time_in_use_response:
            counters = self.runtime.nc_counters(request.vnc_id)
            return pb.read_nc_time_in_use_response(
                nc_time_in_use=pb.nc_time_in_use(
                    virtual_nc_id=request.vnc_id, time_in_use=counters.busy_ns
                )
            )

        return finish("read_nc_time_in_use", make, pb.read_nc_time_in_use_response)

    def get_hw_counters(
        self, request: pb.get_hw_counters_request, context: grpc.ServicerContext
    ) -> pb.get_hw_counters_response:
        def make() -> pb.get_hw_counters_response:
            which = request.WhichOneof("device")
            counters = self.runtime.hw_counters(
                bdf=request.bdf if which == "bdf" else None,
                index=request.device_id if which == "device_id" else None,
            )
            return pb.get_hw_counters_response(counters=wire.hw_counters(counters))

        return finish("get_hw_counters", make, pb.get_hw_counters_response)

    def get_all_hw_counters(
        self, request: pb.empty, context: grpc.ServicerContext
    ) -> pb.get_all_hw_counters_response:
        def make() -> pb.get_all_hw_counters_response:
            return pb.get_all_hw_counters_response(
                counters=[wire.hw_counters(c) for c in self.runtime.all_hw_counters()]
            )

        return finish("get_all_hw_counters", make, pb.get_all_hw_counters_response)

    def read_inference_counters(
        self, request: pb.empty, context: grpc.ServicerContext
    ) -> pb.read_inference_counters_response:
        # Its response has no status field: every failure here is a bug, logged.
        return pb.read_inference_counters_response(
            nmgr_counters=wire.nmgr_counters(self.runtime.counters())
        )

    def read_all_counters(
        self, request: pb.read_all_counters_request, context: grpc.ServicerContext
    ) -> pb.read_all_counters_response:
        def make() -> pb.read_all_counters_response:
            runtime = self.runtime
            ncs = [
                wire.nc_counters(vnc, runtime.nc_counters(vnc))
                for vnc in range(runtime.topology().total_ncs)
            ]
            system = runtime.system_counters()
            memory = [
                pb.memory_counters(
                    infa_id=device.index,
                    mem_used_host=system.host_memory_bytes,
                    mem_used_infa_0=device.memory_used[0],
                    mem_used_infa_1=device.memory_used[1],
                )
                for device in system.devices
            ]
            return pb.read_all_counters_response(
                nc_counters=ncs,
                nmgr_counters=wire.nmgr_counters(runtime.counters()),
                system_counters=pb.system_counters(
                    num_logs_error=system.log_errors,
                    num_logs_warning=system.log_warnings,
                    memory_counters=memory,
                ),
            )

        return finish("read_all_counters", make, pb.read_all_counters_response)

    def read_all_metrics(
        self, request: pb.read_all_metrics_request, context: grpc.ServicerContext
    ) -> pb.read_all_metrics_response:
        def make() -> pb.read_all_metrics_response:
            metrics = self.runtime.metrics(request.summarize_period)
            return pb.read_all_metrics_response(nmgr_metrics=[wire.metric(s) for s in metrics])

        return finish("read_all_metrics", make, pb.read_all_metrics_response)

    def random_seed(
        self, request: pb.random_seed_request, context: grpc.ServicerContext
    ) -> pb.random_seed_response:
        def make() -> pb.random_seed_response:
            self.runtime.random_seed(request.h_eg.id, request.seed)
            return pb.random_seed_response()

        return finish("random_seed", make, pb.random_seed_response)

    def set_static_transfer_adjustment(
        self, request: pb.set_static_transfer_adjustment_request, context: grpc.ServicerContext
    ) -> pb.set_static_transfer_adjustment_response:
        def make() -> pb.set_static_transfer_adjustment_response:
            self.runtime.set_transfer_adjustment(request.transfer_adjust_cnt)
            return pb.set_static_transfer_adjustment_response()

        return finish(
            "set_static_transfer_adjustment", make, pb.set_static_transfer_adjustment_response
        )

    # --- shared memory --------------------------------------------------------------
    def shm_map(
        self, request: pb.shm_map_request, context: grpc.ServicerContext
    ) -> pb.shm_map_response:
        def make() -> pb.shm_map_response:
            path = request.path if request.WhichOneof("data") == "path" else None
            self.runtime.shm_map(path, request.mmap_prot, SessionId(request.session_id))
            return pb.shm_map_response()

        return finish("shm_map", make, pb.shm_map_response)

    def shm_unmap(
        self, request: pb.shm_unmap_request, context: grpc.ServicerContext
    ) -> pb.shm_unmap_response:
        def make() -> pb.shm_unmap_response:
            self.runtime.shm_unmap(request.path, session=presented_session(context))
            return pb.shm_unmap_response()

        return finish("shm_unmap", make, pb.shm_unmap_response)

    # --- NeuronCore groups ----------------------------------------------------------
    def create_eg(
        self, request: pb.create_eg_request, context: grpc.ServicerContext
    ) -> pb.create_eg_response:
        def make() -> pb.create_eg_response:
            ncg = self.runtime.create_ncg(
                request.nc_count, session_id=SessionId(request.session_id)
            )
            return pb.create_eg_response(h_eg=pb.h_eg(id=ncg.id), nc_count=ncg.nc_count)

        return finish("create_eg", make, pb.create_eg_response)

    def destroy_eg(
        self, request: pb.destroy_eg_request, context: grpc.ServicerContext
    ) -> pb.destroy_eg_response:
        def make() -> pb.destroy_eg_response:
            self.runtime.destroy_ncg(request.h_eg.id)
            return pb.destroy_eg_response()

        return finish("destroy_eg", make, pb.destroy_eg_response)

    def list_egs(self, request: pb.empty, context: grpc.ServicerContext) -> pb.out_list_egs:
        def make() -> pb.out_list_egs:
            infos = [
                pb.eg_info(
                    eg=pb.h_eg(id=ncg.id),
                    vnc_start_index=ncg.start,
                    nc_count=ncg.nc_count,
                    mla_start_index=ncg.device_index,
                    nc_start_index=ncg.nc_start,
                )
                for ncg in self.runtime.list_ncgs()
            ]
            topology = self.runtime.topology()
            return pb.out_list_egs(
                eg_info=infos, mla_count=topology.device_count, nc_count=topology.total_ncs
            )

        return finish("list_egs", make, pb.out_list_egs)

    def get_version(
        self, request: pb.get_version_request, context: grpc.ServicerContext
    ) -> pb.get_version_response:
        return self._version


class _StatusOnly:
    """`unload_all` answers a bare `status`; this gives it the `.status` shape."""

    def __init__(self) -> None:
        self.status = pb.status()


class StreamServicer(pb_grpc.nmgr_streamServicer):
    """`infer_stream`: one infer_response per infer_request, in order, each answered as
    `nmgr_v1.infer` answers it."""

    def __init__(self, nmgr: NmgrServicer) -> None:
        self.nmgr = nmgr

    def infer_stream(
        self, request_iterator: Iterator[pb.infer_request], context: grpc.ServicerContext
    ) -> Iterator[pb.infer_response]:
        try:
            for request in request_iterator:
                yield self.nmgr.infer(request, context)
        except grpc.RpcError:  # the client went away: nobody to answer
            return


class InferAnswers:
    """An `infer_stream` served by the daemon (`neuron_rtd.server.streams`): each request
    answered as `nmgr_v1.infer` answers it."""

    def __init__(self, nmgr: NmgrServicer, context: grpc.ServicerContext) -> None:
        self.nmgr = nmgr
        self.context = context

    def answer(self, request: pb.infer_request) -> pb.infer_response:
        return self.nmgr.infer(request, self.context)

    def end(self) -> None:
        return None


class LoadAnswers:
    """A `load` stream served by the daemon (`neuron_rtd.server.streams`): each message
    read into the load as it comes, the load made once the client has sent the last; a
    message that cannot be part of a load is answered at once, as `load` answers it."""

    def __init__(self, nmgr: NmgrServicer, context: grpc.ServicerContext) -> None:
        self.nmgr = nmgr
        self.context = context
        self.reader: LoadReader | None = LoadReader(nmgr.runtime.neff_buffer)

    def answer(self, request: pb.load_request) -> pb.load_response | None:
        reader = self.reader
        if reader is None:  # refused already (its answer is on its way)
            return None
        try:
            reader.add(request)
        except NrtError as exc:
            self.reader = None  # its buffer, if any, freed
            error = exc

            def refused() -> LoadRequest:
                raise error

            return self.nmgr.answer_load(refused, self.context)
        return None

    def end(self) -> pb.load_response | None:
        reader, self.reader = self.reader, None
        if reader is None:  # refused already
            return None
        if not self.context.is_active():  # the caller left: no load for no one
            broke_off("load")
            return None
        return self.nmgr.answer_load(reader.result, self.context)
