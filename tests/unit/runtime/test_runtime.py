"""The runtime core in-process: NCGs, placement, load modes, DRAM accounting, inference."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_until

import driver_sim
from neuron_rtd.errors import (
    BadInput,
    HwError,
    InferCancelled,
    InvalidError,
    InvalidHandle,
    ModelNotRunning,
    Nerr,
    QueueFull,
    ResourceError,
    ResourceNcError,
)
from neuron_rtd.neff import read_neff
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.runtime import (
    FIRST_MODEL_ID,
    LoadMode,
    ModelState,
    NeffFile,
    Runtime,
    RuntimeOptions,
    SimDevice,
    acquire_sim,
    session_tag,
)
from neuron_rtd.runtime.finite import all_finite, checked_form


@pytest.fixture
def devices(machine: driver_sim.Machine) -> list[SimDevice]:
    return acquire_sim(machine, range(4), address="in-process", version="test")


@pytest.fixture
def runtime(devices: list[SimDevice]) -> Iterator[Runtime]:
    rt = Runtime(devices)
    rt.init_devices()
    yield rt
    rt.close()
    for d in devices:
        d.release()


def test_ncg_ids_contiguity_and_largest_run(runtime: Runtime) -> None:
    a = runtime.create_ncg(3)
    b = runtime.create_ncg(5)
    assert (a.id, a.start, b.id, b.start) == (1, 0, 2, 3)
    runtime.destroy_ncg(a.id)
    # free runs: [0,3) and [8,16): 0 takes the largest
    c = runtime.create_ncg(0)
    assert (c.start, c.nc_count) == (8, 8)
    d = runtime.create_ncg(3)
    assert d.start == 0
    with pytest.raises(ResourceNcError, match="largest free run is 0"):
        runtime.create_ncg(1)
    with pytest.raises(InvalidHandle, match="NCG 99"):
        runtime.destroy_ncg(99)
    with pytest.raises(ResourceNcError, match="17 contiguous needed, this runtime has 16"):
        runtime.create_ncg(17)


def test_ncg_spans_devices(runtime: Runtime) -> None:
    runtime.create_ncg(2)
    ncg = runtime.create_ncg(4)  # vncs 2..5: device 0 NCs 2,3 and device 1 NCs 0,1
    assert [runtime.locate(v)[0] for v in ncg.vncs] == [0, 0, 1, 1]


def test_implicit_load_runs_and_matches_numpy(runtime: Runtime) -> None:
    sample = build_mlp((16, 32, 8), neuron_nodes=2, cpu_softmax=True, batch=3)
    model = runtime.load(read_neff(sample.neff))
    assert model.id == FIRST_MODEL_ID
    assert model.mode is LoadMode.NORMAL
    assert model.vncs == (0, 1)
    inputs = sample.random_inputs(seed=4)
    result = runtime.infer(model.id, {k: v.tobytes() for k, v in inputs.items()})
    assert result.code == Nerr.OK
    probs = np.frombuffer(result.outputs["probs"], np.float32).reshape(3, 8)
    np.testing.assert_allclose(probs, sample.reference(inputs)["probs"], rtol=1e-5, atol=1e-6)
    ncg = runtime.ncg(model.ncg_id)
    assert ncg.implicit
    # it goes with its model: no other model may load there (it would lose its NCs)
    with pytest.raises(
        InvalidError, match=rf"NCG {ncg.id} was made for model {model.id} and goes with it"
    ):
        runtime.load(read_neff(sample.neff), ncg_id=ncg.id)
    runtime.unload(model.id)
    assert runtime.list_ncgs() == []


def test_neuron_cores_count_work(runtime: Runtime, devices: list[SimDevice]) -> None:
    sample = build_mlp((64, 32, 10), batch=2)
    model = runtime.load(read_neff(sample.neff))
    core = devices[0].nc(0)
    before = core.counters()
    runtime.infer(model.id, {k: v.tobytes() for k, v in sample.random_inputs().items()})
    after = core.counters()
    assert after.macs_count - before.macs_count == 2 * 64 * 32 + 2 * 32 * 10
    assert after.pe_num_executed_instr > before.pe_num_executed_instr


def test_explicit_load_is_stopped_until_started(runtime: Runtime) -> None:
    sample = build_mlp((8, 8, 4))
    ncg = runtime.create_ncg(2)
    model = runtime.load(read_neff(sample.neff), ncg_id=ncg.id)
    inputs = {k: v.tobytes() for k, v in sample.random_inputs().items()}
    with pytest.raises(ModelNotRunning, match="start it first"):
        runtime.infer(model.id, inputs)
    runtime.start(model.id)
    assert runtime.infer(model.id, inputs).code == Nerr.OK


def test_shared_mode_and_resource_nc(runtime: Runtime) -> None:
    four = read_neff(build_mlp((8, 8, 8, 8, 4), neuron_nodes=4).neff)
    ncg = runtime.create_ncg(2)
    model = runtime.load(four, ncg_id=ncg.id)
    assert model.mode is LoadMode.SHARED
    assert model.vncs == (0,)
    wide = read_neff(build_mlp((8, 8, 8, 4), stages_per_node=3).neff)
    with pytest.raises(ResourceNcError, match="largest node 3"):
        runtime.load(wide, ncg_id=ncg.id)


def test_dram_is_accounted_and_returned(runtime: Runtime, devices: list[SimDevice]) -> None:
    sample = read_neff(build_mlp((256, 256, 16), batch=4).neff)
    device = devices[0]
    before = device.dram_used()
    model = runtime.load(sample, ninfer=3)
    used = sum(device.dram_used()) - sum(before)
    io_per_slot = sum(t.nbytes for t in sample.tensors.values())
    assert used >= sample.weight_bytes + 3 * io_per_slot
    assert model.dram_bytes == used
    runtime.unload(model.id)
    assert device.dram_used() == before


def test_dram_exhaustion_frees_partial_load(runtime: Runtime, devices: list[SimDevice]) -> None:
    neff = read_neff(build_relu((1 << 28,), name="big"))
    with pytest.raises(ResourceError, match="cannot allocate") as info:
        runtime.load(neff, ninfer=3)
    assert info.value.code == Nerr.RESOURCE
    assert devices[0].dram_used() == (0, 0)
    assert runtime.list_ncgs() == []


def test_input_checks(runtime: Runtime) -> None:
    sample = build_mlp((8, 8, 4), batch=2)
    model = runtime.load(read_neff(sample.neff))
    x = sample.random_inputs()["x"]
    with pytest.raises(BadInput, match="no input named 'y'"):
        runtime.infer(model.id, {"y": x.tobytes()})
    with pytest.raises(BadInput, match=r"expected 64 bytes .* received 60"):
        runtime.infer(model.id, {"x": x.tobytes()[:-4]})
    with pytest.raises(BadInput, match="missing input"):
        runtime.infer(model.id, {})


def test_queue_full_past_ninfer(runtime: Runtime) -> None:
    sample = build_mlp((8, 8, 4))
    model = runtime.load(read_neff(sample.neff), ninfer=1)
    x = {"x": sample.random_inputs()["x"].tobytes()}
    cookie = runtime.post(model.id, x)  # in flight until it is waited for, done or not
    wait_until(lambda: runtime.completed([cookie]), 30, "the posted inference's end")
    with pytest.raises(QueueFull, match="ninfer 1"):
        runtime.infer(model.id, x)
    assert runtime.counters().infer_queue_drop_count == 1
    assert set(runtime.wait(cookie).outputs) == {t.name for t in model.neff.outputs}
    assert runtime.infer(model.id, x).code == Nerr.OK  # the slot is free again


def test_non_finite_output_is_flagged(runtime: Runtime) -> None:
    sample = build_mlp((4, 4))
    model = runtime.load(read_neff(sample.neff))
    x = np.full((1, 4), np.inf, np.float32)
    assert runtime.infer(model.id, {"x": x.tobytes()}).code == Nerr.INFER_COMPLETED_WITH_NUM_ERR


def test_model_params_are_checked(runtime: Runtime) -> None:
    with pytest.raises(InvalidError, match="ninfer"):
        runtime.params(ninfer=0)
    with pytest.raises(InvalidError, match="timeout"):
        runtime.params(timeout_s=0)


def test_init_failure_answers_hw_error(machine: driver_sim.Machine) -> None:
    devices = acquire_sim(machine, [0], address="in-process", version="test")
    try:
        devices[0].inject("init_fail")
        rt = Runtime(devices)
        rt.init_devices()
        with pytest.raises(HwError, match="not initialized"):
            rt.create_ncg(1)
    finally:
        devices[0].release()


def test_models_per_ncg_limit(machine: driver_sim.Machine) -> None:
    devices = acquire_sim(machine, [0], address="in-process", version="test")
    rt = Runtime(devices, options=RuntimeOptions(model_cache_count=2))
    try:
        rt.init_devices()
        neff = read_neff(build_mlp((8, 8, 4)).neff)
        ncg = rt.create_ncg(1)
        first = rt.load(neff, ncg_id=ncg.id)
        rt.load(neff, ncg_id=ncg.id)
        with pytest.raises(ResourceError, match="already holds 2 models"):
            rt.load(neff, ncg_id=ncg.id)
        rt.unload(first.id)
        rt.load(neff, ncg_id=ncg.id)
    finally:
        rt.close()
        devices[0].release()


def test_session_quotas(machine: driver_sim.Machine, tmp_path: Path) -> None:
    """What one session (or the clients with no session, together) may hold: NCs, models,
    shm maps; another session is not limited by it."""
    devices = acquire_sim(machine, [0], address="in-process", version="test")
    options = RuntimeOptions(
        session_max_ncs=2, session_max_models=2, session_max_shm_maps=1, session_max_inflight=2
    )
    rt = Runtime(devices, options=options)
    rt._shm.root = tmp_path  # the shm objects of this test
    try:
        rt.init_devices()
        neff = read_neff(build_mlp((8, 8, 4)).neff)
        mine, other = rt.open_session(), rt.open_session()
        ncg = rt.create_ncg(2, session_id=mine)
        tag = session_tag(mine)
        with pytest.raises(ResourceError, match=f"session {tag} would hold 3 NeuronCores"):
            rt.create_ncg(1, session_id=mine)
        with pytest.raises(ResourceError, match="session_max_ncs 2"):
            rt.load(neff, session_id=mine)  # an implicit NCG counts too
        with pytest.raises(ResourceError, match="would hold"):
            rt.create_ncg(0, session_id=mine)  # the largest free run: 2 more
        first = rt.load(neff, ncg_id=ncg.id, session_id=mine)
        rt.load(neff, ncg_id=ncg.id, session_id=mine)
        with pytest.raises(ResourceError, match=r"has 2 models loaded.*session_max_models 2"):
            rt.load(neff, ncg_id=ncg.id, session_id=mine)
        rt.start(first.id)
        x = {"x": np.zeros((1, 8), np.float32).tobytes()}
        cookies = [rt.post(first.id, x), rt.post(first.id, x)]
        with pytest.raises(ResourceError, match=f"session {tag}: 2 inferences posted.*inflight 2"):
            rt.post(first.id, x)
        rt.wait(cookies.pop())
        cookies.append(rt.post(first.id, x))  # one waited for: one more may be posted
        for cookie in cookies:
            rt.wait(cookie)
        (tmp_path / "a").write_bytes(bytes(64))
        (tmp_path / "b").write_bytes(bytes(64))
        rt.shm_map("/a", 3, session_id=mine)
        rt.shm_map("/a", 3, session_id=mine)  # the same object again: no more held
        with pytest.raises(ResourceError, match="session_max_shm_maps 1"):
            rt.shm_map("/b", 3, session_id=mine)
        rt.shm_map("/b", 3, session_id=other)  # another session has its own quota
        assert rt.load(neff, session_id=other).id  # and its own NCs
        rt.end_session(mine)
        rt.create_ncg(2)  # what the ended session held is free again
        with pytest.raises(ResourceError, match="the clients with no session would hold 3"):
            rt.create_ncg(1)
    finally:
        rt.close()
        devices[0].release()


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_all_finite_finds_any_nan_or_inf(dtype: str) -> None:
    values = np.linspace(-3, 3, 5000).astype(dtype)
    assert all_finite(values) and all_finite(values[:10])
    for bad in (np.nan, np.inf, -np.inf):
        for at in (0, 2500, 4999):
            spoiled = values.copy()
            spoiled[at] = bad
            assert not all_finite(spoiled) and not all_finite(spoiled.reshape(50, 100))
    # squares (or, for a handful, a sum) that overflow are still all finite
    assert all_finite(np.full(5000, np.finfo(dtype).max / 2, dtype))
    assert all_finite(np.full(4, np.finfo(dtype).max, dtype))
    few = values[:8].copy()
    for pair in ([np.inf, -np.inf], [np.nan, 1.0], [np.inf, np.inf]):
        few[2:4] = np.array(pair, dtype)
        assert not all_finite(few)
    # several outputs at once (one errstate for all): any one spoiled spoils the answer
    assert all_finite(values, values[:10], values[:300], np.full(400, np.finfo(dtype).max, dtype))
    for worse in (few, spoiled, spoiled[-300:], spoiled[1::2]):  # (spoiled at its end)
        assert not all_finite(values, worse) and not all_finite(worse, values[:10])


def test_all_finite_reads_float_outputs_as_checked() -> None:
    """The forms `_numerical_code` keeps of a model's float outputs: a handful of values
    as a memoryview, more as a flat array; a NaN or Inf anywhere in any of them counts."""
    outputs: list[np.ndarray] = [
        np.ones((2, 3), np.float32),
        np.ones((4, 100), np.float64),
        np.ones(8, np.float16),
    ]
    forms = [checked_form(o) for o in outputs]
    assert type(forms[0]) is memoryview and forms[1].shape == (400,)
    assert all_finite(*forms)
    for output in outputs:
        for bad in (np.nan, np.inf):
            output.reshape(-1)[-1] = bad
            assert not all_finite(*forms)
            output.reshape(-1)[-1] = 1
    assert all_finite(*forms)


def test_an_unloaded_models_cookies_keep_only_their_answer(runtime: Runtime) -> None:
    """Cookies nobody collected do not keep an unloaded model alive (its memory and
    threads) for the cookies' time to live; each still answers once, cancelled."""
    import gc
    import weakref

    model = runtime.load(read_neff(build_mlp((8, 8, 4)).neff))
    x = np.zeros((1, 8), np.float32).tobytes()
    cookies = [runtime.post(model.id, {"x": x}) for _ in range(3)]
    held = weakref.ref(runtime._models[model.id])
    gc.disable()  # freed as it unloads, not by a later collection
    try:
        runtime.unload(model.id)
        # its worker threads may hold it a moment longer, as they end; never for the
        # cookies' time to live (60 s)
        wait_until(lambda: held() is None, 20, "the unloaded model freed")
    finally:
        gc.enable()
    assert runtime.completed(cookies) == cookies
    for cookie in cookies:
        with pytest.raises(InferCancelled, match="unloaded"):
            runtime.wait(cookie)
        with pytest.raises(InvalidHandle):
            runtime.wait(cookie)  # answered once


