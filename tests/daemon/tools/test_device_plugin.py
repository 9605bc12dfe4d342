"""neuron-device-plugin as a process, with this test playing the kubelet from the
generated proto: the Registration service on DIR/kubelet.sock, then a client of each
resource's socket (options, ListAndWatch, GetPreferredAllocation, Allocate); faults put
into the simulated machine turn devices Unhealthy and a reset heals them; a kubelet
restart is followed by a new registration; SIGTERM ends it cleanly.

The figures the docs quote (docs/scale-out.md) are printed: `pytest -s` shows them."""

from __future__ import annotations

import ctypes
import os
import queue
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

import driver_sim
from neuron_rtd.cli import neuron_device_plugin
from neuron_rtd.proto import deviceplugin_pb, deviceplugin_pb_grpc
from neuron_rtd.tools.device_plugin.health import DeviceHealth, Reading
from neuron_rtd.tools.device_plugin.resources import chain_order

NEURONCORE = "aws.amazon.com/neuroncore"
NEURON = "aws.amazon.com/neuron"
ENDPOINTS = {NEURONCORE: "neuron-core.sock", NEURON: "neuron.sock"}
START_S = 30  # bound of the plugin's start (an import of grpc and numpy on a loaded machine)
# The plugin promises to tell a health change within 2 s and to register with a restarted
# kubelet within 5 s (docs/scale-out.md); the tests print what they saw (`pytest -s`) and
# wait for each event at most WAIT_S, a bound only a hang reaches on a loaded machine.
WAIT_S = 30.0
IN_CLOSE_NOWRITE = 0x10  # inotify(7): a file opened for reading was closed


class Kubelet:
    """The kubelet's side of registration: a Registration server on DIR/kubelet.sock that
    keeps every request it is sent."""

    def __init__(self, folder: Path, *, refuse: str | None = None) -> None:
        self.folder = folder
        self.refuse = refuse  # the error every Register is answered with
        self.requests: queue.Queue[tuple[float, Any]] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        deviceplugin_pb_grpc.add_RegistrationServicer_to_server(self._Servicer(self), self.server)
        self.server.add_insecure_port(f"unix:{folder / 'kubelet.sock'}")
        self.server.start()

    class _Servicer(deviceplugin_pb_grpc.RegistrationServicer):
        def __init__(self, kubelet: Kubelet) -> None:
            self.kubelet = kubelet

        def Register(self, request: Any, context: Any) -> Any:
            self.kubelet.requests.put((time.monotonic(), request))
            if self.kubelet.refuse:
                context.abort(grpc.StatusCode.UNKNOWN, self.kubelet.refuse)
            return deviceplugin_pb.Empty()

    def registrations(self, count: int, timeout_s: float) -> list[tuple[float, Any]]:
        """The next `count` Register requests (when each came, and it)."""
        deadline = time.monotonic() + timeout_s
        got = []
        for _ in range(count):
            got.append(self.requests.get(timeout=max(0.0, deadline - time.monotonic())))
        return got

    def stop(self) -> None:
        """Stop as a kubelet restarting does: its socket gone, and the plugins' too (a
        kubelet starting empties the folder)."""
        self.server.stop(0).wait()
        for path in self.folder.iterdir():
            if path.is_socket():
                path.unlink()


