"""Conversion between wire messages and the runtime's values: inference inputs and
outputs, counters, metrics, NCGs, versions and the ext service's snapshot."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from neuron_rtd.errors import InvalidError
from neuron_rtd.neff import TensorSpec
from neuron_rtd.neff.dtypes import dtype_name
from neuron_rtd.proto import ext_pb, pb
from neuron_rtd.runtime import (
    LATENCY_BOUNDS_US,
    Histogram,
    HwCounters,
    InferResult,
    Input,
    MetricSeries,
    ModelProfile,
    NcCounters,
    NmgrCounters,
    ShmInput,
    Snapshot,
    parse_version,
    wire_bytes,
)


def _carried(record: type, message: type) -> tuple[str, ...]:
    """The fields of a counter group (a dataclass) that a wire message carries by the same
    name: the group is declared once, the message says which of it goes on the wire."""
    names = message.DESCRIPTOR.fields_by_name  # type: ignore[attr-defined]
    return tuple(f.name for f in dataclasses.fields(record) if f.name in names)


NC_COUNTER_FIELDS = _carried(NcCounters, pb.nc_counters)
HW_COUNTER_FIELDS = _carried(HwCounters, pb.hw_counters)  # not transfer_adjustment: renamed
EXT_HW_COUNTER_FIELDS = _carried(HwCounters, ext_pb.ext_hw_counters)
# Every field of the messages is carried (a counter the proto adds must be in its group).
assert {*NC_COUNTER_FIELDS, "virtual_nc_id"} == set(pb.nc_counters.DESCRIPTOR.fields_by_name)
assert {*HW_COUNTER_FIELDS, "transfer_adjustment_cnt"} == set(
    pb.hw_counters.DESCRIPTOR.fields_by_name
)
assert set(EXT_HW_COUNTER_FIELDS) == set(ext_pb.ext_hw_counters.DESCRIPTOR.fields_by_name)


# --- inference ---------------------------------------------------------------------------
def ifmaps(ios: Iterable[pb.infer_io]) -> dict[str, Input]:
    """The inputs by name: inline bytes, or the shared memory they are in."""
    inputs: dict[str, Input] = {}
    for io in ios:
        name = io.name  # read once: each read of a field makes a new object
        if name in inputs:
            raise InvalidError(f"ifmap '{name}' is given twice")
        inputs[name] = ShmInput(io.buf_shm.path) if io.HasField("buf_shm") else io.buf
    return inputs


def shm_ofmaps(ios: Iterable[pb.infer_io]) -> dict[str, str]:
    """The outputs the client wants written to its shared memory: name -> path."""
    paths: dict[str, str] = {}
    for io in ios:
        if io.WhichOneof("data") != "buf_shm":
            raise InvalidError(f"shm_ofmap '{io.name}' names no shared memory (buf_shm)")
        if io.name in paths:
            raise InvalidError(f"shm_ofmap '{io.name}' is given twice")
        paths[io.name] = io.buf_shm.path
    return paths


def infer_response(result: InferResult) -> pb.infer_response:
    response = pb.infer_response()
    ofmap = response.ofmap
    for name, array in result.outputs.items():
        ofmap.add(name=name, buf=wire_bytes(array))
    response.status.code = result.code
    return response


# --- counters and metrics ----------------------------------------------------------------
def nc_counters(vnc: int, counters: NcCounters) -> pb.nc_counters:
    return pb.nc_counters(virtual_nc_id=vnc, **{f: getattr(counters, f) for f in NC_COUNTER_FIELDS})


def nmgr_counters(c: NmgrCounters) -> pb.nmgr_counters:
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


def hw_counters(c: HwCounters) -> pb.hw_counters:
    return pb.hw_counters(
        transfer_adjustment_cnt=c.transfer_adjustment,
        **{f: getattr(c, f) for f in HW_COUNTER_FIELDS},
    )


def ext_hw_counters(c: HwCounters) -> ext_pb.ext_hw_counters:
    """A device's health counters: the ECC ones of `hw_counters`, and the fault counts."""
    return ext_pb.ext_hw_counters(**{f: getattr(c, f) for f in EXT_HW_COUNTER_FIELDS})