def test_a_hardware_error_is_recovered_by_resetting_the_device(tmp_path: Path) -> None:
    """Start after a hardware error resets the failed model's device: every model there
    is loaded again (each in its state), the device's DRAM is as before, and models on
    other devices are not touched; a reset that fails leaves the model FAILED for another
    start."""
    from neuron_rtd.runtime import LocalRuntime

    sample = build_mlp((8, 16, 4), batch=1, seed=2)
    x = sample.random_inputs()
    want = sample.reference(x)["probs"]
    with LocalRuntime("inf1.6xlarge", root=tmp_path) as local:
        rt = local.runtime
        on_0, on_1 = rt.create_ncg(4), rt.create_ncg(4)  # devices 0 and 1
        a = rt.load(read_neff(sample.neff), ncg_id=on_0.id)
        standby = rt.load(read_neff(sample.neff), ncg_id=on_0.id)
        b = rt.load(read_neff(sample.neff), ncg_id=on_1.id)
        rt.start(a.id)
        rt.start(b.id)
        untouched = rt._models[b.id]
        device = local.devices[0]
        assert isinstance(device, SimDevice)
        dram = device.dram_used()

        def infer(model_id: int) -> np.ndarray:
            result = rt.infer(model_id, {"x": x["x"].tobytes()})
            return np.frombuffer(result.outputs["probs"], np.float32).reshape(want.shape)

        device.inject("nc_error")
        with pytest.raises(HwError, match="hardware error during execution"):
            infer(a.id)
        assert rt.model(a.id).state is ModelState.FAILED
        np.testing.assert_allclose(infer(b.id), want, rtol=1e-5)  # device 1 serves on
        device.inject("init_fail")
        with pytest.raises(HwError, match="initialization failed"):
            rt.start(a.id)  # the reset failed: still FAILED, for another start
        assert rt.model(a.id).state is ModelState.FAILED
        rt.start(a.id)
        np.testing.assert_allclose(infer(a.id), want, rtol=1e-5)
        assert rt.model(standby.id).state is ModelState.STANDBY  # reloaded as it was
        assert device.dram_used() == dram
        assert rt._models[b.id] is untouched
        np.testing.assert_allclose(infer(b.id), want, rtol=1e-5)
        health = rt.hw_counters(index=0)  # both faults counted, and kept by the reset
        assert (health.nc_errors, health.init_failures) == (1, 1)
        assert rt.hw_counters(index=1).nc_errors == 0