class Plugin:
    """The real `neuron-device-plugin` process, its stderr in a file."""

    def __init__(self, work: Path, folder: Path, *args: str, umask: int = -1) -> None:
        self.stderr_path = work / f"plugin-{time.monotonic_ns()}.err"
        env = {**os.environ, "NEURON_SIM_ROOT": str(work / "sim")}
        self.started = time.monotonic()
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "neuron_rtd.cli.neuron_device_plugin",
                    "--device-plugin-path",
                    str(folder),
                    "--runtime-socket",
                    str(work / "run" / "neuron.sock"),
                    *args,
                ],
                stderr=err,
                env=env,
                umask=umask,
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for_line(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.stderr:
            assert self.proc.poll() is None, self.stderr
            assert time.monotonic() < deadline, self.stderr
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


class Watch:
    """A ListAndWatch stream read by a thread: `next()` gives each list sent, as
    {id: health}."""

    def __init__(self, channel: grpc.Channel) -> None:
        stub = deviceplugin_pb_grpc.DevicePluginStub(channel)
        self.call = stub.ListAndWatch(deviceplugin_pb.Empty())
        self.lists: queue.Queue[tuple[float, dict[str, str]]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.lists.put((time.monotonic(), {d.ID: d.health for d in response.devices}))
        except grpc.RpcError:
            pass  # cancelled at the end

    def next(self, timeout_s: float) -> tuple[float, dict[str, str]]:
        return self.lists.get(timeout=timeout_s)

    def close(self) -> None:
        self.call.cancel()


class Node:
    """A node: its simulated inf1.6xlarge, the kubelet stand-in and the plugin."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.folder = work / "device-plugins"
        self.folder.mkdir()
        self.machine = driver_sim.Machine.open(work / "sim")  # made by the daemon, in life
        self.kubelet = Kubelet(self.folder)
        self.plugin = Plugin(work, self.folder)
        self.first_registrations = self.kubelet.registrations(2, START_S)

    def channel(self, resource: str) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.folder / ENDPOINTS[resource]}")

    def stub(self, resource: str) -> Any:
        return deviceplugin_pb_grpc.DevicePluginStub(self.channel(resource))


@pytest.fixture(scope="module")
def node(module_work: Path) -> Iterator[Node]:
    node = Node(module_work)
    yield node
    node.plugin.stop()
    node.kubelet.stop()


def preferred(
    node: Node, resource: str, available: list[int], must: list[int], size: int
) -> list[str]:
    request = deviceplugin_pb.PreferredAllocationRequest(
        container_requests=[
            deviceplugin_pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=[str(i) for i in available],
                must_include_deviceIDs=[str(i) for i in must],
                allocation_size=size,
            )
        ]
    )
    (answer,) = node.stub(resource).GetPreferredAllocation(request, timeout=10).container_responses
    return list(answer.deviceIDs)


def allocate(node: Node, resource: str, ids: list[str]) -> Any:
    request = deviceplugin_pb.AllocateRequest(
        container_requests=[deviceplugin_pb.ContainerAllocateRequest(devices_ids=ids)]
    )
    (answer,) = node.stub(resource).Allocate(request, timeout=10).container_responses
    return answer


# --- registration and the options --------------------------------------------------------


def test_registers_both_resources_with_their_sockets_and_options(node: Node) -> None:
    requests = {r.resource_name: r for _, r in node.first_registrations}
    assert set(requests) == {NEURONCORE, NEURON}
    for name, request in requests.items():
        assert request.version == "v1beta1"
        assert request.endpoint == ENDPOINTS[name]
        assert (node.folder / request.endpoint).is_socket()
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required
    registered_s = max(at for at, _ in node.first_registrations) - node.plugin.started
    print(f"\nfigure: process start to both resources registered: {registered_s:.2f} s")


@pytest.mark.parametrize("resource", [NEURONCORE, NEURON])
def test_options_say_preferred_allocation_is_available(node: Node, resource: str) -> None:
    options = node.stub(resource).GetDevicePluginOptions(deviceplugin_pb.Empty(), timeout=10)
    assert options.get_preferred_allocation_available and not options.pre_start_required


# --- what is offered, and its health -----------------------------------------------------


def test_list_and_watch_offers_every_core_and_device_healthy(node: Node) -> None:
    for resource, count in ((NEURONCORE, 16), (NEURON, 4)):  # inf1.6xlarge: 4 devices x 4 NCs
        with node.channel(resource) as channel:
            watch = Watch(channel)
            _, devices = watch.next(10)
            watch.close()
        assert devices == {str(i): "Healthy" for i in range(count)}


def _wait_for(watch: Watch, wanted: dict[str, str], since: float) -> float:
    """The seconds from `since` to the list `wanted`; no other list may come first."""
    at, devices = watch.next(WAIT_S)
    assert devices == wanted
    return at - since


def wait_read(path: Path, times: int) -> None:
    """Return once `path` has been read (opened for reading, then closed) `times` times
    from now, by anyone: inotify's IN_CLOSE_NOWRITE. Two reads by a poller mean one of
    its looks began after this call."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, os.fsencode(path), IN_CLOSE_NOWRITE) >= 0
        for _ in range(times):  # one event read at a time: queued alike, two would merge
            ready, _, _ = select.select([fd], [], [], WAIT_S)
            assert ready, f"{path} was not read within {WAIT_S:g} s"
            os.read(fd, 4096)
    finally:
        os.close(fd)


def test_ecc_error_and_failed_init_make_a_device_unhealthy_until_a_reset(node: Node) -> None:
    healthy_cores = {str(i): "Healthy" for i in range(16)}
    sick_cores = healthy_cores | {str(i): "Unhealthy" for i in range(4, 8)}
    healthy_devices = {str(i): "Healthy" for i in range(4)}
    sick_devices = healthy_devices | {"1": "Unhealthy"}
    with node.channel(NEURONCORE) as cores_channel, node.channel(NEURON) as devices_channel:
        cores, devices = Watch(cores_channel), Watch(devices_channel)
        assert cores.next(10)[1] == healthy_cores and devices.next(10)[1] == healthy_devices
        # a runtime owns device 1 (its claim is a reset: nothing to tell)
        (device,) = node.machine.acquire([1], address="unix:/t.sock", version="1")
        try:
            # a poll sees the claim first (a claim and an error seen at once: the error
            # would count as before the claim's reset)
            wait_read(node.machine.paths.stats(1), 2)
            since = time.monotonic()
            device.inject("mem_ecc_uncorr=1")
            latency = _wait_for(cores, sick_cores, since)
            _wait_for(devices, sick_devices, since)
            since = time.monotonic()
            device.reset()  # what the runtime's recovery does
            healed = _wait_for(cores, healthy_cores, since)
            _wait_for(devices, healthy_devices, since)

            device.inject("init_fail")
            since = time.monotonic()
            with pytest.raises(driver_sim.InitFailed):
                device.reset()
            _wait_for(cores, sick_cores, since)
            _wait_for(devices, sick_devices, since)
            since = time.monotonic()
            device.reset()
            _wait_for(cores, healthy_cores, since)
            _wait_for(devices, healthy_devices, since)
        finally:
            device.release()
            cores.close()
            devices.close()
    print(f"\nfigure: uncorrectable ECC error to Unhealthy: {latency:.2f} s")
    print(f"figure: reset to Healthy: {healed:.2f} s")
    assert "device 1 (0000:00:1d.0) and its NeuronCores are Unhealthy: an uncorrectable ECC" in (
        node.plugin.stderr
    )


# --- which units to prefer ---------------------------------------------------------------


def test_preferred_cores_are_contiguous_on_the_fewest_devices(node: Node) -> None:
    every = list(range(16))
    assert preferred(node, NEURONCORE, every, [], 4) == ["0", "1", "2", "3"]
    assert preferred(node, NEURONCORE, every, [], 6) == ["0", "1", "2", "3", "4", "5"]
    # a whole device rather than a contiguous run over two
    assert preferred(node, NEURONCORE, [2, 3, 4, 5, 6, 7, 9], [], 4) == ["4", "5", "6", "7"]
    # the tightest fit: device 0 stays whole for the next container
    assert preferred(node, NEURONCORE, [0, 1, 2, 3, 6, 7], [], 2) == ["6", "7"]
    # across devices: neighbours in the chain (1 -- 2), not 2 and 3 far apart
    assert preferred(node, NEURONCORE, [6, 7, 8, 9, 14, 15], [], 3) == ["6", "7", "8"]
    assert preferred(node, NEURONCORE, [6, 7, 8, 12, 13, 14], [], 3) == ["12", "13", "14"]


def test_preferred_cores_hold_the_must_include_ones(node: Node) -> None:
    every = list(range(16))
    assert preferred(node, NEURONCORE, every, [5], 2) == ["4", "5"]
    assert preferred(node, NEURONCORE, every, [3], 2) == ["2", "3"]
    assert preferred(node, NEURONCORE, every, [3, 4], 2) == ["3", "4"]
    assert preferred(node, NEURONCORE, every, [9], 4) == ["8", "9", "10", "11"]
    # far apart: those two, and the nearest other
    assert preferred(node, NEURONCORE, every, [0, 15], 3) == ["0", "1", "15"]


def test_preferred_devices_follow_the_chain(node: Node) -> None:
    assert preferred(node, NEURON, [0, 1, 2, 3], [], 2) == ["0", "1"]
    assert preferred(node, NEURON, [0, 2, 3], [], 2) == ["2", "3"]
    assert preferred(node, NEURON, [0, 1, 2, 3], [2], 2) == ["1", "2"]


@pytest.mark.parametrize(
    ("available", "must", "size", "said"),
    [
        ([0, 1, 99], [], 2, "unknown device id(s) '99'"),
        ([0, 1], [2], 2, "must-include device id(s) 2 are not among the available ones"),
        ([0, 1], [], 3, "an allocation of 3 cannot hold"),
    ],
)
def test_a_bad_preferred_request_is_invalid_argument(
    node: Node, available: list[int], must: list[int], size: int, said: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        preferred(node, NEURONCORE, available, must, size)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in str(caught.value.details())


# --- what a container gets ---------------------------------------------------------------


def test_allocate_cores_sets_the_visible_cores_devices_and_the_daemon_mount(node: Node) -> None:
    runtime = node.work / "run" / "neuron.sock"
    answer = allocate(node, NEURONCORE, ["4", "5", "6", "7"])
    assert dict(answer.envs) == {
        "NEURON_RT_VISIBLE_CORES": "4-7",
        "NEURON_RTD_ADDRESS": f"unix:{runtime}",
    }
    (spec,) = answer.devices
    assert (spec.container_path, spec.permissions) == ("/dev/neuron1", "rw")
    assert spec.host_path == str(node.work / "sim" / "dev" / "neuron1")
    assert Path(spec.host_path).exists()
    (mount,) = answer.mounts
    assert (mount.host_path, mount.container_path) == (str(runtime.parent),) * 2
    assert mount.read_only

    answer = allocate(node, NEURONCORE, ["9", "4", "5"])
    assert answer.envs["NEURON_RT_VISIBLE_CORES"] == "4-5,9"
    assert [d.container_path for d in answer.devices] == ["/dev/neuron1", "/dev/neuron2"]


def test_allocate_devices_sets_the_visible_devices_and_their_cores(node: Node) -> None:
    answer = allocate(node, NEURON, ["2", "3"])
    assert answer.envs["AWS_NEURON_VISIBLE_DEVICES"] == "2-3"
    assert answer.envs["NEURON_RT_VISIBLE_CORES"] == "8-15"
    assert [d.container_path for d in answer.devices] == ["/dev/neuron2", "/dev/neuron3"]


def test_allocate_of_an_unknown_id_is_invalid_argument(node: Node) -> None:
    for resource, ids in ((NEURONCORE, ["3", "16"]), (NEURON, ["nc-1"])):
        with pytest.raises(grpc.RpcError) as caught:
            allocate(node, resource, ids)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = str(caught.value.details())
        assert f"unknown device id(s) {ids[-1]!r} for {resource}" in details, details


# --- the kubelet restarts ----------------------------------------------------------------


def test_a_restarted_kubelet_is_registered_with_again(node: Node) -> None:
    node.kubelet.stop()
    node.kubelet = Kubelet(node.folder)
    since = time.monotonic()
    again = node.kubelet.registrations(2, WAIT_S)
    assert {r.resource_name for _, r in again} == {NEURONCORE, NEURON}
    took = max(at for at, _ in again) - since
    with node.channel(NEURONCORE) as channel:  # served again on a new socket
        watch = Watch(channel)
        assert len(watch.next(10)[1]) == 16
        watch.close()
    print(f"\nfigure: kubelet restart to both resources registered again: {took:.2f} s")


# --- start without a kubelet, stop, bad flags --------------------------------------------


def test_waits_for_the_kubelet_then_stops_cleanly_at_sigterm(work: Path) -> None:
    driver_sim.Machine.open(work / "sim")
    folder = work / "dp"
    folder.mkdir()
    plugin = Plugin(work, folder)
    try:
        plugin.wait_for_line(
            f"waiting for the kubelet: no socket at {folder}/kubelet.sock", START_S
        )
        kubelet = Kubelet(folder)
        kubelet.registrations(2, WAIT_S)
        assert (folder / "neuron-core.sock").is_socket() and (folder / "neuron.sock").is_socket()
        assert plugin.stop() == 0
        assert not (folder / "neuron-core.sock").exists() and not (folder / "neuron.sock").exists()
        assert plugin.stderr.count("waiting for the kubelet") == 1
        assert "Traceback" not in plugin.stderr and "stopped" in plugin.stderr
        kubelet.stop()
    finally:
        plugin.stop()


def test_its_sockets_are_the_kubelets_alone_whatever_the_umask(work: Path) -> None:
    """Issue 38, point 12: under umask 0 the sockets were made 0777 (any local user could
    call Allocate). Each is made 0600 whatever the umask: the kubelet (root) calls it."""
    driver_sim.Machine.open(work / "sim")
    folder = work / "dp"
    folder.mkdir()
    kubelet = Kubelet(folder)
    plugin = Plugin(work, folder, umask=0)
    try:
        kubelet.registrations(2, START_S)
        for name in ENDPOINTS.values():
            mode = (folder / name).stat().st_mode
            assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
        options = deviceplugin_pb_grpc.DevicePluginStub(
            grpc.insecure_channel(f"unix:{folder / ENDPOINTS[NEURON]}")
        ).GetDevicePluginOptions(deviceplugin_pb.Empty(), timeout=10)
        assert options.get_preferred_allocation_available  # its owner still calls it
        assert plugin.stop() == 0
    finally:
        plugin.stop()
        kubelet.stop()


def test_a_refused_registration_ends_the_plugin_with_the_kubelets_reason(work: Path) -> None:
    driver_sim.Machine.open(work / "sim")
    folder = work / "dp"
    folder.mkdir()
    kubelet = Kubelet(folder, refuse="Requested device plugin version not supported")
    plugin = Plugin(work, folder)
    try:
        assert plugin.proc.wait(timeout=START_S) == 1
        assert "error: the kubelet at" in plugin.stderr
        assert "refused aws.amazon.com/neuroncore: Requested device plugin version" in (
            plugin.stderr
        )
        assert "Traceback" not in plugin.stderr
        assert not (folder / "neuron-core.sock").exists()
    finally:
        plugin.stop()
        kubelet.stop()


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--runtime-socket", "/run/neuron.sock"], 2, "put the daemon's socket in a folder"),
        (["--runtime-socket", "localhost:8080"], 2, "is not a socket path"),
        (["--device-plugin-path", "/etc/hostname"], 2, "is not a folder"),
        (["--instance-type", "inf1.xlarge"], 1, "is an inf1.6xlarge, not the inf1.xlarge"),
    ],
)
def test_bad_flags_and_the_wrong_machine_say_what_is_wrong(
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    said: str,
) -> None:
    driver_sim.Machine.open(work / "sim")
    monkeypatch.setenv("NEURON_SIM_ROOT", str(work / "sim"))
    assert neuron_device_plugin.main(["--device-plugin-path", str(work), *args]) == code
    err = capsys.readouterr().err
    assert err.startswith("neuron-device-plugin: error: ") and said in err, err


# --- in process: the health judgement and the chain order --------------------------------


def test_health_judges_by_what_changed_since_the_last_reset() -> None:
    first = Reading(present=True, epoch=1, uncorrectable=5, init_failures=2)
    health = DeviceHealth(first)  # what was counted before the plugin started is past
    assert health.update(first) is None
    assert "ECC" in str(health.update(replace(first, uncorrectable=6)))
    assert health.update(Reading(present=True, epoch=2, uncorrectable=6, init_failures=2)) is None
    # a failed reset: its new epoch may be read before the failure is counted
    assert health.update(Reading(present=True, epoch=3, uncorrectable=6, init_failures=2)) is None
    failed = Reading(present=True, epoch=3, uncorrectable=6, init_failures=3)
    assert "failed to initialize" in str(health.update(failed))
    # ... or with it, in one read
    assert health.update(replace(failed, epoch=4)) is None
    assert "failed to initialize" in str(health.update(replace(failed, epoch=5, init_failures=4)))
    assert health.update(replace(failed, epoch=6, init_failures=4)) is None
    assert "gone" in str(health.update(Reading(present=False)))


def test_the_chain_order_follows_the_links_not_the_indices() -> None:
    assert chain_order([(1,), (0, 2), (1, 3), (2,)]) == [0, 1, 2, 3]
    assert chain_order([(2,), (3,), (0, 3), (2, 1)]) == [0, 2, 3, 1]
    assert chain_order([()]) == [0]
    assert chain_order([(1, 2), (0, 2), (0, 1)]) == [0, 1, 2]  # a ring: from device 0
