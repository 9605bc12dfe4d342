"""Per-op profiles (enable_node_profiling): what a profiled model records, the ext
`profile` RPC, and `neuron-cli profile` (tables, --json, --trace) against a real daemon."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from onnx import TensorProto, helper

from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.client.client import Client
from neuron_rtd.compiler import bucket_ranges, compile_model
from neuron_rtd.errors import Nerr
from neuron_rtd.models import resnet
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import build_mlp
from neuron_rtd.proto import ext_pb, ext_pb_grpc, pb, pb_grpc
from neuron_rtd.runtime import LocalRuntime, ModelProfile

SIZES = (64, 32, 16, 10)


def _mlp() -> bytes:
    return build_mlp(SIZES, neuron_nodes=2, cpu_softmax=True).neff


def _x() -> np.ndarray:
    return np.random.default_rng(0).random((1, SIZES[0]), dtype=np.float32)


@pytest.fixture(scope="module")
def local() -> Iterator[LocalRuntime]:
    with LocalRuntime("inf1.6xlarge") as rt:
        yield rt


def _nc_macs(local: LocalRuntime, vncs: tuple[int, ...]) -> int:
    return sum(local.runtime.nc_counters(v).macs_count for v in vncs)


def test_profiled_model_records_every_instruction(local: LocalRuntime) -> None:
    neff = read_neff(_mlp())
    model = local.load(neff, profile=True)
    before = _nc_macs(local, model.vncs)
    reference = local.infer(model, {neff.inputs[0].name: _x()})
    local.infer(model, {neff.inputs[0].name: _x()})
    macs_on_ncs = _nc_macs(local, model.vncs) - before
    prof = local.runtime.profile(model.id)
    assert isinstance(prof, ModelProfile)
    assert prof.recorded == 2 and len(prof.inferences) == 2
    assert [i.seq for i in prof.inferences] == [1, 2]
    inference = prof.inferences[-1]
    # The steps of the only variant, in order: two NC stages, then the CPU softmax.
    nodes = neff.variants()[0].nodes
    stages = [(s.node, s.vnc >= 0) for s in inference.steps]
    assert stages == [(node.name, node.kind == "neuron") for node in nodes]
    for step, node in zip(inference.steps, nodes, strict=True):
        if node.kind != "neuron":
            assert step.vnc == -1 and step.instrs == ()
            assert step.output_shapes == ((1, SIZES[-1]),)
            continue
        program = node.stages[0].instructions
        assert [i.op for i in step.instrs] == [i.op for i in program]
        assert [i.index for i in step.instrs] == list(range(len(program)))
    instrs = [i for s in inference.steps for i in s.instrs]
    matmuls = [i for i in instrs if i.op == "MatMul"]
    widths = list(itertools.pairwise(SIZES))
    assert [i.input_shapes for i in matmuls] == [((1, a), (a, b)) for a, b in widths]
    assert [i.output_shapes for i in matmuls] == [((1, b),) for _, b in widths]
    assert [i.macs for i in matmuls] == [a * b for a, b in widths]
    assert all(i.macs == 0 for i in instrs if i.op != "MatMul")
    # The MACs are the cost model's, as the NC counters counted them for the two runs.
    assert 2 * sum(i.macs for i in instrs) == macs_on_ncs
    assert all(i.host_ns > 0 and i.cycles > 0 for i in instrs)
    assert all(s.host_ns > 0 for s in inference.steps)
    # Instructions fall within their step, steps within the inference, one after another.
    for step in inference.steps:
        for i in step.instrs:
            assert (
                step.start_ns
                <= i.start_ns
                <= i.start_ns + i.host_ns
                <= step.start_ns + step.host_ns
            )
    ends = [s.start_ns + s.host_ns for s in inference.steps]
    starts = [s.start_ns for s in inference.steps]
    assert all(a <= b for a, b in zip(ends, starts[1:], strict=False))
    assert sum(s.host_ns for s in inference.steps) <= inference.host_ns
    assert inference.cycles == sum(s.cycles for s in inference.steps) > 0
    # Profiled runs compute what unprofiled ones do.
    plain = local.load(neff)
    np.testing.assert_allclose(
        local.infer(plain, {neff.inputs[0].name: _x()})[neff.outputs[0].name],
        reference[neff.outputs[0].name],
        rtol=1e-5,
    )
    local.unload(plain)
    local.unload(model)


def test_conv_model_profile_names_convolutions(local: LocalRuntime) -> None:
    onnx_model = resnet.build((1,), num_classes=10, batch=1, width=8, image=32)
    neff = read_neff(compile_model(onnx_model).neff)
    model = local.load(neff, profile=True)
    before = _nc_macs(local, model.vncs)
    inputs = {t.name: np.zeros(t.shape, t.dtype) for t in neff.inputs}
    local.infer(model, inputs)
    instrs = [i for s in local.runtime.profile(model.id).inferences[0].steps for i in s.instrs]
    assert any(i.op == "Conv" and i.macs > 0 for i in instrs)
    assert sum(i.macs for i in instrs) == _nc_macs(local, model.vncs) - before
    local.unload(model)


def test_unprofiled_model_records_nothing(local: LocalRuntime) -> None:
    model = local.load(_mlp())
    local.infer(model, {model.neff.inputs[0].name: _x()})
    assert local.runtime._models[model.id].profiler is None
    with pytest.raises(Exception, match="not loaded with node profiling") as info:
        local.runtime.profile(model.id)
    assert getattr(info.value, "code", None) == Nerr.INVALID
    local.unload(model)


def test_profile_keeps_the_last_inferences(local: LocalRuntime) -> None:
    from neuron_rtd.runtime.profile import KEEP

    model = local.load(_mlp(), profile=True)
    with pytest.raises(Exception, match="no profiled inference yet"):
        local.runtime.profile(model.id)
    for _ in range(KEEP + 3):
        local.infer(model, {model.neff.inputs[0].name: _x()})
    prof = local.runtime.profile(model.id)
    assert prof.recorded == KEEP + 3
    assert [i.seq for i in prof.inferences] == list(range(4, KEEP + 4))
    assert [i.seq for i in local.runtime.profile(model.id, last=2).inferences] == [
        KEEP + 2,
        KEEP + 3,
    ]
    local.unload(model)


# --- through the daemon -----------------------------------------------------------------
def _load(stub: pb_grpc.nmgr_v1Stub, neff: bytes, profile: bool) -> int:
    params = pb.model_params()
    if profile:
        params.enable_node_profiling.data = 1
    requests = [
        pb.load_request(model_params=params),
        pb.load_request(neff_size=len(neff)),
        pb.load_request(neff_chunk=pb.file_chunk(chunk=neff)),
    ]
    response = stub.load(iter(requests))
    assert response.status.code == 0, response.status.details
    return response.h_nn.id


def _infer(stub: pb_grpc.nmgr_v1Stub, model_id: int) -> None:
    neff = read_neff(_mlp())
    response = stub.infer(
        pb.infer_request(
            h_nn=pb.h_nn(id=model_id),
            ifmap=[pb.infer_io(name=neff.inputs[0].name, buf=_x().tobytes())],
        )
    )
    assert response.status.code == 0, response.status.details


@pytest.mark.daemon
def test_profile_rpc(stub: pb_grpc.nmgr_v1Stub, channel: grpc.Channel) -> None:
    ext = ext_pb_grpc.nmgr_extStub(channel)
    profiled = _load(stub, _mlp(), profile=True)
    plain = _load(stub, _mlp(), profile=False)
    empty = ext.profile(ext_pb.profile_request(model_id=profiled))
    assert empty.status_code == Nerr.INVALID and "no profiled inference" in empty.details
    for _ in range(3):
        _infer(stub, profiled)
    _infer(stub, plain)
    response = ext.profile(ext_pb.profile_request(model_id=profiled, last=2))
    assert response.status_code == 0, response.details
    assert response.model_id == profiled and response.recorded == 3
    assert [i.seq for i in response.inferences] == [2, 3]
    steps = response.inferences[-1].steps
    assert [s.vnc >= 0 for s in steps] == [True, True, False]
    ops = [i.op for s in steps for i in s.instrs]
    assert ops.count("MatMul") == 3
    first = steps[0].instrs[0]
    assert list(first.output_shapes[0].dims) == [1, SIZES[1]] and first.macs == SIZES[0] * SIZES[1]
    unprofiled = ext.profile(ext_pb.profile_request(model_id=plain))
    assert unprofiled.status_code == Nerr.INVALID
    assert "enable_node_profiling" in unprofiled.details
    unknown = ext.profile(ext_pb.profile_request(model_id=99999))
    assert unknown.status_code == Nerr.INVALID_HANDLE


def neuron_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-m", "neuron_rtd.cli.neuron_cli", "profile", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _check_trace(path: Path, tracks: set[str]) -> None:
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert set(names.values()) == tracks
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in complete} == set(names)
    assert all({"name", "pid", "tid", "ts", "dur"} <= set(e) for e in complete)
    # each NC instruction lies within its stage (same track, same inference), in order
    steps = [e for e in complete if e["cat"] in ("stage", "cpu")]
    instrs = [e for e in complete if e["cat"] not in ("stage", "cpu")]
    assert steps and instrs and all(e["dur"] > 0 for e in steps)
    slack = 1e-3  # us: ns times printed as floats
    for instr in instrs:
        (stage,) = [
            e
            for e in steps
            if e["tid"] == instr["tid"]
            and e["args"]["inference"] == instr["args"]["inference"]
            and e["ts"] - slack <= instr["ts"]
            and instr["ts"] + instr["dur"] <= e["ts"] + e["dur"] + slack
        ]
        assert stage["cat"] == "stage", instr
    for stage in steps:
        inside = [
            e
            for e in instrs
            if e["tid"] == stage["tid"]
            and e["args"]["inference"] == stage["args"]["inference"]
            and stage["ts"] - slack <= e["ts"] <= stage["ts"] + stage["dur"] + slack
        ]
        starts = [e["ts"] for e in sorted(inside, key=lambda e: e["args"]["index"])]
        assert starts == sorted(starts), stage


@pytest.mark.daemon
def test_cli_profile_of_a_loaded_model(
    stub: pb_grpc.nmgr_v1Stub, daemon: DaemonProcess, tmp_path: Path
) -> None:
    model_id = _load(stub, _mlp(), profile=True)
    for _ in range(2):
        _infer(stub, model_id)
    trace = tmp_path / "trace.json"
    done = neuron_cli(str(model_id), "-a", daemon.address, "--json", "--trace", trace)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model_id"] == model_id and report["inferences"] == 2
    assert [r["op"] for r in report["run_order"]] == [
        "MatMul",
        "Add",
        "Relu",
        "MatMul",
        "Add",
        "Relu",
        "MatMul",
        "Add",
        "cpu-node",
    ]
    assert report["total_macs"] == sum(a * b for a, b in itertools.pairwise(SIZES))
    assert {t["track"] for t in report["by_track"]} == {"NC 0", "NC 1", "CPU softmax"}
    by_type = {t["op"]: t for t in report["by_type"]}
    assert by_type["MatMul"]["count"] == 3 and by_type["MatMul"]["macs"] == report["total_macs"]
    assert abs(sum(t["percent"] for t in report["by_type"]) - 100) < 1e-6
    assert len(report["top"]) == min(10, len(report["run_order"]))
    _check_trace(trace, {"NC 0", "NC 1", "CPU node softmax"})
    text = neuron_cli(str(model_id), "-a", daemon.address)
    assert text.returncode == 0, text.stderr
    for heading in ("Run order", "Top 10 by host time", "By op type", "By NC and CPU node"):
        assert heading in text.stdout
    assert "GMAC/s" in text.stdout and "[1x32]" in text.stdout


@pytest.mark.daemon
def test_cli_profile_of_a_neff(daemon: DaemonProcess, tmp_path: Path) -> None:
    neff_path = tmp_path / "mlp.neff"
    neff_path.write_bytes(_mlp())
    inputs = tmp_path / "in.npz"
    arrays: dict[str, Any] = {read_neff(_mlp()).inputs[0].name: _x()}
    np.savez(inputs, **arrays)
    done = neuron_cli(neff_path, "--inputs", inputs, "--runs", "3", "-a", daemon.address, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["inferences"] == 3 and report["recorded"] == 3
    with Client(daemon.address) as client:  # loaded, run, unloaded
        assert client.list_ncgs() == []


@pytest.mark.daemon
def test_cli_profile_errors(
    stub: pb_grpc.nmgr_v1Stub, daemon: DaemonProcess, tmp_path: Path
) -> None:
    plain = _load(stub, _mlp(), profile=False)
    done = neuron_cli(str(plain), "-a", daemon.address)
    assert done.returncode == 1
    assert "enable_node_profiling" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # what was wrong, then the code, as neuron-cli's other commands say it
    assert done.stderr.startswith(f"neuron-cli profile: model {plain} (")
    assert "was not loaded with node profiling" in done.stderr
    assert done.stderr.endswith(" (NERR_INVALID)\n") and "profile: profile:" not in done.stderr
    unknown = neuron_cli("4242", "-a", daemon.address)
    assert (unknown.returncode, unknown.stderr) == (
        1,
        "neuron-cli profile: model 4242 is not loaded (NERR_INVALID_HANDLE): see neuron-cli "
        "list-model\n",
    )
    absent = neuron_cli("1", "-a", f"unix:{tmp_path}/nobody.sock")
    assert absent.returncode == 1 and "no runtime answers" in absent.stderr
    assert "Traceback" not in absent.stderr
    missing = neuron_cli(tmp_path / "none.neff", "-a", daemon.address)
    assert missing.returncode == 2 and "no such NEFF" in missing.stderr
    bad_runs = neuron_cli("1", "--runs", "0", "-a", daemon.address)
    assert bad_runs.returncode == 2
    usage = neuron_cli("-a", daemon.address)
    assert usage.returncode == 2


@pytest.mark.daemon
def test_cli_profile_of_a_neff_with_a_varying_axis_picks_a_bucket_as_validate_does(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Random inputs at the largest bucket by default, or at --input-shape's shape."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn", [x], [y])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    neff = tmp_path / "dyn.neff"
    neff.write_bytes(compile_model(onnx_model, dynamic_batch=bucket_ranges(1, 4)).neff)

    def batch_run(*args: str) -> list[list[int]]:
        done = neuron_cli(neff, "--runs", "1", "-a", daemon.address, "-j", *args)
        assert done.returncode == 0, done.stderr
        (row,) = json.loads(done.stdout)["run_order"]
        return list(row["input_shapes"])

    assert batch_run() == [[4, 4]]  # the largest bucket
    assert batch_run("--input-shape", "x=2,4") == [[2, 4]]
    too_big = neuron_cli(neff, "--input-shape", "x=9,4", "-a", daemon.address)
    assert too_big.returncode == 2 and "axis 0 is 9" in too_big.stderr
    by_id = neuron_cli("10001", "--input-shape", "x=2,4", "-a", daemon.address)
    assert (by_id.returncode, by_id.stderr) == (
        2,
        "neuron-cli profile: error: --input-shape applies to a NEFF file, not to a loaded "
        "model's id\n",
    )