def test_thread_pools_are_sized_by_the_cpus_the_daemon_may_run_on() -> None:
    """A daemon held to one CPU (systemd's CPUAffinity=, a cpuset, taskset) sizes its NC
    runs' and CPU nodes' threads to that CPU, not to every CPU of the host."""
    code = (
        "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from neuron_rtd.runtime.driver import nc_threads; "
        "from neuron_rtd.runtime.host import HostPool; "
        "from neuron_rtd.runtime.shm import default_read_threads; "
        "print(nc_threads(), HostPool().threads, default_read_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k != "NEURON_RTD_HOST_THREADS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["1", "1", "2"], done.stderr  # the shm readers: at least 2


def test_the_snapshots_cpu_time_counts_a_few_ms(runtime: Runtime) -> None:
    """The process's CPU time in a snapshot has the precision of getrusage (us), not of
    the kernel's 10 ms ticks: a few ms of work between two snapshots show."""
    before = runtime.snapshot()
    began = time.thread_time()
    while time.thread_time() - began < 0.003:  # 3 ms of CPU on this thread
        pass
    after = runtime.snapshot()
    spent = (after.cpu_user_s + after.cpu_system_s) - (before.cpu_user_s + before.cpu_system_s)
    assert spent >= 0.003


def test_neff_memory_is_reserved_per_load_until_it_is_over(
    runtime: Runtime, tmp_path: Path
) -> None:
    """Loads in progress cannot together take more than the admission bound (half the
    available memory): each buffer is reserved until its load is over, loaded or not."""
    import psutil

    bound = psutil.virtual_memory().available // 2
    first = runtime.neff_buffer(bound * 6 // 10)  # claimed, not written: costs nothing
    with pytest.raises(ResourceError, match="taken by loads in progress"):
        runtime.neff_buffer(bound * 6 // 10)
    with pytest.raises(InvalidError):
        runtime.load(first)  # a buffer of zeros is no NEFF: its load is over all the same
    second = runtime.neff_buffer(bound * 6 // 10)
    del first
    neff = build_relu((1, 8))
    buffer = runtime.neff_buffer(len(neff))
    buffer[:] = neff
    runtime.unload(runtime.load(buffer).id)
    assert runtime._admission.reserved == len(second)


def test_a_neff_files_header_is_checked_before_its_body_is_read(
    runtime: Runtime, tmp_path: Path
) -> None:
    """A 3 GiB sparse file is refused from its first bytes: no buffer is taken for it."""
    sparse = tmp_path / "sparse.neff"
    with open(sparse, "wb") as f:
        f.truncate(3 << 30)
    taken: list[int] = []
    real = runtime._admission.buffer

    def recorded(size: int) -> memoryview:
        taken.append(size)
        return real(size)

    runtime._admission.buffer = recorded  # type: ignore[method-assign]
    with pytest.raises(InvalidError, match="not a NEFF"):
        runtime.load(NeffFile(str(sparse)))
    cut = tmp_path / "cut.neff"
    cut.write_bytes(build_relu((1, 8))[:-1])
    with pytest.raises(InvalidError, match="NEFF is truncated"):
        runtime.load(NeffFile(str(cut)))
    assert taken == [] and runtime._admission.reserved == 0


def test_admission_sees_a_cgroups_memory_limit(tmp_path: Path) -> None:
    """Under a unit's MemoryMax= (cgroup v2) or a container's limit (v1), what is left of
    the limit bounds what the daemon admits, not the host's free memory."""
    from neuron_rtd.runtime.driver import _cgroup_memory_left

    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/neuron-rtd.service\n")
    v2 = tmp_path / "system.slice/neuron-rtd.service"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("1000000\n")
    (v2 / "memory.current").write_text("250000\n")
    assert _cgroup_memory_left(proc, tmp_path) == 750000
    (v2 / "memory.max").write_text("max\n")
    assert _cgroup_memory_left(proc, tmp_path) is None
    proc.write_text("4:memory:/box\n0::/\n")
    v1 = tmp_path / "memory/box"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2000\n")
    (v1 / "memory.usage_in_bytes").write_text("500\n")
    assert _cgroup_memory_left(proc, tmp_path) == 1500


def test_a_model_with_an_empty_output_loads_and_answers_it() -> None:
    """An output with no elements (a Slice past the end) is a fine output: the model
    loads, and each inference answers it empty, with no numerical error."""
    from onnx import TensorProto, helper

    from neuron_rtd.compiler import compile_model
    from neuron_rtd.runtime import LocalRuntime

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 0])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])
    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [9])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [12])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
        helper.make_node("Relu", ["x"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "empty", [x], [y, z], [starts, ends, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with LocalRuntime() as local:
        loaded = local.runtime.load(compile_model(model).neff)
        data = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
        result = local.runtime.infer(loaded.id, {"x": data.tobytes()})
        assert result.code == Nerr.OK
        assert result.outputs["y"].shape == (2, 0)
        assert result.outputs["z"].tolist() == np.maximum(data, 0).tolist()


@pytest.mark.parametrize("rows", [(1, 3), (2, 2, 4), (3,)])
def test_row_blocks_are_read_into_the_slot_as_their_concatenation(rows: tuple[int, ...]) -> None:
    """A batch's inputs as `Rows` (each request's block, in order) answer as the blocks
    concatenated would: written one after another into a bucket's slot, padded when the
    bucket is larger (5 rows in the bucket of 8), whole when they fill it (8, 4)."""
    from test_serving_repository import BUCKETS, W

    from neuron_rtd.runtime import LocalRuntime, Rows

    rng = np.random.default_rng(7)
    blocks = tuple(rng.standard_normal((n, 4)).astype(np.float32) for n in rows)
    with LocalRuntime() as local:
        model = local.runtime.load(BUCKETS)
        by_rows = local.runtime.infer(model.id, {"x": Rows(blocks)})
        whole = local.runtime.infer(model.id, {"x": np.concatenate(blocks)})
    assert by_rows.code == whole.code == Nerr.OK
    np.testing.assert_array_equal(by_rows.outputs["y"], whole.outputs["y"])
    np.testing.assert_allclose(by_rows.outputs["y"], np.concatenate(blocks) @ W, rtol=1e-5)


def test_an_inline_output_is_copied_once_and_sent_as_it_is() -> None:
    """An inference's inline outputs are arrays of their true shapes over one bytes copy
    each out of the slot: a wire sends those very bytes (`wire_bytes`, no second copy),
    and a part of one (a batch's rows) as a copy of its own."""
    from neuron_rtd.runtime import LocalRuntime, wire_bytes

    sample = build_mlp((8, 8, 4), batch=2)
    with LocalRuntime() as local:
        model = local.runtime.load(sample.neff)
        inputs = {k: v.tobytes() for k, v in sample.random_inputs().items()}
        first = local.runtime.infer(model.id, inputs).outputs
        kept = {name: array.copy() for name, array in first.items()}
        zeros = {k: bytes(len(v)) for k, v in inputs.items()}
        local.runtime.infer(model.id, zeros)  # the same slot, other values
    for name, array in first.items():
        spec = next(t for t in read_neff(sample.neff).outputs if t.name == name)
        assert array.shape == spec.shape and not array.flags.writeable
        np.testing.assert_array_equal(array, kept[name])  # a copy, not a view of the slot
        sent = wire_bytes(array)
        assert type(sent) is bytes and sent is wire_bytes(array)  # the result's own bytes
        assert sent == kept[name].tobytes()
        assert wire_bytes(array[:1]) == array[:1].tobytes()


def test_the_nan_outcome_reaches_every_numpy_caller(tmp_path: Path) -> None:
    """The one numpy entry (`Runtime.infer` on arrays) keeps an inference's code: the
    in-process runtime's outputs carry it (`Outputs.code`), and so does the serving core's
    answer (`InferResponse.code`)."""
    from neuron_rtd.runtime import LocalRuntime
    from neuron_rtd.serving import InferRequest, Serving

    sample = build_mlp((4, 4), name="m")
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.neff").write_bytes(sample.neff)
    bad, good = np.full((1, 4), np.inf, np.float32), np.ones((1, 4), np.float32)
    with LocalRuntime() as local:
        model = local.load(sample.neff)
        assert local.infer(model, {"x": bad}).code == Nerr.INFER_COMPLETED_WITH_NUM_ERR
        assert local.infer(model, {"x": good}).code == Nerr.OK
        assert local.wait(model, local.post(model, {"x": bad})).code != Nerr.OK
        serving = Serving(local.runtime, repository=tmp_path)
        serving.start()
        try:
            answer = serving.infer(InferRequest("m", {"x": bad}))
            assert answer.code == Nerr.INFER_COMPLETED_WITH_NUM_ERR
            assert serving.infer(InferRequest("m", {"x": good})).code == Nerr.OK
        finally:
            serving.close()
