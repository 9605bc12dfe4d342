"""read_nc_counters, read_nc_time_in_use, get_hw_counters, get_all_hw_counters and the ext
snapshot through the real daemon: real values from the simulated NCs and devices."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
from test_wire import assert_nerr, infer, load, post

from neuron_rtd.errors import Nerr
from neuron_rtd.neff import TensorSpec
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb
from neuron_rtd.server.wire import ext_tensor

pytestmark = pytest.mark.daemon


def nc_counters(stub: Any, vnc: int) -> Any:
    response = stub.read_nc_counters(pb.read_nc_counters_request(vnc_id=vnc))
    assert response.status.code == Nerr.OK
    return response.nc_counters


def test_nc_counters_count_each_inference(stub: Any) -> None:
    sample = build_mlp((64, 128, 32), batch=4, seed=13)
    model = load(stub, sample.neff).h_nn
    vnc = stub.list_egs(pb.empty()).eg_info[0].vnc_start_index
    x = sample.random_inputs(seed=1)
    before = nc_counters(stub, vnc)
    busy_before = stub.read_nc_time_in_use(pb.read_nc_time_in_use_request(vnc_id=vnc))
    assert infer(stub, model.id, x).status.code == Nerr.OK
    once = nc_counters(stub, vnc)
    assert infer(stub, model.id, x).status.code == Nerr.OK
    twice = nc_counters(stub, vnc)
    macs = 4 * (64 * 128 + 128 * 32)  # two matmul layers at batch 4
    assert once.macs_count - before.macs_count == macs
    assert twice.macs_count - once.macs_count == macs
    assert twice.pe_num_executed_instr - once.pe_num_executed_instr >= 2
    assert once.virtual_nc_id == vnc
    busy = stub.read_nc_time_in_use(pb.read_nc_time_in_use_request(vnc_id=vnc))
    assert busy.status.code == Nerr.OK
    assert busy.nc_time_in_use.time_in_use > busy_before.nc_time_in_use.time_in_use
    bad = stub.read_nc_counters(pb.read_nc_counters_request(vnc_id=999))
    assert_nerr(bad.status, Nerr.INVALID, "no virtual NC 999", "0..15")
    stub.unload(pb.unload_request(h_nn=model))


def test_hw_counters_by_bdf_by_id_and_all(stub: Any) -> None:
    every = stub.get_all_hw_counters(pb.empty())
    assert every.status.code == Nerr.OK and len(every.counters) == 4
    first = every.counters[1]
    by_bdf = stub.get_hw_counters(pb.get_hw_counters_request(bdf=first.bdf))
    by_id = stub.get_hw_counters(pb.get_hw_counters_request(device_id=first.device_index))
    assert by_bdf.counters == by_id.counters == first
    assert first.bdf.startswith("0000:") and first.mem_ecc_uncorr == 0
    unknown = stub.get_hw_counters(pb.get_hw_counters_request(bdf="0000:99:00.0"))
    assert_nerr(unknown.status, Nerr.INVALID, "no device with BDF 0000:99:00.0")


def snapshot(channel: grpc.Channel) -> Any:
    response = ext_pb_grpc.nmgr_extStub(channel).snapshot(ext_pb.snapshot_request())
    assert response.status_code == Nerr.OK, response.details
    return response


def test_snapshot_counts_what_happened_and_two_observers_see_the_same(
    stub: Any, channel: grpc.Channel
) -> None:
    sample = build_mlp((64, 128, 32), batch=4, seed=13)
    ncg = stub.create_eg(pb.create_eg_request(nc_count=2))
    model = load(stub, sample.neff, ncg=ncg.h_eg.id, ninfer=1).h_nn
    stub.start(pb.start_request(h_nn=model))
    standby = load(stub, sample.neff, ncg=ncg.h_eg.id).h_nn
    x = sample.random_inputs(seed=1)
    before = snapshot(channel)
    for _ in range(3):
        assert infer(stub, model.id, x).status.code == Nerr.OK
    assert_nerr(infer(stub, model.id, {"x": x["x"][:1]}).status, Nerr.INFER_BAD_INPUT)
    first = post(stub, model.id, x)
    assert_nerr(post(stub, model.id, x).status, Nerr.QUEUE_FULL)
    stub.infer_wait(pb.infer_wait_request(cookie=first.cookie))
    after, again = snapshot(channel), snapshot(channel)  # nothing taken by a read

    models = {m.id: m for m in after.models}
    ours = models[model.id]
    assert (ours.state, ours.ncg_id, ours.mode, ours.ninfer) == ("READY", ncg.h_eg.id, "normal", 1)
    assert models[standby.id].state == "STANDBY"
    tensors = [(t.name, t.dtype, list(t.shape)) for t in (*ours.inputs, *ours.outputs)]
    assert tensors == [("x", "float32", [4, 64]), ("probs", "float32", [4, 32])]
    tally = ours.tally
    assert (tally.completed, tally.incorrect_input, tally.failed_to_queue) == (4, 1, 1)
    assert again.models[0].tally == after.models[0].tally
    assert ours.device_bytes > 0 and ours.host_bytes > len(sample.neff) // 2
    assert after.latency.total - before.latency.total == 4
    assert list(after.latency.bounds_us)[:2] == [1.0, 2 ** (1 / 8)]
    assert sum(after.latency.counts) == after.latency.total == again.latency.total
    (group,) = [g for g in after.ncgs if g.id == ncg.h_eg.id]
    assert (group.nc_count, sorted(group.model_ids)) == (2, sorted([model.id, standby.id]))
    held = {nc.vnc: nc for nc in after.ncs if nc.ncg_id == group.id}
    assert sorted(held) == [group.vnc_start, group.vnc_start + 1] and set(ours.vncs) <= set(held)
    busy = {nc.vnc: nc.busy_ns for nc in before.ncs}
    assert held[ours.vncs[0]].busy_ns > busy[ours.vncs[0]]
    assert after.rss_bytes > 0 and after.cpu_user_s + after.cpu_system_s > 0
    for handle in (model, standby):
        stub.unload(pb.unload_request(h_nn=handle))
    stub.destroy_eg(pb.destroy_eg_request(h_eg=ncg.h_eg))


def test_ext_tensor_marks_a_varying_axis_minus_one() -> None:
    fixed = TensorSpec("x", np.dtype("float32"), (4, 64))
    bucketed = TensorSpec("ids", np.dtype("int64"), (1, 128), symbols=(None, "seq"))
    bounded = TensorSpec("boxes", np.dtype("float32"), (100, 4), dynamic=(0,))
    assert list(ext_tensor(fixed).shape) == [4, 64] and ext_tensor(fixed).dtype == "float32"
    assert list(ext_tensor(bucketed).shape) == [1, -1] and ext_tensor(bucketed).dtype == "int64"
    assert list(ext_tensor(bounded).shape) == [-1, 4]
