"""The plugin's life beside the kubelet: serve each resource on its socket, register it,
and start over when the kubelet restarts.

    wait for the machine (neuron-rtd makes its tree) and for DIR/kubelet.sock
    -> serve DIR/neuron-core.sock and DIR/neuron.sock -> Register each resource
    -> watch: kubelet.sock made again (another inode or change time), or gone, or one of
       our sockets removed (a starting kubelet empties the folder) -> stop serving, again

The health board polls the devices all along, across restarts. `run` runs until
cancelled (the command cancels it at SIGTERM or SIGINT); its sockets go with it. A kubelet
that is not there or does not answer yet is waited for, told in one line per wait; a
kubelet that refuses a registration (another plugin has the resource, an unknown version)
ends the run with `RegistrationRefused`, as the API asks of a refused plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

import driver_sim
from neuron_rtd.proto import DEVICE_PLUGIN_VERSION, deviceplugin_pb, deviceplugin_pb_grpc
from neuron_rtd.tools.device_plugin.health import POLL_S, HealthBoard
from neuron_rtd.tools.device_plugin.resources import Resource, resources_of
from neuron_rtd.tools.device_plugin.servicer import OPTIONS, ContainerSetup, DevicePluginServicer

KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
# The kubelet (root) is the only one to call a resource's socket: no one else may.
SOCKET_MODE = 0o600
WATCH_S = 0.25  # how often the sockets are looked at: a restart is seen within this
RETRY_S = 1.0  # between tries while the kubelet (or the machine) is not there yet
REGISTER_TIMEOUT_S = 5.0
STOP_GRACE_S = 0.2  # for calls in progress when a server stops (streams are cut)

Log = Callable[[str], None]


class PluginError(Exception):
    """The plugin cannot run (a bad machine, a file in its sockets' way): exit 1."""


class RegistrationRefused(PluginError):
    """The kubelet answered a Register with an error."""


@dataclass(frozen=True, kw_only=True)
class PluginConfig:
    """What `neuron-device-plugin` was told (see its --help)."""

    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    runtime_socket: Path
    device_specs: bool = True
    sim_root: Path | None = None  # None: driver_sim's default root ($NEURON_SIM_ROOT)
    instance_type: str | None = None
    poll_s: float = POLL_S

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET


Identity = tuple[int, int]  # a socket file's inode and change time: another when made again


def _identity(path: Path) -> Identity | None:
    """The socket at `path`, or None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_ctime_ns) if stat.S_ISSOCK(info.st_mode) else None


@dataclass
class Endpoint:
    """A resource served on its socket."""

    resource: Resource
    path: Path
    server: grpc.aio.Server
    identity: Identity | None


async def run(config: PluginConfig, log: Log) -> None:
    """Serve and register until cancelled (see the module doc)."""
    machine = await _machine(config, log)
    board = HealthBoard(machine, log, poll_s=config.poll_s)
    resources = resources_of(machine)
    setup = ContainerSetup(
        runtime_socket=config.runtime_socket, device_specs=config.device_specs, machine=machine
    )
    log(
        f"offering the {machine.instance_type} at {machine.root}: "
        + ", ".join(f"{len(r.units)} x {r.name}" for r in resources)
    )
    watcher = asyncio.create_task(board.watch())
    try:
        while True:
            kubelet = await _kubelet(config, log)
            endpoints = await _serve(resources, board, setup, config.plugin_dir)
            try:
                if await _register(config, endpoints, kubelet, log):
                    await _until_restart(config, endpoints, kubelet, log)
            finally:
                await _stop_serving(endpoints)
    finally:
        watcher.cancel()


async def _machine(config: PluginConfig, log: Log) -> driver_sim.Machine:
    """The simulated machine, once its tree is there (the daemon makes it)."""
    waiting = False
    while True:
        try:
            root = config.sim_root or driver_sim.default_sim_root()
            return driver_sim.Machine.open(root, instance_type=config.instance_type, create=False)
        except driver_sim.NoMachine as exc:
            if not waiting:
                log(f"{exc} yet: waiting for neuron-rtd to make it (retrying every {RETRY_S:g} s)")
                waiting = True
        except (driver_sim.DriverError, ValueError, OSError) as exc:
            raise PluginError(str(exc)) from None
        await asyncio.sleep(RETRY_S)


async def _kubelet(config: PluginConfig, log: Log) -> Identity:
    """The kubelet's socket, once it is there."""
    waiting = False
    while (kubelet := _identity(config.kubelet_socket)) is None:
        if not waiting:
            log(f"waiting for the kubelet: no socket at {config.kubelet_socket} yet")
            waiting = True
        await asyncio.sleep(WATCH_S)
    return kubelet


async def _serve(
    resources: tuple[Resource, ...], board: HealthBoard, setup: ContainerSetup, folder: Path
) -> list[Endpoint]:
    """Each resource served on its socket in `folder` (a stale socket there replaced)."""
    endpoints: list[Endpoint] = []
    try:
        for resource in resources:
            path = folder / resource.endpoint
            _clear(path)
            server = grpc.aio.server()
            deviceplugin_pb_grpc.add_DevicePluginServicer_to_server(
                DevicePluginServicer(resource, board, setup), server
            )
            old = os.umask(0o777 & ~SOCKET_MODE)  # made with its mode, never the umask's
            try:
                port = server.add_insecure_port(f"unix:{path}")
            finally:
                os.umask(old)
            if not port:
                raise PluginError(f"cannot listen on {path}: is {folder} writable by this user?")
            await server.start()
            os.chmod(path, SOCKET_MODE)
            endpoints.append(Endpoint(resource, path, server, _identity(path)))
    except BaseException:
        await _stop_serving(endpoints)
        raise
    return endpoints


def _clear(path: Path) -> None:
    """Remove a socket left at `path` (by an earlier run); anything else is in the way."""
    if _identity(path) is not None:
        path.unlink(missing_ok=True)
    elif path.exists() or path.is_symlink():
        raise PluginError(
            f"{path} is in the way of this plugin's socket and is not a socket: remove it"
        )


async def _stop_serving(endpoints: list[Endpoint]) -> None:
    """Stop the servers; remove their sockets (those still theirs)."""
    for endpoint in endpoints:
        await endpoint.server.stop(STOP_GRACE_S)
        if endpoint.identity is not None and _identity(endpoint.path) == endpoint.identity:
            with contextlib.suppress(FileNotFoundError):
                endpoint.path.unlink()


async def _register(
    config: PluginConfig,
    endpoints: list[Endpoint],
    kubelet: Identity,
    log: Log,
) -> bool:
    """Register every endpoint with the kubelet; False when the kubelet's socket went or
    was made again meanwhile (start over). A kubelet that does not answer is asked again
    every RETRY_S; one that refuses raises RegistrationRefused."""
    waiting = False
    pending = list(endpoints)
    async with grpc.aio.insecure_channel(f"unix:{config.kubelet_socket}") as channel:
        stub = deviceplugin_pb_grpc.RegistrationStub(channel)
        while pending:
            endpoint = pending[0]
            request = deviceplugin_pb.RegisterRequest(
                version=DEVICE_PLUGIN_VERSION,
                endpoint=endpoint.path.name,
                resource_name=endpoint.resource.name,
                options=OPTIONS,
            )
            try:
                await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise RegistrationRefused(
                        f"the kubelet at {config.kubelet_socket} refused "
                        f"{endpoint.resource.name}: {exc.details()}"
                    ) from None
                if not waiting:
                    log(
                        f"the kubelet at {config.kubelet_socket} does not answer "
                        f"({exc.details()}): asking again every {RETRY_S:g} s"
                    )
                    waiting = True
                await asyncio.sleep(RETRY_S)
                if _identity(config.kubelet_socket) != kubelet:
                    return False
                continue
            pending.pop(0)
            log(
                f"registered {endpoint.resource.name} ({len(endpoint.resource.units)} units, "
                f"served on {endpoint.path}) with the kubelet at {config.kubelet_socket}"
            )
    return True


async def _until_restart(
    config: PluginConfig, endpoints: list[Endpoint], kubelet: Identity, log: Log
) -> None:
    """Returns when the kubelet restarted (or went), telling what was seen."""
    while True:
        await asyncio.sleep(WATCH_S)
        now = _identity(config.kubelet_socket)
        if now != kubelet:
            seen = "made again" if now is not None else "gone"
            log(f"{config.kubelet_socket} is {seen} (the kubelet restarted): registering again")
            return
        for endpoint in endpoints:
            if _identity(endpoint.path) != endpoint.identity:
                log(f"{endpoint.path} was removed (the kubelet restarted): registering again")
                return
