"""The data plane through the real daemon: cancelling in-flight work on stop and unload,
the model's timeout, a failed model, and the counters, metrics, random seed and transfer
adjustment methods."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_wire import assert_nerr, infer, load, outputs, post
from waiting import wait_until

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.compiler import compile_model
from neuron_rtd.errors import Nerr
from neuron_rtd.neff.samples import SampleModel, build_mlp
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb

pytestmark = pytest.mark.daemon


@pytest.fixture(scope="module")
def two_stage() -> SampleModel:
    """An MLP over 2 NCs (2 Neuron nodes): a step boundary between them."""
    return build_mlp((16, 32, 8), batch=2, neuron_nodes=2, seed=3)


@pytest.fixture
def slow_ncs(daemon: DaemonProcess) -> Iterator[Any]:
    """Make every NC run of device 0 sleep first: `slow_ncs(ms)`; cleared afterwards."""
    inject = Path(daemon.sim_root) / "neuron0" / "inject"

    def set_delay(ms: int) -> None:
        inject.write_text(f"nc_delay_ms={ms}\n")

    yield set_delay
    set_delay(0)


def wait_for_a_run(daemon: DaemonProcess) -> None:
    """Return once a run on device 0 has taken its inject file (emptied it): that run
    sleeps its injected delay now."""
    inject = Path(daemon.sim_root) / "neuron0" / "inject"
    wait_until(lambda: inject.stat().st_size == 0, 30, "a run taking the injected delay")


def runs(daemon: DaemonProcess, nc: int) -> int:
    """The runs device 0's NC `nc` has counted (its stats file, read from here)."""
    return driver_sim.Machine.open(daemon.sim_root).device_info(0).nc_counters[nc].runs


def wait(stub: Any, cookie: int) -> Any:
    return stub.infer_wait(pb.infer_wait_request(cookie=cookie))


def nmgr_counters(stub: Any) -> Any:
    return stub.read_inference_counters(pb.empty()).nmgr_counters


def status_counts(counters: Any) -> dict[int, int]:
    return {c.infer_status: c.count for c in counters.infer_status_counts}


# --- cancelling ---------------------------------------------------------------------
def test_unload_cancels_inferences_in_flight(
    stub: Any, daemon: DaemonProcess, two_stage: SampleModel, slow_ncs: Any
) -> None:
    model = load(stub, two_stage.neff, ninfer=4, timeout=30).h_nn.id  # on NCs 0 and 1
    x = two_stage.random_inputs(seed=1)
    assert infer(stub, model, x).status.code == Nerr.OK  # warm
    slow_ncs(300)
    second_stage = runs(daemon, 1)
    cookies = [post(stub, model, x).cookie for _ in range(4)]
    wait_for_a_run(daemon)  # the first one is on NC 0 now
    assert stub.unload(pb.unload_request(h_nn=pb.h_nn(id=model))).status.code == Nerr.OK
    # Unload waits for the steps that run (each inference's first, on NC 0), not for all
    # 4 x 2 steps: no inference went on to NC 1 (one at most, had its first step ended
    # before unload was asked).
    assert runs(daemon, 1) - second_stage <= 1, runs(daemon, 1) - second_stage
    codes = [wait(stub, c).status for c in cookies]
    assert all(s.code == Nerr.INFER_CANCELLED for s in codes), [s.code for s in codes]
    assert "unloaded" in codes[-1].details.decode()
    assert_nerr(wait(stub, cookies[0]).status, Nerr.INVALID_HANDLE)  # answered once
    assert stub.list_egs(pb.empty()).eg_info == []  # its implicit NCG went with it


def test_stop_cancels_and_start_serves_again(
    stub: Any, daemon: DaemonProcess, two_stage: SampleModel, slow_ncs: Any
) -> None:
    model = load(stub, two_stage.neff, ninfer=3, timeout=30).h_nn.id
    x = two_stage.random_inputs(seed=2)
    expected = outputs(infer(stub, model, x), two_stage)
    slow_ncs(300)
    cookies = [post(stub, model, x).cookie for _ in range(3)]
    wait_for_a_run(daemon)  # the first one is on NC 0 now
    assert stub.stop(pb.stop_request(h_nn=pb.h_nn(id=model))).status.code == Nerr.OK
    answers = [wait(stub, c).status for c in cookies]
    assert [a.code for a in answers] == [Nerr.INFER_CANCELLED] * 3
    assert "stopped" in answers[0].details.decode()
    stopped = infer(stub, model, x)
    assert_nerr(stopped.status, Nerr.FAIL, "not running")
    slow_ncs(0)
    assert stub.start(pb.start_request(h_nn=pb.h_nn(id=model))).status.code == Nerr.OK
    again = infer(stub, model, x)
    for name, value in outputs(again, two_stage).items():
        np.testing.assert_array_equal(value, expected[name])


