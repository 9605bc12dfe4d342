"""The standard gRPC health service and server reflection on the real daemon: SERVING once
the devices are up, NOT_SERVING while their init fails and from the start of the drain;
reflection lists and describes our services to a client without the .proto files."""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

import driver_sim
from neuron_rtd.cli.spawn import DaemonProcess
from neuron_rtd.proto import CHANNEL_OPTIONS

pytestmark = pytest.mark.daemon

OURS = ["nrt.ext.nmgr_ext", "nrt.nmgr_session_manager", "nrt.nmgr_stream", "nrt.nmgr_v1"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WAIT_S = 30  # bound of every wait for a status: a loaded machine is slow, never this slow


def check(channel: grpc.Channel, service: str = "") -> Any:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


class Watcher:
    """A health Watch stream read by a thread: `next_status()` gives each status sent."""

    def __init__(self, channel: grpc.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        self.call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        self.statuses: queue.Queue[int | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.statuses.put(response.status)
        except grpc.RpcError:
            pass
        self.statuses.put(None)  # the stream ended

    def next_status(self) -> int | None:
        try:
            return self.statuses.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"no health status within {WAIT_S} s")


@pytest.fixture
def own_daemon(work: Path) -> Iterator[DaemonProcess]:
    with DaemonProcess(sim_root=work / "sim", args=["-t", "0000:00:1c.0"]) as proc:
        yield proc


def test_serving_for_the_server_and_each_service(channel: grpc.Channel) -> None:
    assert check(channel) == SERVING
    for service in OURS:
        assert check(channel, service) == SERVING, service
    with pytest.raises(grpc.RpcError) as caught:
        check(channel, "nrt.no_such_service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_our_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert set(OURS) | {"grpc.health.v1.Health"} <= services
    pool = descriptor_pool.DescriptorPool(database)
    load = pool.FindServiceByName("nrt.nmgr_v1").FindMethodByName("load")
    assert (load.input_type.full_name, load.client_streaming) == ("nrt.load_request", True)
    params = pool.FindMessageTypeByName("nrt.model_params")
    assert params.fields_by_name["enable_node_profiling"].number == 6
    snapshot = pool.FindServiceByName("nrt.ext.nmgr_ext").FindMethodByName("snapshot")
    assert snapshot.output_type.full_name == "nrt.ext.snapshot_response"


def test_not_serving_while_device_init_fails_then_serving(work: Path) -> None:
    machine = driver_sim.Machine.open(work / "sim")
    (machine.root / "neuron0" / "inject").write_text("init_fail\n")  # the first init fails
    with (
        DaemonProcess(sim_root=work / "sim", args=["-t", "0000:00:1c.0"]) as proc,
        grpc.insecure_channel(proc.address, options=CHANNEL_OPTIONS) as channel,
    ):
        watcher = Watcher(channel)
        statuses = [watcher.next_status()]
        while statuses[-1] == NOT_SERVING:  # until the init is tried again, and works
            statuses.append(watcher.next_status())
        assert statuses[0] == NOT_SERVING and statuses[-1] == SERVING, statuses
        assert check(channel) == SERVING
        watcher.call.cancel()
        assert "initialization failed" in proc.log()


def test_the_drain_says_not_serving_and_ends_the_watches(own_daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(own_daemon.address, options=CHANNEL_OPTIONS) as channel:
        watcher = Watcher(channel)
        assert watcher.next_status() == SERVING
        assert own_daemon.proc is not None
        own_daemon.proc.send_signal(signal.SIGTERM)
        assert watcher.next_status() == NOT_SERVING
        assert watcher.next_status() is None  # the stream ends: it does not hold the drain
        assert own_daemon.proc.wait(WAIT_S) == 0
    assert "Stopped" in own_daemon.log()
