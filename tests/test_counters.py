"""read_nc_counters, read_nc_time_in_use, get_hw_counters and get_all_hw_counters through
the real daemon: real values from the simulated NCs and devices."""

from __future__ import annotations

from typing import Any

import pytest
from test_wire import assert_nerr, infer, load

from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import pb

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