def test_poll_is_pending_until_the_inference_ends(
    stub: Any, two_stage: SampleModel, slow_ncs: Any
) -> None:
    model = load(stub, two_stage.neff, timeout=30).h_nn.id
    x = two_stage.random_inputs(seed=6)
    expected = outputs(infer(stub, model, x), two_stage)
    slow_ncs(300)
    cookie = post(stub, model, x).cookie
    pending = stub.infer_poll(pb.infer_wait_request(cookie=cookie))
    assert pending.status.code == Nerr.INFER_PENDING and not pending.ofmap
    check = pb.infer_check_completion_request(cookie=[cookie])
    assert list(stub.infer_check_completion(check).cookie) == []
    wait_until(lambda: stub.infer_check_completion(check).cookie, 30, "the inference's end")
    answer = stub.infer_poll(pb.infer_wait_request(cookie=cookie))
    assert answer.status.code == Nerr.OK
    for name, value in outputs(answer, two_stage).items():
        np.testing.assert_array_equal(value, expected[name])


def test_timeout_ends_the_inference(stub: Any, two_stage: SampleModel, slow_ncs: Any) -> None:
    model = load(stub, two_stage.neff, timeout=1).h_nn.id
    x = two_stage.random_inputs(seed=3)
    slow_ncs(700)  # two stages: 1.4 s on the NCs, past the 1 s timeout
    answer = infer(stub, model, x)
    assert_nerr(answer.status, Nerr.TIMEOUT, f"model {model}", "timeout of 1 s")
    assert answer.ofmap == []
    slow_ncs(0)
    assert infer(stub, model, x).status.code == Nerr.OK
    assert status_counts(nmgr_counters(stub))[pb.IST_TIMEOUT] >= 1


def device0_health(channel: grpc.Channel) -> ext_pb.ext_hw_counters:
    described = ext_pb_grpc.nmgr_extStub(channel).describe(ext_pb.describe_request())
    assert described.status_code == Nerr.OK
    return next(d.hw_counters for d in described.devices if d.index == 0)


@pytest.mark.parametrize(
    ("fault", "what", "counter"),
    [
        ("nc_error:1", "hardware error during execution", "nc_errors"),
        ("nc_hang:1", "did not complete its run within 1 s (hung", "nc_hangs"),
        ("dma_timeout:1", "DMA of the run's inputs timed out", "dma_timeouts"),
        ("mem_ecc_uncorr=1", "uncorrectable ECC error in device memory", "mem_ecc_uncorr"),
    ],
)
def test_hardware_error_fails_the_model_until_started(
    stub: Any,
    channel: grpc.Channel,
    two_stage: SampleModel,
    daemon: DaemonProcess,
    fault: str,
    what: str,
    counter: str,
) -> None:
    counted = getattr(device0_health(channel), counter)
    model = load(stub, two_stage.neff).h_nn.id  # on NCs 0 and 1
    x = two_stage.random_inputs(seed=4)
    other = load(stub, two_stage.neff).h_nn.id  # on NCs 2 and 3
    (Path(daemon.sim_root) / "neuron0" / "inject").write_text(fault + "\n")
    assert_nerr(infer(stub, model, x).status, Nerr.HW_ERROR, f"model {model}", what)
    assert_nerr(infer(stub, model, x).status, Nerr.FAILED_STATE, "stopped after an error")
    assert infer(stub, other, x).status.code == Nerr.OK  # the other NCG serves on
    # start resets the device and loads its models again, each in the state it had
    assert stub.start(pb.start_request(h_nn=pb.h_nn(id=model))).status.code == Nerr.OK
    assert infer(stub, model, x).status.code == Nerr.OK
    assert infer(stub, other, x).status.code == Nerr.OK
    assert "Resetting device(s) 0000:00:1c.0 after a hardware error" in daemon.log()
    # counted once in the device's health counters, which the reset kept
    assert getattr(device0_health(channel), counter) == counted + 1


