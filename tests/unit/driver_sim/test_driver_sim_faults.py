"""driver_sim fault injection: spec syntax, and faults from the env, the file and inject()."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from driver_sim import (
    Device,
    HealthCounters,
    HwFault,
    InitFailed,
    Instr,
    LoadedProgram,
    Machine,
    NcProgram,
    NeuronCore,
    faults,
    parse_fault_spec,
)
from driver_sim.faults import FaultSpec, InjectFile, parse_env_faults

ADDRESS = "unix:/t.sock"


def relu_on(core: NeuronCore) -> LoadedProgram:
    return core.load(NcProgram([Instr("Relu", ("x",), ("y",), {})], {}, ["x"], ["y"]))


def run_relu(core: NeuronCore, program: LoadedProgram) -> None:
    core.run(program, {"x": np.ones(3, np.float32)}, {"y": np.empty(3, np.float32)})


# ---- syntax ------------------------------------------------------------------------------


def test_parse_specs() -> None:
    assert parse_fault_spec("init_fail") == FaultSpec("init_fail")
    assert parse_fault_spec("nc_error") == FaultSpec("nc_error")
    assert parse_fault_spec("nc_error:2") == FaultSpec("nc_error", 2)
    assert parse_fault_spec("nc_delay_ms:1=50") == FaultSpec("nc_delay_ms", 1, 50)
    assert parse_fault_spec("load_delay_ms=50") == FaultSpec("load_delay_ms", None, 50)
    assert parse_fault_spec(" mem_ecc_corr = 3 ") == FaultSpec("mem_ecc_corr", None, 3)
    assert parse_env_faults("init_fail@1, nc_error@0:2,mem_ecc_corr@0=3") == [
        (1, FaultSpec("init_fail")),
        (0, FaultSpec("nc_error", 2)),
        (0, FaultSpec("mem_ecc_corr", None, 3)),
    ]


@pytest.mark.parametrize(
    "spec",
    [
        "explode",
        "nc_error:7",
        "nc_error:x",
        "nc_error=1",
        "init_fail:1",
        "mem_ecc_corr",
        "mem_ecc_corr:1=2",
        "nc_delay_ms=-5",
        "load_delay_ms",
        "load_delay_ms:1=5",
        "sram_ecc_uncorr=lots",
    ],
)
def test_malformed_spec_names_it(spec: str) -> None:
    with pytest.raises(ValueError, match=f"bad fault spec '{spec}'"):
        parse_fault_spec(spec)


def test_malformed_env_spec() -> None:
    with pytest.raises(ValueError, match="'nc_error'"):
        parse_env_faults("nc_error")
    with pytest.raises(ValueError, match="'nc_error@x'"):
        parse_env_faults("nc_error@x")


# ---- from the env --------------------------------------------------------------------------


def test_env_faults_apply_at_acquire(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_SIM_FAULTS", "init_fail@1,nc_error@0:2,mem_ecc_corr@0=3")
    dev0, dev1 = machine.acquire([0, 1], address=ADDRESS, version="1")
    assert dev0.hw_counters() == HealthCounters(mem_ecc_corr=3)
    assert machine.device_info(0).hw.mem_ecc_corr == 3
    dev0.reset()
    program = relu_on(dev0.nc(2))
    run_relu(dev0.nc(1), relu_on(dev0.nc(1)))
    with pytest.raises(HwFault, match=r"device 0 \(0000:00:1c\.0\) NC 2: .*\(injected\)"):
        run_relu(dev0.nc(2), program)
    run_relu(dev0.nc(2), program)  # one-shot
    for _ in range(2):  # persistent while set
        with pytest.raises(InitFailed):
            dev1.reset()
    monkeypatch.delenv("NEURON_SIM_FAULTS")
    dev1.reset()
    dev0.release()
    dev1.release()


def test_malformed_env_fails_acquire(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_SIM_FAULTS", "nc_error@0:9")
    with pytest.raises(ValueError, match="nc_error@0:9"):
        machine.acquire([0], address=ADDRESS, version="1")
    assert machine.device_info(0).owner is None


# ---- from the file --------------------------------------------------------------------------


def test_inject_file_is_consumed_before_a_run(device: Device, machine: Machine) -> None:
    core = device.nc(1)
    program = relu_on(core)
    inject = machine.root / "neuron0" / "inject"
    inject.write_text("# comment\nnc_error:1\n\nsram_ecc_uncorr=2\n")
    with pytest.raises(HwFault, match="NC 1: hardware error"):
        run_relu(core, program)
    assert inject.read_text() == ""
    assert device.hw_counters() == HealthCounters(sram_ecc_uncorr=2, nc_errors=1)
    with pytest.raises(HwFault, match="uncorrectable ECC error in SRAM"):
        run_relu(core, program)  # the uncorrectable error meets the next run
    run_relu(core, program)
    assert core.counters().runs == 1
    assert device.hw_counters() == HealthCounters(sram_ecc_uncorr=2, nc_errors=1)  # not twice


def test_corrected_ecc_is_only_counted_an_uncorrectable_one_spoils_a_run(
    device: Device,
) -> None:
    device.inject("mem_ecc_corr=3")
    run_relu(device.nc(2), relu_on(device.nc(2)))  # corrected: the run is fine
    device.inject("mem_ecc_uncorr=1")
    with pytest.raises(HwFault, match="NC 3: uncorrectable ECC error in device memory"):
        run_relu(device.nc(3), relu_on(device.nc(3)))  # on any NC
    run_relu(device.nc(3), relu_on(device.nc(3)))
    assert device.hw_counters() == HealthCounters(mem_ecc_corr=3, mem_ecc_uncorr=1)


def test_inject_file_at_reset(device: Device, machine: Machine) -> None:
    (machine.root / "neuron0" / "inject").write_text("init_fail\nmem_ecc_uncorr=1\n")
    with pytest.raises(InitFailed):
        device.reset()
    assert device.hw_counters().mem_ecc_uncorr == 1
    device.reset()


def test_bad_line_in_the_file_is_logged_and_skipped(
    device: Device, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    (machine.root / "neuron0" / "inject").write_text("bogus\nmem_ecc_corr=4\n")
    caplog.set_level(logging.WARNING, logger="nrtd.TDRV")
    run_relu(device.nc(0), relu_on(device.nc(0)))
    assert device.hw_counters().mem_ecc_corr == 4
    assert any("'bogus'" in record.getMessage() for record in caplog.records)


# ---- from inject() ---------------------------------------------------------------------------


def test_nc_error_without_nc_hits_the_next_run_anywhere(device: Device) -> None:
    device.inject("nc_error")
    with pytest.raises(HwFault, match="NC 3"):
        run_relu(device.nc(3), relu_on(device.nc(3)))
    run_relu(device.nc(0), relu_on(device.nc(0)))


@pytest.mark.parametrize(
    ("spec", "message", "counted"),
    [
        (
            "nc_hang:1",
            r"NC 1: the NC did not complete its run within 1 s \(hung; injected\)",
            HealthCounters(nc_hangs=1),
        ),
        (
            "dma_timeout:1",
            r"NC 1: DMA of the run's inputs timed out \(injected\)",
            HealthCounters(dma_timeouts=1),
        ),
        (
            "nc_error:1",
            r"NC 1: hardware error during execution \(injected\)",
            HealthCounters(nc_errors=1),
        ),
    ],
)
def test_one_run_faults_spoil_the_next_run_on_their_nc_and_are_counted(
    device: Device, machine: Machine, spec: str, message: str, counted: HealthCounters
) -> None:
    device.inject(spec)
    run_relu(device.nc(0), relu_on(device.nc(0)))  # another NC runs as ever
    assert device.hw_counters() == HealthCounters()  # not counted before it happens
    core = device.nc(1)
    program = relu_on(core)
    with pytest.raises(HwFault, match=message):
        run_relu(core, program)
    run_relu(core, program)  # once: the next run is fine
    assert device.hw_counters() == counted
    device.reset()  # counted for good, and seen by anyone reading the tree
    assert Machine.open(machine.root).device_info(0).hw == counted


def test_init_failures_are_counted(device: Device) -> None:
    device.inject("init_fail")
    with pytest.raises(InitFailed):
        device.reset()
    device.reset()
    assert device.hw_counters() == HealthCounters(init_failures=1)


def test_nc_delay(device: Device) -> None:
    core = device.nc(2)
    program = relu_on(core)
    # A delay far longer than any run, so "slowed" and "not slowed" cannot be confused.
    device.inject("nc_delay_ms:2=1000")
    start = time.perf_counter()
    run_relu(core, program)
    assert time.perf_counter() - start >= 1.0
    assert core.counters().busy_ns >= 1_000_000_000
    start = time.perf_counter()
    run_relu(device.nc(1), relu_on(device.nc(1)))  # other NCs are not slowed
    assert time.perf_counter() - start < 0.5
    device.inject("nc_delay_ms:2=0")
    start = time.perf_counter()
    run_relu(core, program)
    assert time.perf_counter() - start < 0.5


def test_load_delay_holds_every_program_load_until_cleared(
    device: Device, machine: Machine
) -> None:
    # A delay far longer than a load, so "held" and "not held" cannot be confused; written
    # to the inject file, as a test of the daemon writes it.
    (machine.root / "neuron0" / "inject").write_text("load_delay_ms=1000\n")
    start = time.perf_counter()
    relu_on(device.nc(3))
    assert time.perf_counter() - start >= 1.0
    device.inject("load_delay_ms=0")
    start = time.perf_counter()
    relu_on(device.nc(3))
    assert time.perf_counter() - start < 0.5


def test_ecc_counters_add_up(device: Device, machine: Machine) -> None:
    for spec in ("mem_ecc_corr=1", "mem_ecc_corr=2", "mem_ecc_uncorr=5", "sram_ecc_corr=7"):
        device.inject(spec)
    expected = HealthCounters(mem_ecc_corr=3, mem_ecc_uncorr=5, sram_ecc_corr=7)
    assert device.hw_counters() == expected
    device.reset()  # a reset does not clear the health counters
    assert Machine.open(machine.root).device_info(0).hw == expected


def test_inject_rejects_malformed(device: Device) -> None:
    with pytest.raises(ValueError, match="'nc_delay_ms'"):
        device.inject("nc_delay_ms")


# ---- the inject file's watch ----------------------------------------------------------------
# Before each run the NC consumes the inject file; an inotify watch on its folder says
# whether anything was written since the last look (`InjectFile`), a stat where none can be.


def _fails_next(core: NeuronCore, program: LoadedProgram) -> None:
    with pytest.raises(HwFault, match="hardware error"):
        run_relu(core, program)
    run_relu(core, program)


@pytest.mark.parametrize(
    "how", ["in_place", "append", "rename_over", "rm_and_create", "shell_sed", "rename_away"]
)
def test_each_way_of_writing_the_inject_file_is_seen_by_the_next_run(
    device: Device, machine: Machine, how: str
) -> None:
    core = device.nc(1)
    program = relu_on(core)
    inject = machine.root / "neuron0" / "inject"
    for _ in range(3):
        run_relu(core, program)
        if how == "in_place":
            inject.write_text("nc_error:1\n")
        elif how == "append":
            with open(inject, "a") as file:
                file.write("nc_error\n")
        elif how == "rename_over":
            made = inject.with_name("inject.tmp")
            made.write_text("nc_error\n")
            os.replace(made, inject)
        elif how == "rm_and_create":
            inject.unlink()
            inject.write_text("nc_error\n")
        elif how == "shell_sed":
            inject.write_text("# x\n")
            subprocess.run(["sed", "-i", "s/# x/nc_error/", str(inject)], check=True)
        else:
            os.rename(inject, inject.with_name("old"))
            inject.write_text("nc_error\n")
            inject.with_name("old").unlink()
        _fails_next(core, program)
    assert device._inject._watching


def test_an_inject_file_written_before_the_claim_is_seen_at_the_first_run(
    machine: Machine,
) -> None:
    (machine.root / "neuron0" / "inject").write_text("nc_error\n")
    (device,) = machine.acquire([0], address=ADDRESS, version="1")
    try:
        core = device.nc(0)
        _fails_next(core, relu_on(core))
    finally:
        device.release()


def test_a_lost_watch_falls_back_to_a_stat_per_run(tmp_path: Path) -> None:
    folder = tmp_path / "dev"
    folder.mkdir()
    (folder / "inject").write_text("")
    watched = InjectFile(folder / "inject")
    assert watched.take() == [] and watched._watching
    os.rename(folder, tmp_path / "elsewhere")  # the watch follows the folder away
    folder.mkdir()
    (folder / "inject").write_text("x\n")
    assert watched.take() == ["x"] and not watched._watching
    watched.close()


def test_without_inotify_every_take_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_inotify_watch", lambda folder: None)
    inject = tmp_path / "inject"
    inject.write_text("a\n")
    watched = InjectFile(inject)
    assert not watched._watching
    assert watched.take() == ["a"] and watched.take() == []
    inject.write_text("b\n")
    assert watched.take() == ["b"]
    watched.close()


def test_released_devices_leave_no_watch(machine: Machine) -> None:
    for _ in range(300):  # past the per-user limit of inotify instances (128) if leaked
        (device,) = machine.acquire([0], address=ADDRESS, version="1")
        assert device._inject._watching
        device.release()


def test_every_nc_of_a_device_checks_the_file_at_once(device: Device, machine: Machine) -> None:
    inject = machine.root / "neuron0" / "inject"
    errors: list[BaseException] = []

    def runs(nc: int) -> None:
        core = device.nc(nc)
        program = relu_on(core)
        try:
            for _ in range(2000):
                run_relu(core, program)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=runs, args=(nc,)) for nc in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(20):
        with open(inject, "a") as file:
            file.write("nc_delay_ms=0\n")
    for thread in threads:
        thread.join()
    assert errors == []
