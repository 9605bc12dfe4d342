"""The daemon as a process: device groups, refusals, systemd notify, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from test_wire import load_stream
from waiting import wait_until

import driver_sim
from neuron_rtd import __version__
from neuron_rtd.cli.spawn import DaemonProcess, DaemonStartError, NotifyListener
from neuron_rtd.client import Client, NrtConnectionError
from neuron_rtd.neff.samples import build_mlp, build_relu
from neuron_rtd.proto import pb, pb_grpc

BDFS = ["0000:00:1c.0", "0000:00:1d.0", "0000:00:1e.0", "0000:00:1f.0"]


def run_daemon(*args: str, sim_root: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURON_SIM_ROOT": str(sim_root)}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "neuron_rtd.daemon.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_two_daemons_on_disjoint_device_groups(work: Path) -> None:
    sim = work / "sim"
    sample = build_mlp((16, 16, 4))
    with (
        DaemonProcess(sim_root=sim, args=["-t", BDFS[0], "-t", BDFS[1]]) as a,
        DaemonProcess(sim_root=sim, args=["-t", BDFS[3], "-t", BDFS[2]]) as b,
    ):
        owners = [d.owner for d in driver_sim.Machine.open(sim).devices()]
        assert [o.pid if o else None for o in owners] == [a.pid, a.pid, b.pid, b.pid]
        assert owners[2] is not None and owners[2].address == b.address
        for proc in (a, b):
            with Client(proc.address) as client:
                assert client.list_ncgs() == []
                _, count = client.create_ncg(0)
                assert count == 8  # two devices of 4 NCs each
                client.unload_all()
                model = client.load(sample.neff)
                out = model.infer(sample.random_inputs())
                ref = sample.reference(sample.random_inputs())
                assert abs(out["probs"] - ref["probs"]).max() < 1e-6

        overlap = run_daemon(
            "-g", f"unix:{work}/c.sock", "-t", BDFS[1], "-t", BDFS[2], sim_root=sim
        )
        assert overlap.returncode == 1
        assert f"pid {a.pid}" in overlap.stderr
        assert not (work / "c.sock").exists()


def test_non_contiguous_devices_are_refused(work: Path) -> None:
    done = run_daemon(
        "-g", f"unix:{work}/d.sock", "-t", BDFS[0], "-t", BDFS[2], sim_root=work / "sim"
    )
    assert done.returncode == 1
    assert "not contiguous" in done.stderr
    unknown = run_daemon("-g", f"unix:{work}/d.sock", "-t", "0000:00:01.0", sim_root=work / "sim")
    assert unknown.returncode == 1 and "no Neuron device at 0000:00:01.0" in unknown.stderr


def test_second_daemon_on_same_socket_is_refused(work: Path) -> None:
    with DaemonProcess(sim_root=work / "sim", args=["-t", BDFS[0]]) as first:
        lock = Path(first.socket_path + ".lock")
        for console in ([], ["-x"]):  # logging to syslog, or to the console too
            done = run_daemon("-g", first.address, "-t", BDFS[1], *console, sim_root=work / "sim")
            assert done.returncode == 1
            assert f"pid {first.pid}" in done.stderr and "already serves" in done.stderr
            assert done.stderr.count("already serves") == 1, done.stderr  # said once
            assert lock.read_text() == f"{first.pid}\n"  # the first one's lock, untouched
        with Client(first.address) as client:  # the first one still serves
            assert client.version()
    assert not lock.exists() and not Path(first.socket_path).exists()  # gone with it


def test_a_refused_start_leaves_no_lock_file(work: Path) -> None:
    path = work / "taken.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # some other server there
    other.bind(str(path))
    other.listen()
    try:
        done = run_daemon("-g", f"unix:{path}", "-t", BDFS[0], sim_root=work / "sim")
    finally:
        other.close()
    assert done.returncode == 1 and "a live server already answers" in done.stderr
    assert not Path(f"{path}.lock").exists()


def test_sigterm_drains_releases_devices_and_removes_socket(work: Path) -> None:
    sim = work / "sim"
    proc = DaemonProcess(sim_root=sim, args=["-t", BDFS[0]])
    proc.start()
    sock = Path(proc.socket_path)
    mode = stat.S_IMODE(sock.stat().st_mode)
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert mode & 0o002 == 0 and mode == 0o660
    sample = build_mlp((8, 8, 4))
    (work / "m.neff").write_bytes(sample.neff)
    with Client(proc.address) as client:
        model = client.load(work / "m.neff")  # streamed in chunks from the mmapped file
        got = model.infer(sample.random_inputs())["probs"]
        assert abs(got - sample.reference(sample.random_inputs())["probs"]).max() < 1e-6
    assert proc.stop() == 0
    assert not sock.exists() and not Path(f"{sock}.lock").exists()
    assert driver_sim.Machine.open(sim).device_info(0).owner is None
    log = proc.log()
    assert "[NRTD:RunServer] Server listening on " + proc.address in log
    assert "[TDRV:reset_mla] Resetting 0000:00:1c.0" in log
    assert "[TDRV:tdrv_init_one_mla_phase2] Initialized Inferentia: 0000:00:1c.0" in log
    assert "Unloaded model" in log
    proc.close()


def test_ctrl_c_then_sigterm_stop_it_once_both_logged(work: Path) -> None:
    """A terminal's Ctrl-C reaches the daemon and then its parent's SIGTERM, as when the demo
    is interrupted. The handler only notes each signal (taking a lock in a handler once hung
    the daemon for good when a signal came while the main thread held that lock)."""
    proc = DaemonProcess(sim_root=work / "sim").start()
    assert proc.proc is not None
    for _ in range(20):
        proc.proc.send_signal(signal.SIGINT)
    assert proc.stop() == 0
    log = proc.log()
    assert "[NRTD:SignalHandler] Received SIGINT" in log
    assert log.rstrip().endswith("[NRTD:RunServer] Stopped"), log
    assert log.count("Stopping: draining requests") == 1
    proc.close()


def test_dead_daemon_leaves_no_claim(work: Path) -> None:
    sim = work / "sim"
    first = DaemonProcess(sim_root=sim, args=["-t", BDFS[0]])
    first.start()
    address = first.address
    assert first.proc is not None
    first.proc.kill()
    first.proc.wait()
    # its socket file is stale now: a new daemon on the same address takes over
    with DaemonProcess(sim_root=sim, socket_path=first.socket_path, args=["-t", BDFS[0]]) as d2:
        with Client(address) as client:
            assert client.version()
        owner = driver_sim.Machine.open(sim).device_info(0).owner
        assert owner is not None and owner.pid == d2.pid
    first.close()


def test_a_daemon_killed_under_load_restarts_on_its_socket(work: Path) -> None:
    """SIGKILL while clients infer; a new daemon on the same socket and sim root takes the
    stale socket, lock and device over, and a client made before the kill recovers with
    its one retry (as the unit's Restart=on-failure does it unattended)."""
    import threading

    sim = work / "sim"
    sample = build_mlp((16, 32, 4), batch=1, seed=5)
    first = DaemonProcess(sim_root=sim, args=["-t", BDFS[0]])
    first.start()
    lock = Path(first.socket_path + ".lock")
    client = Client(first.address)
    model = client.load(sample.neff)
    inputs = sample.random_inputs()
    answered = [0, 0]  # before the kill, after the restart
    stop = threading.Event()
    errors: list[str] = []

    def load_(slot: list[int]) -> None:
        while not stop.is_set():
            try:
                model.infer(inputs)
                slot[0] += 1
            except NrtConnectionError as exc:  # the kill: a transport failure
                errors.append(str(exc.grpc_code))
                return

    counts = [[0] for _ in range(4)]
    threads = [threading.Thread(target=load_, args=(c,)) for c in counts]
    for thread in threads:
        thread.start()
    wait_until(lambda: sum(c[0] for c in counts) >= 20, 60, "20 calls answered before the kill")
    assert first.proc is not None
    first.proc.kill()
    first.proc.wait()
    stop.set()
    for thread in threads:
        thread.join(30)
    answered[0] = sum(c[0] for c in counts)
    assert Path(first.socket_path).exists() and lock.exists()  # left by the dead daemon
    assert len(errors) == 4 and set(errors) <= {"StatusCode.UNAVAILABLE"}, errors
    with DaemonProcess(sim_root=sim, socket_path=first.socket_path, args=["-t", BDFS[0]]) as second:
        owner = driver_sim.Machine.open(sim).device_info(0).owner
        assert owner is not None and owner.pid == second.pid
        assert client.version()  # the same client: its channel reconnects, one retry
        again = client.load(sample.neff)  # the old model died with the old daemon
        np.testing.assert_allclose(
            again.infer(inputs)["probs"], sample.reference(inputs)["probs"], rtol=1e-5
        )
        answered[1] = 1
    client.close()
    first.close()
    assert answered[0] >= 20 and answered[1] == 1


def test_notify_protocol_and_watchdog(work: Path) -> None:
    notify = NotifyListener(work)
    env = {
        **os.environ,
        "NEURON_SIM_ROOT": str(work / "sim"),
        "NOTIFY_SOCKET": notify.path,
        "WATCHDOG_USEC": "400000",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "neuron_rtd.daemon.main",
            "-g",
            f"unix:{work}/n.sock",
            "-t",
            BDFS[0],
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert notify.wait_for("READY=1", 30, alive=lambda: proc.poll() is None)
        ready = next(m for m in notify.messages if "READY=1" in m.split("\n"))
        assert "STATUS=Serving 1 device(s) (0000:00:1c.0)" in ready
        pings_before = sum("WATCHDOG=1" in m for m in notify.messages)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            notify.receive(0.2)
        pings = sum("WATCHDOG=1" in m for m in notify.messages) - pings_before
        assert pings >= 5  # every 0.2 s
        proc.send_signal(signal.SIGTERM)
        assert notify.wait_for("STOPPING=1", 10)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()
    statuses = [m for m in notify.messages if "STATUS=" in m]
    assert statuses[0].endswith("STATUS=Starting")


def test_config_file_and_bad_config(work: Path) -> None:
    good = work / "good.json"
    good.write_text(
        json.dumps(
            {"server_address": f"unix:{work}/cfg.sock", "devices": [BDFS[3]], "default_ninfer": 2}
        )
    )
    with DaemonProcess(
        sim_root=work / "sim", args=["-c", str(good)], socket_path=work / "cfg.sock"
    ) as proc:
        owner = driver_sim.Machine.open(work / "sim").device_info(3).owner
        assert owner is not None and owner.pid == proc.pid
    bad = work / "bad.json"
    bad.write_text(json.dumps({"default_ninfer": "four"}))
    done = run_daemon("-c", str(bad), sim_root=work / "sim")
    assert done.returncode == 2 and "default_ninfer" in done.stderr
    typo = work / "typo.json"
    typo.write_text(json.dumps({"server_adress": "unix:/x"}))
    done = run_daemon("-c", str(typo), sim_root=work / "sim")
    assert done.returncode == 2 and "unknown key 'server_adress'" in done.stderr
    missing = run_daemon("-c", str(work / "nope.json"), sim_root=work / "sim")
    assert missing.returncode == 2 and "cannot read config" in missing.stderr


def test_version_and_help_flags(work: Path) -> None:
    version = run_daemon("-v", sim_root=work / "sim")
    assert version.returncode == 0 and version.stdout.startswith("neuron-rtd ")
    helptext = run_daemon("-h", sim_root=work / "sim")
    assert helptext.returncode == 0
    for flag in ("-t BDF", "-g ADDRESS", "-c CONFIG", "-l", "-x", "-i INSTANCE", "-v"):
        assert flag in helptext.stdout


def test_start_failure_is_reported(work: Path) -> None:
    with pytest.raises(DaemonStartError, match="not contiguous"):
        DaemonProcess(sim_root=work / "sim", args=["-t", BDFS[0], "-t", BDFS[3]]).start()


def test_device_init_failure_answers_hw_error(work: Path) -> None:
    env = {"NEURON_SIM_FAULTS": "init_fail@0"}
    with (
        DaemonProcess(sim_root=work / "sim", args=["-t", BDFS[0]], env=env) as proc,
        grpc.insecure_channel(proc.address) as channel,
    ):
        stub = pb_grpc.nmgr_v1Stub(channel)
        response = stub.create_eg(pb.create_eg_request(nc_count=1))
        assert response.status.code == 6  # NERR_HW_ERROR
        assert b"not initialized" in response.status.details
        # Every call that answers a status answers NERR_HW_ERROR while init keeps failing.
        h_nn, h_eg = pb.h_nn(id=10001), pb.h_eg(id=1)
        calls = {
            "load": lambda: stub.load(iter(load_stream(build_relu((4,))))),
            "unload": lambda: stub.unload(pb.unload_request(h_nn=h_nn)),
            "start": lambda: stub.start(pb.start_request(h_nn=h_nn)),
            "stop": lambda: stub.stop(pb.stop_request(h_nn=h_nn)),
            "infer": lambda: stub.infer(pb.infer_request(h_nn=h_nn)),
            "infer_post": lambda: stub.infer_post(pb.infer_request(h_nn=h_nn)),
            "infer_wait": lambda: stub.infer_wait(pb.infer_wait_request(cookie=1)),
            "infer_poll": lambda: stub.infer_poll(pb.infer_wait_request(cookie=1)),
            "infer_check_completion": lambda: stub.infer_check_completion(
                pb.infer_check_completion_request(cookie=[1])
            ),
            "destroy_eg": lambda: stub.destroy_eg(pb.destroy_eg_request(h_eg=h_eg)),
            "list_egs": lambda: stub.list_egs(pb.empty()),
            "read_nc_counters": lambda: stub.read_nc_counters(pb.read_nc_counters_request()),
            "read_nc_time_in_use": lambda: stub.read_nc_time_in_use(
                pb.read_nc_time_in_use_request()
            ),
            "read_all_counters": lambda: stub.read_all_counters(pb.read_all_counters_request()),
            "read_all_metrics": lambda: stub.read_all_metrics(pb.read_all_metrics_request()),
            "shm_map": lambda: stub.shm_map(pb.shm_map_request(path="/x", mmap_prot=3)),
            "shm_unmap": lambda: stub.shm_unmap(pb.shm_unmap_request(path="/x")),
            "get_hw_counters": lambda: stub.get_hw_counters(
                pb.get_hw_counters_request(device_id=0)
            ),
            "get_all_hw_counters": lambda: stub.get_all_hw_counters(pb.empty()),
            "random_seed": lambda: stub.random_seed(pb.random_seed_request(h_eg=h_eg, seed=1)),
            "set_static_transfer_adjustment": lambda: stub.set_static_transfer_adjustment(
                pb.set_static_transfer_adjustment_request(transfer_adjust_cnt=1)
            ),
        }
        for method, call in calls.items():
            status = call().status
            assert status.code == 6 and b"not initialized" in status.details, method
        assert stub.unload_all(pb.empty()).code == 6
        # The two answers without a status still come, and the ping says the daemon lives.
        version = stub.get_version(pb.get_version_request()).runtime_version
        assert version.full_version == __version__
        assert (version.major_num, version.minor_num) == tuple(
            int(p) for p in __version__.split(".")[:2]
        )
        assert stub.read_inference_counters(pb.empty()).nmgr_counters.infer_count == 0
        assert stub.start(pb.start_request(h_nn=pb.h_nn(id=0))).status.code == 0


def test_socket_group_and_mode_from_config(work: Path) -> None:
    import grp

    group = next(g for g in grp.getgrall() if g.gr_gid != os.getgid())
    config = work / "group.json"
    config.write_text(json.dumps({"socket_group": group.gr_name, "socket_mode": "0640"}))
    with DaemonProcess(sim_root=work / "sim", args=["-c", str(config), "-t", BDFS[0]]) as proc:
        st = Path(proc.socket_path).stat()
        assert st.st_gid == group.gr_gid
        assert stat.S_IMODE(st.st_mode) == 0o640
    world = work / "world.json"
    world.write_text(json.dumps({"socket_mode": "0666"}))
    done = run_daemon("-c", str(world), sim_root=work / "sim")
    assert done.returncode == 2 and "world-writable" in done.stderr


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("spinning", ["in-runs", "while-busy", "always"])
def test_the_ncs_threads_sleep_between_inferences(work: Path, spinning: str) -> None:
    """The NCs' threads spin while they run (while-busy: up to 1 ms after), not for long
    after: a model inferring every 20 ms leaves the cores idle in between, and an idle
    daemon takes no CPU. Under
    onnxruntime's default (NEURON_RTD_NC_SPINNING=always) a thread spins ~45 ms after
    every run: a core busy all along, which is what this test tells apart."""
    sample = build_mlp((512, 1024, 256), batch=32, seed=3)
    env = {**os.environ, "NEURON_RTD_NC_SPINNING": spinning}
    with (
        DaemonProcess(sim_root=work / spinning, args=["-t", BDFS[0]], env=env) as daemon,
        Client(daemon.address) as client,
    ):
        model = client.load(sample.neff)
        x = sample.random_inputs(seed=1)["x"]
        model(x=x)

        def every_20_ms() -> tuple[int, float]:
            """One second of a call every 20 ms: the calls, the daemon's cores busy."""
            start, before = time.monotonic(), _cpu_seconds(daemon.pid)
            calls = 0
            while time.monotonic() - start < 1.0:
                model(x=x)
                calls += 1
                time.sleep(0.02)
            return calls, (_cpu_seconds(daemon.pid) - before) / (time.monotonic() - start)

        calls, busy = every_20_ms()
        # Only a run on more than one thread has threads to spin after it. On a host
        # busy with other work the engine's trial can find one thread as fast, and tries
        # again 2 s later, then 4 s after that, ... (`driver_sim/fast.py`): up to 15 s.
        deadline = time.monotonic() + 15
        while spinning == "always" and busy <= 0.6 and time.monotonic() < deadline:
            calls, busy = every_20_ms()
        # the last run's spin over: the daemon's CPU time unchanged for 0.1 s (10 ticks)
        seen = [_cpu_seconds(daemon.pid), time.monotonic()]

        def settled() -> bool:
            cpu = _cpu_seconds(daemon.pid)
            if cpu != seen[0]:
                seen[:] = [cpu, time.monotonic()]
            return time.monotonic() - seen[1] >= 0.1

        wait_until(settled, 30, "the daemon's CPU time unchanged after its last call")
        before = _cpu_seconds(daemon.pid)
        time.sleep(1.0)  # the idle window is what is tested
        idle = _cpu_seconds(daemon.pid) - before
    print(f"{spinning}: {busy:.2f} cores busy, idle {idle:.3f} s")  # shown with -s
    assert calls > 20
    assert idle <= 0.03, f"an idle daemon took {idle:.2f} s of CPU in 1 s"
    if spinning != "always":
        assert busy < 0.4, f"{busy:.2f} cores busy for a model inferring every 20 ms"
    else:
        assert busy > 0.6, f"only {busy:.2f} cores busy: the spinning this test tells apart"