def test_calls_waiting_on_inferences_leave_the_daemon_serving(
    stub: Any, two_stage: SampleModel, slow_ncs: Any
) -> None:
    """More infer_waits blocked than the server computes calls at once (one per core): a
    call after them is served at once, not when a wait ends (each says it waits:
    `neuron_rtd/server/pool.py`). Fewer than the server's most threads (16), which all
    blocked calls may hold."""
    waits = min(2 * len(os.sched_getaffinity(0)) + 1, 12)
    model = load(stub, two_stage.neff, ninfer=waits, timeout=30).h_nn.id
    x = two_stage.random_inputs(seed=1)
    assert infer(stub, model, x).status.code == Nerr.OK  # warm
    slow_ncs(2000)  # the first inference ends 4 s from now (2 steps)
    cookies = [post(stub, model, x).cookie for _ in range(waits)]
    with futures.ThreadPoolExecutor(waits) as pool:
        blocked = [pool.submit(wait, stub, c) for c in cookies]
        # every wait is in the daemon now: a guess, as no wire tells a blocked call
        time.sleep(0.5)
        version = stub.get_version(pb.get_version_request(framework_name="test"))
        pending = sum(not f.done() for f in blocked)
        assert stub.unload(pb.unload_request(h_nn=pb.h_nn(id=model))).status.code == Nerr.OK
        codes = {f.result(timeout=30).status.code for f in blocked}
    assert version.runtime_version.full_version
    assert pending == waits, pending  # served while every wait was blocked
    assert codes <= {Nerr.OK, Nerr.INFER_CANCELLED}, codes


# --- counters and metrics -------------------------------------------------------------
def test_inference_counters_count_what_happened(stub: Any) -> None:
    before = nmgr_counters(stub)
    slow = build_mlp((1024, 4096, 4096, 16), batch=64, seed=12)  # tens of ms per inference
    model = load(stub, slow.neff, ninfer=1).h_nn.id
    x = slow.random_inputs(seed=1)
    for _ in range(3):
        assert infer(stub, model, x).status.code == Nerr.OK
    assert_nerr(infer(stub, model, {"x": x["x"][:1]}).status, Nerr.INFER_BAD_INPUT)
    first = post(stub, model, x)
    assert_nerr(post(stub, model, x).status, Nerr.QUEUE_FULL)
    assert wait(stub, first.cookie).status.code == Nerr.OK
    stub.stop(pb.stop_request(h_nn=pb.h_nn(id=model)))
    stub.start(pb.start_request(h_nn=pb.h_nn(id=model)))
    stub.unload(pb.unload_request(h_nn=pb.h_nn(id=model)))
    after = nmgr_counters(stub)
    assert after.infer_count - before.infer_count == 5  # 4 ran, 1 refused for its input
    delta = {k: v - status_counts(before).get(k, 0) for k, v in status_counts(after).items()}
    assert delta[pb.IST_OK] == 4 and delta[pb.IST_BAD_INPUT] == 1
    assert after.infer_queue_drop_count - before.infer_queue_drop_count == 1
    assert after.model_load_count - before.model_load_count == 1
    assert after.model_unload_count - before.model_unload_count == 1
    assert after.model_stop_count - before.model_stop_count == 1
    # the implicit load starts the model once, then the explicit start
    assert after.model_start_count - before.model_start_count == 2
    assert after.neff_size_bytes_max >= len(slow.neff)
    assert (after.neff_version_max_major, after.neff_num_ncs_max) >= (1, 1)


def test_read_all_counters(stub: Any, two_stage: SampleModel) -> None:
    model = load(stub, two_stage.neff).h_nn.id
    assert infer(stub, model, two_stage.random_inputs(seed=5)).status.code == Nerr.OK
    answer = stub.read_all_counters(pb.read_all_counters_request())
    assert answer.status.code == Nerr.OK
    assert [c.virtual_nc_id for c in answer.nc_counters] == list(range(16))
    ran = [c for c in answer.nc_counters if c.virtual_nc_id in (0, 1)]
    assert all(c.macs_count > 0 for c in ran)
    one = stub.read_nc_counters(pb.read_nc_counters_request(vnc_id=0)).nc_counters
    assert one.macs_count == answer.nc_counters[0].macs_count
    memory = answer.system_counters.memory_counters
    assert [m.infa_id for m in memory] == [0, 1, 2, 3]
    assert memory[0].mem_used_infa_0 + memory[0].mem_used_infa_1 > 0  # the model's DRAM
    assert memory[0].mem_used_host > 10 << 20  # the daemon's resident memory
    errors = answer.system_counters.num_logs_error
    assert_nerr(infer(stub, 424242, {}).status, Nerr.INVALID_HANDLE)
    again = stub.read_all_counters(pb.read_all_counters_request())
    assert again.system_counters.num_logs_error == errors + 1
    assert again.nmgr_counters.infer_count >= 1


