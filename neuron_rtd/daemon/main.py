"""`neuron-rtd`: the daemon process.

Owns its devices, serves the wire API on its socket, tells systemd when it is ready,
and on SIGTERM drains, unloads, releases the devices and removes its socket.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import select
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import grpc

import driver_sim
from neuron_rtd import __version__
from neuron_rtd.command_line import entry
from neuron_rtd.daemon import sd
from neuron_rtd.daemon.config import (
    DaemonConfig,
    compile_cache_dir,
    http_options,
    load_config,
    remote_warnings,
    runtime_options,
    socket_gid,
)
from neuron_rtd.daemon.devices import StartupError, select_devices
from neuron_rtd.daemon.flags import parse_args
from neuron_rtd.daemon.fronts import (
    EXIT_FRONT_SILENT,
    Front,
    FrontWatch,
    grpc_front,
    http_front,
)
from neuron_rtd.daemon.listener import (
    ListenError,
    UnixListener,
    bind_also,
    bind_tcp,
    listen_address,
)
from neuron_rtd.daemon.logs import setup_logging
from neuron_rtd.daemon.memory import keep_freed_memory
from neuron_rtd.proto import CHANNEL_OPTIONS
from neuron_rtd.runtime import ComputeGate, Runtime, SimDevice, acquire_sim
from neuron_rtd.server import (
    CallerOf,
    Health,
    MembersOnly,
    PeerSocket,
    ServicerSet,
    Tickets,
    add_servicers,
    server_pool,
)
from neuron_rtd.serving import Serving, ServingError
from neuron_rtd.typed_json import ConfigError

if TYPE_CHECKING:
    from neuron_rtd.server import HttpServer

log = logging.getLogger("nrtd.NRTD")

DRAIN_GRACE_S = 5.0


class Daemon:
    def __init__(self, config: DaemonConfig, *, logs_to_stderr: bool = False) -> None:
        self.config = config
        self.logs_to_stderr = logs_to_stderr  # then a refusal's log line is its only word
        self.address = listen_address(config.server_address)
        self.listener: UnixListener | None = None
        self.peer_socket: PeerSocket | None = None
        self.devices: list[SimDevice] = []
        self.serving: Serving | None = None  # the KServe v2 front ends' core
        self.http: HttpServer | None = None  # the v2 HTTP/REST front end, if asked for
        self.metrics: HttpServer | None = None  # GET /metrics, if asked for
        self.grpc_also: str | None = None  # the TCP HOST:PORT gRPC also listens on, as bound
        self._signals: list[int] = []  # noted by request_stop, logged by the main loop
        self._signals_logged = 0

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM's and SIGINT's handler: it only notes the signal. A handler runs in the
        main thread between two bytecodes, perhaps while that thread holds a lock (an
        Event's, a log handler's): taking one here could deadlock the daemon for good.
        The wakeup fd (see `_serve`) ends the main loop's wait at once."""
        self._signals.append(signum)

    def _log_signals(self) -> None:
        for signum in self._signals[self._signals_logged :]:
            log.info("Received %s", signal.Signals(signum).name, extra={"fn": "SignalHandler"})
            self._signals_logged += 1

    def _serve(self, health: Health) -> None:
        """The main loop, until a signal: the health kept up to date twice a second."""
        wake, woken = socket.socketpair()
        for end in (wake, woken):
            end.setblocking(False)
        previous = signal.set_wakeup_fd(woken.fileno(), warn_on_full_buffer=False)
        try:
            while not self._signals:
                select.select([wake], [], [], 0.5)
                with contextlib.suppress(BlockingIOError):
                    wake.recv(4096)
                health.update()
        finally:
            signal.set_wakeup_fd(previous)
            wake.close()
            woken.close()

    def run(self) -> int:
        try:
            runtime, server, servicers = self._start()
        except (StartupError, ListenError, driver_sim.DriverError, ValueError) as exc:
            log.error("%s", exc, extra={"fn": "RunServer"})
            if not self.logs_to_stderr:
                print(f"neuron-rtd: error: {exc}", file=sys.stderr)
            self._stop_serving()
            self._release()
            return 1
        watchdog = None
        interval = sd.watchdog_interval_s()
        if interval:
            watchdog = sd.Watchdog(interval, healthy=lambda: runtime.responsive(interval))
            watchdog.start()
        fronts = FrontWatch(
            self._fronts(), float(self.config.front_timeout_secs), silent=self._front_silent
        )
        fronts.start()
        self._serve(servicers.health)
        fronts.stop()  # a front drained from now on is not a silent one
        self._log_signals()
        sd.notify("STOPPING=1", "STATUS=Stopping: draining requests")
        log.info("Stopping: draining requests", extra={"fn": "RunServer"})
        runtime.begin_stop()  # every new call told so from now on, the fast lane's too
        servicers.health.drain()
        stopped = server.stop(DRAIN_GRACE_S)  # new calls refused; in-flight ones finish
        self._stop_http()
        servicers.sessions.close()  # clients' session streams would last the whole grace
        servicers.streams.close()  # so would idle request streams: each ends once answered
        stopped.wait()
        if watchdog:
            watchdog.stop()
        self._stop_serving()  # its models are the runtime's: before the runtime goes
        runtime.close()
        self._release()
        self._log_signals()  # a second one, while it drained
        log.info("Stopped", extra={"fn": "RunServer"})
        return 0

    def _fronts(self) -> list[Front]:
        """The fronts the daemon asks itself whether they answer (see `fronts`)."""
        fronts = [grpc_front(self.address.target)]
        if self.http and self.config.http_address:
            host = self.config.http_address.rpartition(":")[0]
            fronts.append(http_front(host, self.http.port))
        if self.metrics and self.config.metrics_address:
            host = self.config.metrics_address.rpartition(":")[0]
            fronts.append(http_front(host, self.metrics.port, "the metrics' server"))
        return fronts

    def _front_silent(self, why: str) -> None:
        """A front stopped answering (its loop, grpcio's or waitress's, ended): exit so
        that systemd starts the daemon again, rather than live on with a dead API. Not a
        drain: the silent front could hold it up for good."""
        message = f"{why}: exiting (status {EXIT_FRONT_SILENT}) to be started again"
        log.critical("%s", message, extra={"fn": "watchdog"})
        sd.notify(f"STATUS={message}")
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        if not self.logs_to_stderr:
            print(f"neuron-rtd: {message}", file=sys.stderr, flush=True)
        os._exit(EXIT_FRONT_SILENT)

    def _start(self) -> tuple[Runtime, grpc.Server, ServicerSet]:
        config = self.config
        sd.notify("STATUS=Starting")
        if self.address.unix_path:
            self.listener = UnixListener(
                self.address.unix_path, mode=config.socket_mode, group=config.socket_group
            )
            self.listener.claim()
        machine = driver_sim.Machine.open(config.sim.root, instance_type=config.sim.instance_type)
        indices = select_devices(machine, config.devices, config.visible_devices)
        compute = ComputeGate()  # the runtime's; its NCs' runs wait their turns through it
        self.devices = acquire_sim(
            machine,
            indices,
            address=self.address.target,
            version=__version__,
            engine=config.nc_engine,
            spinning=config.nc_spinning,
            faults=config.sim.faults,
            take_turn=compute.take_turn,
        )
        runtime = Runtime(self.devices, options=runtime_options(config), compute_gate=compute)
        sd.notify("STATUS=Initializing devices")
        runtime.init_devices()
        # before the gRPC server and the peer socket: a refusal leaves neither behind
        self.serving = self._start_serving(runtime)
        # a TCP port has no mode: who may do more than ask is judged per call
        caller_of = CallerOf(self.address.target)
        gate: list[grpc.ServerInterceptor[Any, Any]] = []
        if not self.listener or config.grpc_address:
            gate.append(MembersOnly(caller_of, socket_gid(config)))
        server = grpc.server(
            server_pool(compute, config.server_threads, "nmgr"),
            interceptors=gate,
            options=[
                *(o for o in CHANNEL_OPTIONS if o[0] != "grpc.max_receive_message_length"),
                ("grpc.max_receive_message_length", config.max_message_mb << 20),
                # a TCP port another server holds is refused, not silently shared with it
                ("grpc.so_reuseport", 0),
            ],
        )
        tickets = Tickets()
        if self.listener:
            path = self.listener.peer_socket_path
            try:
                self.peer_socket = PeerSocket(
                    runtime,
                    tickets,
                    path,
                    mode=config.socket_mode,
                    gid=self.listener.gid(),
                    max_lanes=config.peer_lanes,
                    max_lanes_per_uid=config.peer_lanes_per_user,
                )
            except OSError as exc:
                raise ListenError(f"cannot listen on {path}: {exc.strerror}") from None
        servicers = add_servicers(
            server,
            runtime,
            address=self.address.target,
            sim_root=str(machine.root),
            instance_type=machine.instance_type,
            tickets=tickets,
            peer_socket=str(self.peer_socket.path) if self.peer_socket else "",
            serving=self.serving,
            stream_threads=config.stream_threads,
            session_end_threads=config.session_end_threads,
            caller_of=caller_of,
        )
        if config.grpc_address:  # first: a refusal leaves no socket file behind
            self.grpc_also = bind_also(server, config.grpc_address)
            caller_of.listening(self.grpc_also)
        if self.listener:
            self.listener.bind(server)
        else:
            bind_tcp(server, self.address)
        server.start()
        if self.listener:
            self.listener.finish()
        if self.peer_socket:
            self.peer_socket.start()
        bdfs = ", ".join(d.bdf for d in self.devices)
        log.info("Server listening on %s", self.address.target, extra={"fn": "RunServer"})
        if self.grpc_also:
            log.info("gRPC also listening on %s", self.grpc_also, extra={"fn": "RunServer"})
        for warning in remote_warnings(config):
            log.warning("%s", warning, extra={"fn": "RunServer"})
        if os.geteuid() == 0:
            log.warning(
                "Running as root: shm_map by name and neff_file open what clients name with "
                "root's rights; run as the neuron-rtd user, as the unit does",
                extra={"fn": "RunServer"},
            )
        sd.notify(
            "READY=1",
            f"STATUS=Serving {len(self.devices)} device(s) ({bdfs}) on {self.address.target}",
        )
        return runtime, server, servicers

    def _start_serving(self, runtime: Runtime) -> Serving:
        """The serving core of the KServe v2 front ends, its models loaded, and its HTTP
        front end when asked for. Always made, so that the v2 gRPC service answers health
        and metadata even with no model repository."""
        config = self.config
        repository = Path(config.model_repository) if config.model_repository else None
        if repository is not None and not repository.is_dir():
            raise StartupError(
                f"model repository {repository}: "
                + ("not a folder" if repository.exists() else "no such folder")
            )
        serving = Serving(
            runtime,
            repository=repository,
            control_mode=config.model_control_mode,
            load_models=config.load_models,
            poll_s=float(config.repository_poll_secs),
            compile_cache=compile_cache_dir(config),
            step_threads=config.ensemble_threads,
        )
        self.serving = serving  # closed by run() should what follows fail
        if repository is not None:
            sd.notify("STATUS=Loading the model repository")
        try:
            serving.start(_starting)  # a model that fails to load is logged, not fatal
        except ServingError as exc:
            raise StartupError(f"model repository: {exc.message}") from None
        if config.http_address:
            self.http = self._http(serving, config.http_address, runtime.compute_gate)
        if config.metrics_address:
            self.metrics = self._metrics(serving, runtime, config.metrics_address)
        return serving

    def _http(self, serving: Serving, address: str, gate: ComputeGate) -> HttpServer:
        """The v2 HTTP/REST front end, listening on `address`."""
        from neuron_rtd.server import HttpServer

        try:
            http = HttpServer(
                serving,
                address,
                http_options(self.config),
                compute_gate=gate,
            )
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        try:
            http.start()
        except OSError as exc:
            raise StartupError(f"cannot serve HTTP on {address}: {exc.strerror or exc}") from None
        host = address.rpartition(":")[0]
        log.info("KServe v2 HTTP listening on %s:%d", host, http.port, extra={"fn": "RunServer"})
        return http

    def _metrics(self, serving: Serving, runtime: Runtime, address: str) -> HttpServer:
        """GET /metrics on `address`, served as the HTTP front is (its connections bounded
        and timed alike), by threads of its own."""
        from neuron_rtd.server import HttpOptions, HttpServer, Metrics, MetricsApp

        options = HttpOptions(
            group=socket_gid(self.config),
            header_timeout_s=float(self.config.http_header_timeout_secs),
            max_connections_per_user=self.config.http_max_connections_per_user,
            threads=self.config.metrics_threads,
        )
        app = MetricsApp(Metrics(serving, runtime))
        metrics = HttpServer(serving, address, options, app=app, compute_gate=runtime.compute_gate)
        try:
            metrics.start()
        except OSError as exc:
            raise StartupError(
                f"cannot serve metrics on {address}: {exc.strerror or exc}"
            ) from None
        host = address.rpartition(":")[0]
        log.info("Metrics listening on http://%s:%d/metrics", host, metrics.port,
                 extra={"fn": "RunServer"})  # fmt: skip
        return metrics

    def _stop_http(self) -> None:
        for front in (self.http, self.metrics):
            if front:
                front.stop()
        self.http = self.metrics = None

    def _stop_serving(self) -> None:
        self._stop_http()
        if self.serving:
            self.serving.close()
            self.serving = None

    def _release(self) -> None:
        for device in self.devices:
            device.release()
        self.devices = []
        if self.peer_socket:
            self.peer_socket.close()
            self.peer_socket = None
        if self.listener:
            self.listener.close()


# Each step of a long load at start (an ONNX model's compile) pushes systemd's start
# timeout (TimeoutStartSec) this far on: a repository of models to compile is no hang.
START_STEP_GRACE_US = 300_000_000


def _starting(doing: str) -> None:
    """A load at start tells what it is doing: systemd's status, and more time to start."""
    sd.notify(
        f"STATUS=Loading the model repository: {doing}",
        f"EXTEND_TIMEOUT_USEC={START_STEP_GRACE_US}",
    )


@entry("neuron-rtd")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(path=args.config, instance=args.instance, overrides=vars(args))
    except ConfigError as exc:
        print(f"neuron-rtd: error: {exc}", file=sys.stderr)
        return 2
    sink = setup_logging(config.log_level, console=config.log_console)
    keep_freed_memory()
    daemon = Daemon(config, logs_to_stderr=config.log_console or sink == "stderr")
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    # `kill -USR1`: every thread's stack to stderr (the journal), for a daemon that hangs
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    return daemon.run()


if __name__ == "__main__":
    sys.exit(main())