def metric(series: MetricSeries) -> pb.metric:
    data = [
        pb.metric_data(ts_nanos_since_epoch=ts, value_double=value) for ts, value in series.samples
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
    return pb.metric(
        metric_type=pb.metric_type.Name(series.metric), data=data, overflow=series.overflow
    )


def version(text: str) -> pb.version:
    major, minor = parse_version(text)
    return pb.version(full_version=text, major_num=major, minor_num=minor)


def _histogram(h: Histogram) -> ext_pb.ext_histogram:
    return ext_pb.ext_histogram(
        bounds_us=LATENCY_BOUNDS_US, counts=h.counts, total=h.total, sum_us=h.sum
    )


def ext_tensor(spec: TensorSpec) -> ext_pb.ext_tensor:
    """A model input or output for observers: a varying axis's size is -1."""
    varying = set(spec.varying_axes)
    shape = [-1 if axis in varying else size for axis, size in enumerate(spec.shape)]
    return ext_pb.ext_tensor(name=spec.name, dtype=dtype_name(spec.dtype), shape=shape)


def snapshot(snap: Snapshot) -> ext_pb.snapshot_response:
    msg = ext_pb.snapshot_response(
        time_ns=snap.time_ns,
        cpu_user_s=snap.cpu_user_s,
        cpu_system_s=snap.cpu_system_s,
        rss_bytes=snap.rss_bytes,
        latency=_histogram(snap.latency),
        nc_latency=_histogram(snap.nc_latency),
    )
    for nc in snap.ncs:
        msg.ncs.add(
            vnc=nc.vnc,
            device_index=nc.device_index,
            nc_index=nc.nc,
            busy_ns=nc.busy_ns,
            ncg_id=nc.ncg_id,
        )
    for ncg in snap.ncgs:
        msg.ncgs.add(
            id=ncg.id,
            vnc_start=ncg.start,
            nc_count=ncg.nc_count,
            device_index=ncg.device_index,
            implicit=ncg.implicit,
            session=ncg.session,
            model_ids=ncg.models,
        )
    for model, tally in zip(snap.models, snap.tallies, strict=True):
        msg.models.add(
            id=model.id,
            name=model.name,
            ncg_id=model.ncg_id,
            state=model.state.value,
            mode=model.mode.value,
            vncs=model.vncs,
            device_bytes=model.dram_bytes,
            host_bytes=model.host_bytes,
            ninfer=model.params.ninfer,
            timeout_s=model.params.timeout_s,
            in_flight=model.in_flight,
            session=model.session,
            tally=ext_pb.ext_infer_tally(**dataclasses.asdict(tally)),
            failure=model.failure,
            nc_count=model.neff.nc_count,
            inputs=[ext_tensor(spec) for spec in model.neff.inputs],
            outputs=[ext_tensor(spec) for spec in model.neff.outputs],
        )
    return msg


def _shapes(shapes: Iterable[tuple[int, ...]]) -> list[ext_pb.profile_shape]:
    return [ext_pb.profile_shape(dims=shape) for shape in shapes]


def profile(prof: ModelProfile) -> ext_pb.profile_response:
    msg = ext_pb.profile_response(
        model_id=prof.model_id,
        model_name=prof.name,
        nc_clock_hz=prof.nc_clock_hz,
        recorded=prof.recorded,
    )
    for inference in prof.inferences:
        out = msg.inferences.add(
            seq=inference.seq,
            time_ns=inference.time_ns,
            host_ns=inference.host_ns,
            cycles=inference.cycles,
        )
        for step in inference.steps:
            out.steps.add(
                node=step.node,
                stage=step.stage,
                vnc=step.vnc,
                start_ns=max(step.start_ns, 0),
                host_ns=step.host_ns,
                cycles=step.cycles,
                input_shapes=_shapes(step.input_shapes),
                output_shapes=_shapes(step.output_shapes),
                instrs=[
                    ext_pb.profile_instr(
                        index=i.index,
                        op=i.op,
                        engine=i.engine,
                        input_shapes=_shapes(i.input_shapes),
                        output_shapes=_shapes(i.output_shapes),
                        start_ns=max(i.start_ns, 0),
                        host_ns=i.host_ns,
                        macs=i.macs,
                        cycles=i.cycles,
                    )
                    for i in step.instrs
                ],
            )
    return msg