def test_read_all_metrics(stub: Any, two_stage: SampleModel) -> None:
    stub.read_all_metrics(pb.read_all_metrics_request(summarize_period=0))  # drain
    model = load(stub, two_stage.neff).h_nn.id
    for i in range(5):
        assert infer(stub, model, two_stage.random_inputs(seed=i)).status.code == Nerr.OK
    answer = stub.read_all_metrics(pb.read_all_metrics_request(summarize_period=0))
    assert answer.status.code == Nerr.OK
    by_type = {m.metric_type: m for m in answer.nmgr_metrics}
    assert sorted(by_type) == list(range(10))
    latency = [d.value_double for d in by_type[pb.NMGR_METRIC_INFER_LATENCY].data]
    on_nc = [d.value_double for d in by_type[pb.NMGR_METRIC_INFER_ON_INFA_LATENCY].data]
    assert len(latency) == 5 and all(0 < v < 10e6 for v in latency)  # microseconds
    assert all(0 < n <= t for n, t in zip(on_nc, latency, strict=True))
    assert [d.value_double for d in by_type[pb.NMGR_METRIC_MODEL_NUM_NC].data] == [2.0]
    assert [d.value_double for d in by_type[pb.NMGR_METRIC_MODEL_SIZE].data] == [
        float(len(two_stage.neff))
    ]
    assert not any(m.overflow for m in answer.nmgr_metrics)
    assert all(
        not m.data
        for m in stub.read_all_metrics(pb.read_all_metrics_request(summarize_period=0)).nmgr_metrics
    )  # a read takes what it returns
    for i in range(4):
        infer(stub, model, two_stage.random_inputs(seed=i))
    summed = stub.read_all_metrics(pb.read_all_metrics_request(summarize_period=3600))
    (agg,) = [
        d.value_agg
        for m in summed.nmgr_metrics
        if m.metric_type == pb.NMGR_METRIC_INFER_LATENCY
        for d in m.data
    ] or [None]
    assert agg is not None and agg.count == 4 and sum(agg.counts) == 4
    assert agg.min <= agg.sum / agg.count <= agg.max
    assert all(agg.min <= bound for bound in agg.values) and agg.values[-1] >= agg.max


# --- random seed and transfer adjustment ----------------------------------------------
@pytest.fixture(scope="module")
def noisy_neff() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    graph = helper.make_graph(
        [
            helper.make_node("RandomNormalLike", ["x"], ["n"]),
            helper.make_node("Add", ["x", "n"], ["y"]),
        ],
        "noisy",
        [x],
        [y],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return bytes(compile_model(model.SerializeToString()).neff)


def test_random_seed_makes_random_ops_repeat(stub: Any, noisy_neff: bytes) -> None:
    ncg = stub.create_eg(pb.create_eg_request(nc_count=1)).h_eg
    model = load(stub, noisy_neff, ncg=ncg.id).h_nn
    stub.start(pb.start_request(h_nn=model))
    x = {"x": np.zeros((2, 8), np.float32)}

    def draw() -> bytes:
        answer = infer(stub, model.id, x)
        assert answer.status.code == Nerr.OK
        return bytes(answer.ofmap[0].buf)

    assert draw() != draw()  # random: a new draw every run
    seeded = []
    for _ in range(2):
        assert stub.random_seed(pb.random_seed_request(h_eg=ncg, seed=1234)).status.code == 0
        seeded.append((draw(), draw()))
    assert seeded[0] == seeded[1] and seeded[0][0] != seeded[0][1]
    stub.random_seed(pb.random_seed_request(h_eg=ncg, seed=99))
    assert draw() != seeded[0][0]
    bad = stub.random_seed(pb.random_seed_request(h_eg=pb.h_eg(id=777), seed=1))
    assert_nerr(bad.status, Nerr.INVALID_HANDLE, "777")


def test_static_transfer_adjustment_is_reported(stub: Any) -> None:
    answer = stub.set_static_transfer_adjustment(
        pb.set_static_transfer_adjustment_request(transfer_adjust_cnt=12)
    )
    assert answer.status.code == Nerr.OK
    for counters in stub.get_all_hw_counters(pb.empty()).counters:
        assert counters.transfer_adjustment_cnt == 12
    one = stub.get_hw_counters(pb.get_hw_counters_request(device_id=1)).counters
    assert one.transfer_adjustment_cnt == 12
    stub.set_static_transfer_adjustment(
        pb.set_static_transfer_adjustment_request(transfer_adjust_cnt=0)
    )
