"""The daemon's configuration: a JSON file, then `NEURON_RTD_ADDRESS` (the address only, as
the clients read it) and `AWS_NEURON_VISIBLE_DEVICES` (the devices, by index, where the
file and `-t` name none), then the command-line flags over them.

Built once in `main()`; everything below receives a `DaemonConfig`, never the raw file.

The file decides what the daemon serves and to whom, so it must be as trusted as the
daemon: owned by root or by the daemon's own user, and writable by no one else (a group
that is its owner's private group, Debian's user groups, counts as the owner). A TCP
address outside loopback serves the API unencrypted to the network: it takes
`allow_remote_clients`, and the daemon warns of it as it starts; so does an
`http_address` (the KServe v2 HTTP/REST front end) outside loopback. The HTTP front's
bearer token (`http_token_file`) is read from a file as trusted as the config, which
others may not read either.
"""

from __future__ import annotations

import grp
import ipaddress
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from driver_sim.faults import FAULTS_ENV
from driver_sim.presets import SIM_ROOT_ENV
from neuron_rtd.client.address import ADDRESS_ENV, DEFAULT_ADDRESS
from neuron_rtd.daemon.listener import ListenError, listen_address
from neuron_rtd.daemon.trusted_files import check_config_file, read_http_token
from neuron_rtd.errors import InvalidError
from neuron_rtd.onnxrt import WHILE_BUSY, check_spinning
from neuron_rtd.runtime import RuntimeOptions, nc_engine
from neuron_rtd.typed_json import ConfigError, Expected, check_object
from neuron_rtd.visible import DEVICES_ENV, visible_devices

DEFAULT_CONFIG = Path("/etc/neuron-rtd/neuron-rtd.json")
INSTANCE_CONFIG_DIR = Path("/etc/neuron-rtd/instances")
LOG_LEVELS = ("error", "warning", "info", "debug")
MODEL_CONTROL_MODES = ("none", "explicit", "poll")  # as Triton's --model-control-mode


# The addresses beside the daemon's own, each HOST:PORT on loopback unless
# allow_remote_clients, and what anyone who reaches one could do
LOCAL_ONLY = {
    "http_address": "run, load and unload models and read and write tensors",
    "grpc_address": "load models and read and write tensors",
    "metrics_address": "read the served models' names and counts",
}
SERVED_ON = {
    "http_address": "the KServe v2 HTTP API",
    "grpc_address": "the gRPC API",
    "metrics_address": "the metrics",
}


# What a field's metadata may say: the environment variable it is read from (see
# `environment`), and that the file may not set it.
ENV = "env"
NOT_IN_FILE = {"file": False}
NC_ENGINE_ENV = "NEURON_RTD_NC_ENGINE"  # under the file's nc_engine
NC_SPINNING_ENV = "NEURON_RTD_NC_SPINNING"
HOST_THREADS_ENV = "NEURON_RTD_HOST_THREADS"


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    instance_type: str = "inf1.6xlarge"
    # None: driver_sim's default; $NEURON_SIM_ROOT overrides
    root: str | None = field(default=None, metadata={ENV: SIM_ROOT_ENV})
    # faults injected at start ($NEURON_SIM_FAULTS, driver_sim.faults' syntax), never from the file
    faults: str = field(default="", metadata={ENV: FAULTS_ENV, **NOT_IN_FILE})


@dataclass(frozen=True, kw_only=True)
class DaemonConfig:
    """Every setting of the daemon: each field a key of the file unless its metadata says
    otherwise, the file's types read off the fields' (`file_types`)."""

    server_address: str = field(default=DEFAULT_ADDRESS, metadata={ENV: ADDRESS_ENV})
    allow_remote_clients: bool = False  # a TCP server_address outside loopback
    devices: tuple[str, ...] = ()  # BDFs; empty: every device of the machine
    # device indices from $AWS_NEURON_VISIBLE_DEVICES (None: unset), never from the file
    visible_devices: frozenset[int] | None = field(
        default=None, metadata={ENV: DEVICES_ENV, **NOT_IN_FILE}
    )
    default_timeout: int = 2  # seconds one inference may take
    default_ninfer: int = 4  # in-flight inferences per model
    shmem_enabled: bool = True
    shm_read_threads: int = 0  # one large shm read split over this many (0: 2-4, the cores)
    model_cache_count: int = 4  # models one NCG may hold (1 running, rest STANDBY); 0: any
    # the file's, else $NEURON_RTD_NC_ENGINE, else fast (None only until `environment`)
    nc_engine: str | None = field(default=None, metadata={ENV: NC_ENGINE_ENV})
    # how the fast engine's threads wait for work ($NEURON_RTD_NC_SPINNING), never from the file
    nc_spinning: str = field(default=WHILE_BUSY, metadata={ENV: NC_SPINNING_ENV, **NOT_IN_FILE})
    # onnxruntime threads of one CPU node ($NEURON_RTD_HOST_THREADS; 0: the usable cores),
    # never from the file; CPU nodes at once: the usable cores / this (see runtime/host.py)
    host_threads: int = field(default=0, metadata={ENV: HOST_THREADS_ENV, **NOT_IN_FILE})
    log_level: str = "info"
    log_console: bool = field(default=False, metadata=NOT_IN_FILE)  # -x
    socket_group: str | None = None
    socket_mode: int = field(default=0o660, metadata={"file_type": str})  # "0660" in the file
    server_threads: int = 16  # gRPC unary call threads at most (server/pool.py)
    stream_threads: int = 64  # stream requests worked on at once, each kind (loads; infers)
    http_threads: int = 16  # the HTTP front's workers (requests running at once)
    metrics_threads: int = 2  # the metrics address's workers (scrapes answered at once)
    ensemble_threads: int = 16  # ensembles' steps run at once beside their requests' own
    peer_lanes: int = 256  # fast lanes on the peer socket, a thread each
    peer_lanes_per_user: int = 64  # of them, one user's
    session_end_threads: int = 2  # ended sessions released at once (models unloaded, NCGs)
    front_timeout_secs: int = 60  # a front silent this long to the daemon's own asks: exit
    neff_file_dirs: tuple[str, ...] = ("/",)  # where `neff_file` loads may read
    max_message_mb: int = 256  # the largest request the daemon reads (inline tensors)
    session_max_ncs: int = 0  # what one session may hold at once (0: any)
    session_max_models: int = 64
    session_max_shm_maps: int = 256
    session_max_inflight: int = 1024
    session_max_open: int = 4096
    session_max_per_peer: int = 1024
    model_repository: str | None = None  # Triton's layout: DIR/NAME/VERSION/model.neff
    model_control_mode: str = "none"  # none, explicit or poll
    load_models: tuple[str, ...] = ()  # loaded at start in explicit mode ("*": all)
    repository_poll_secs: int = 15  # poll mode: how often the repository is read again
    # where ONNX models' compiled NEFFs are kept (None: `compile_cache_dir`'s default)
    compile_cache_dir: str | None = None
    http_address: str | None = None  # the KServe v2 HTTP/REST front end's HOST:PORT; off
    grpc_address: str | None = None  # the gRPC services also on this TCP HOST:PORT; off
    metrics_address: str | None = None  # GET /metrics (Triton's names) on HOST:PORT; off
    http_token_file: str | None = None  # a bearer token that makes its bearer a member
    http_max_body_mb: int = 64  # the largest HTTP request body taken, inflated or not
    http_header_timeout_secs: int = 15  # a request's headers must be in within this
    http_max_connections_per_user: int = 256  # open HTTP connections of one uid
    instance: str | None = field(default=None, metadata=NOT_IN_FILE)  # -i
    sim: SimConfig = field(default_factory=SimConfig)


def runtime_options(config: DaemonConfig) -> RuntimeOptions:
    """The runtime's options: the config's fields of the same names (a field the runtime
    has and the config does not keeps the runtime's default)."""
    ours = {f.name for f in fields(DaemonConfig)}
    return RuntimeOptions(
        **{f.name: getattr(config, f.name) for f in fields(RuntimeOptions) if f.name in ours}
    )


def _file_type(hint: Any) -> Expected:
    """What a JSON value of a field typed `hint` may be."""
    if typing.get_origin(hint) is tuple:
        return list
    if isinstance(hint, types.UnionType):
        return tuple(typing.cast(type, _file_type(arg)) for arg in typing.get_args(hint))
    if is_dataclass(hint):
        return dict
    return typing.cast(type, hint)


def file_types(cls: type) -> dict[str, Expected]:
    """The file's keys for dataclass `cls` and what each may be, from its fields."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: f.metadata.get("file_type", _file_type(hints[f.name]))
        for f in fields(cls)
        if f.metadata.get("file", True)
    }


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            check_config_file(path, os.fstat(file.fileno()))  # the file read, not its name
            text = file.read().decode()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    check_object(data, str(path), file_types(DaemonConfig), comments=True)
    check_object(data.get("sim", {}), f"{path}: sim", file_types(SimConfig), comments=True)
    return data


def config_from_dict(data: dict[str, Any], where: str = "config") -> DaemonConfig:
    values = {k: v for k, v in data.items() if not k.startswith("_") and k != "sim"}
    for key, kind in file_types(DaemonConfig).items():
        if kind is list and key in values:
            values[key] = tuple(values[key])
    if "socket_mode" in values:
        try:
            values["socket_mode"] = int(values["socket_mode"], 8)
        except ValueError:
            raise ConfigError(
                f'{where}: socket_mode must be octal like "0660", got {values["socket_mode"]}'
            ) from None
    sim = {k: v for k, v in data.get("sim", {}).items() if not k.startswith("_")}
    return validate(DaemonConfig(**values, sim=SimConfig(**sim)), where)


def validate(config: DaemonConfig, where: str = "config") -> DaemonConfig:
    """`config` checked, its server_address as gRPC names it (`unix:/absolute/path` for
    any socket path); ConfigError naming `where` for the first wrong value."""
    try:
        address = listen_address(config.server_address)
    except ListenError as exc:
        raise ConfigError(f"{where}: server_address: {exc}") from None
    config = replace(config, server_address=address.target)
    if config.default_timeout < 1:
        raise ConfigError(f"{where}: default_timeout must be at least 1 second")
    if config.default_ninfer < 1:
        raise ConfigError(f"{where}: default_ninfer must be at least 1")
    if config.model_cache_count < 0:
        raise ConfigError(f"{where}: model_cache_count must not be negative")
    try:
        if config.nc_engine is not None:
            nc_engine(config.nc_engine)
    except ValueError as exc:
        raise ConfigError(f"{where}: nc_engine: {exc}") from None
    if config.server_threads < 2:
        raise ConfigError(f"{where}: server_threads must be at least 2")
    pools = ("stream_threads", "http_threads", "metrics_threads", "ensemble_threads")
    for pool in (*pools, "peer_lanes", "peer_lanes_per_user", "session_end_threads"):
        if getattr(config, pool) < 1:
            raise ConfigError(f"{where}: {pool} must be at least 1")
    if not 0 <= config.shm_read_threads <= 64:
        raise ConfigError(f"{where}: shm_read_threads must be between 0 (the cores') and 64")
    if not 4 <= config.front_timeout_secs <= 3600:
        raise ConfigError(f"{where}: front_timeout_secs must be between 4 and 3600")
    if config.log_level not in LOG_LEVELS:
        raise ConfigError(f"{where}: log_level must be one of {', '.join(LOG_LEVELS)}")
    if config.socket_mode & 0o002 or config.socket_mode & ~0o777:
        raise ConfigError(
            f"{where}: socket_mode {config.socket_mode:04o} is world-writable or not a mode"
        )
    if not all(isinstance(d, str) for d in config.devices):
        raise ConfigError(f"{where}: devices must be a list of PCI BDF strings")
    if not 1 <= config.max_message_mb <= 2047:  # gRPC's limit is a signed 32-bit size
        raise ConfigError(f"{where}: max_message_mb must be between 1 and 2047")
    quotas = ("session_max_ncs", "session_max_models", "session_max_shm_maps")
    for quota in (*quotas, "session_max_inflight", "session_max_open", "session_max_per_peer"):
        if getattr(config, quota) < 0:
            raise ConfigError(f"{where}: {quota} must not be negative (0: no limit)")
    if not all(isinstance(d, str) and os.path.isabs(d) for d in config.neff_file_dirs):
        raise ConfigError(f"{where}: neff_file_dirs must be a list of absolute folder paths")
    # symbolic links resolved once, here: the runtime compares real paths
    real = tuple(os.path.realpath(d) for d in config.neff_file_dirs)
    config = replace(config, neff_file_dirs=real)
    host = tcp_host(config.server_address)
    if host is not None and not loopback(host) and not config.allow_remote_clients:
        raise ConfigError(
            f"{where}: server_address {config.server_address} is not a loopback address: "
            "anyone who reaches it could use the daemon, over unencrypted gRPC; set "
            '"allow_remote_clients": true in the config (or --allow-remote-clients) to mean '
            "it, or listen on "
            "127.0.0.1:PORT or a unix:/path"
        )
    return validate_serving(config, where)


def validate_serving(config: DaemonConfig, where: str) -> DaemonConfig:
    """The model repository's and the KServe v2 front ends' settings checked (see
    `validate`); the repository's path made absolute."""
    if config.model_control_mode not in MODEL_CONTROL_MODES:
        raise ConfigError(
            f"{where}: model_control_mode must be one of {', '.join(MODEL_CONTROL_MODES)}, "
            f"got {config.model_control_mode!r}"
        )
    if config.model_repository is not None:
        if not config.model_repository:
            raise ConfigError(f"{where}: model_repository must be a folder's path")
        config = replace(config, model_repository=os.path.abspath(config.model_repository))
    elif config.model_control_mode != "none":
        raise ConfigError(
            f"{where}: model_control_mode {config.model_control_mode} needs a "
            "model_repository (--model-repository DIR)"
        )
    if not all(isinstance(n, str) and n for n in config.load_models):
        raise ConfigError(f"{where}: load_models must be a list of model names")
    config = replace(config, load_models=tuple(config.load_models))
    if config.load_models and config.model_control_mode != "explicit":
        raise ConfigError(
            f"{where}: load_models (--load-model) names the models to load at start in "
            f"model_control_mode explicit, not {config.model_control_mode}: in none and "
            "poll every model of the repository is loaded"
        )
    if config.repository_poll_secs < 1:
        raise ConfigError(f"{where}: repository_poll_secs must be at least 1 second")
    if config.compile_cache_dir is not None:
        if not config.compile_cache_dir:
            raise ConfigError(f"{where}: compile_cache_dir must be a folder's path")
        config = replace(config, compile_cache_dir=os.path.abspath(config.compile_cache_dir))
    for key, who in LOCAL_ONLY.items():
        address = getattr(config, key)
        if address is None:
            continue
        host = http_host(address, where, key)
        if not loopback(host) and not config.allow_remote_clients:
            raise ConfigError(
                f"{where}: {key} {address} is not a loopback address: anyone who reaches it "
                f"could {who}, in plaintext; set "
                '"allow_remote_clients": true in the config (or --allow-remote-clients) to mean '
                "it, or listen on "
                "127.0.0.1:PORT"
            )
    if config.grpc_address is not None and config.grpc_address == config.server_address:
        raise ConfigError(
            f"{where}: grpc_address {config.grpc_address} is server_address already: the "
            "daemon's gRPC listens there anyway; give grpc_address another port, or drop it"
        )
    if config.http_token_file is not None and not os.path.isabs(config.http_token_file):
        raise ConfigError(f"{where}: http_token_file must be an absolute file path")
    if not 1 <= config.http_max_body_mb <= 2047:
        raise ConfigError(f"{where}: http_max_body_mb must be between 1 and 2047")
    if not 1 <= config.http_header_timeout_secs <= 3600:
        raise ConfigError(f"{where}: http_header_timeout_secs must be between 1 and 3600")
    if config.http_max_connections_per_user < 1:
        raise ConfigError(f"{where}: http_max_connections_per_user must be at least 1")
    return config


def compile_cache_dir(config: DaemonConfig) -> Path:
    """The compile cache's folder: the config's `compile_cache_dir`, else the unit's state
    folder (`$STATE_DIRECTORY`, systemd's StateDirectory=), else
    /var/lib/neuron-rtd/compile-cache for root, else the user's cache folder
    (`$XDG_CACHE_HOME`, ~/.cache) under neuron-rtd/compile-cache."""
    if config.compile_cache_dir:
        return Path(config.compile_cache_dir)
    state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state)
    if os.geteuid() == 0:
        return Path("/var/lib/neuron-rtd/compile-cache")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "neuron-rtd" / "compile-cache"


def socket_gid(config: DaemonConfig) -> int:
    """The group the daemon's socket is given: `socket_group`, else the daemon's own."""
    if not config.socket_group:
        return os.getegid()
    try:
        return grp.getgrnam(config.socket_group).gr_gid
    except KeyError:
        raise ConfigError(f"socket_group '{config.socket_group}' does not exist") from None


def http_options(config: DaemonConfig) -> Any:
    """The HTTP front end's `HttpOptions` from `config` (its token read); ConfigError when
    the token file or the socket's group is not right."""
    # imported here: the HTTP front end (and waitress) load only when one is asked for
    from neuron_rtd.server import HttpOptions

    gid = socket_gid(config)
    token = read_http_token(config.http_token_file, gid) if config.http_token_file else None
    return HttpOptions(
        group=gid,
        token=token,
        max_body_bytes=config.http_max_body_mb << 20,
        header_timeout_s=float(config.http_header_timeout_secs),
        max_connections_per_user=config.http_max_connections_per_user,
        threads=config.http_threads,
    )


def http_host(address: str, where: str = "config", key: str = "http_address") -> str:
    """The host of a TCP `HOST:PORT` the daemon listens on besides its own address (the
    HTTP front end's, the extra gRPC one, the metrics'), brackets stripped; ConfigError
    naming `key` when `address` is not one (port 0: any free port)."""
    # imported here: the HTTP front end (and waitress) load only when one is asked for
    from neuron_rtd.server import split_http_address

    split = split_http_address(address)
    if split is None:
        raise ConfigError(
            f"{where}: {key} must be HOST:PORT (127.0.0.1:8000, [::1]:8000), got {address!r}"
        )
    return split[0]


def tcp_host(address: str) -> str | None:
    """The host of a TCP `host:port` address (brackets stripped); None for unix:/path."""
    if address.startswith("unix:"):
        return None
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def loopback(host: str) -> bool:
    """Whether `host` is this machine only: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def remote_clients_warning(config: DaemonConfig) -> str | None:
    """What the daemon logs as a warning at start when it serves beyond this machine (a
    TCP server_address outside loopback, which `validate` lets through only with
    allow_remote_clients); None otherwise."""
    host = tcp_host(config.server_address)
    if host is None or loopback(host):
        return None
    return (
        f"serving the gRPC API on {config.server_address} to the network "
        "(allow_remote_clients), in plaintext: anyone who reaches this address can load "
        "models and read and write tensors, unauthenticated and unencrypted"
    )


def remote_http_warning(config: DaemonConfig, key: str = "http_address") -> str | None:
    """What the daemon logs as a warning at start when it serves one of `LOCAL_ONLY`'s
    addresses (the HTTP front end's by default) beyond this machine (`validate` lets such
    an address through only with allow_remote_clients); None otherwise."""
    address = getattr(config, key)
    if address is None or loopback(http_host(address, key=key)):
        return None
    return (
        f"serving {SERVED_ON[key]} on {address} to the network (allow_remote_clients), in "
        f"plaintext: anyone who reaches this address can {LOCAL_ONLY[key]}, unauthenticated "
        "and unencrypted"
    )


def remote_warnings(config: DaemonConfig) -> list[str]:
    """Every warning the daemon logs at start for what it serves beyond this machine."""
    told = [remote_clients_warning(config), *(remote_http_warning(config, k) for k in LOCAL_ONLY)]
    return [warning for warning in told if warning]


def config_path(explicit: str | None, instance: str | None) -> Path | None:
    """The file to read: -c, else the instance's, else the default if it exists."""
    if explicit:
        return Path(explicit)
    if instance:
        return INSTANCE_CONFIG_DIR / f"{instance}.json"
    return DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None


def environment(config: DaemonConfig, env: Mapping[str, str]) -> DaemonConfig:
    """`config` with what the environment `env` says (each field naming its variable in
    its metadata), the daemon's one reader of its environment but for systemd's own
    protocol (`sd.py`): the devices, the sim root over the file's, the NC engine under the
    file's, spinning, the CPU nodes' threads, the faults to inject. `NEURON_RTD_ADDRESS`
    is `load_config`'s (it gives way to the flags)."""
    try:
        visible = visible_devices(env)
    except InvalidError as exc:
        raise ConfigError(str(exc)) from None
    try:
        engine = nc_engine(config.nc_engine or env.get(NC_ENGINE_ENV))
    except ValueError as exc:
        raise ConfigError(f"${NC_ENGINE_ENV}: {exc}") from None
    try:
        spinning = check_spinning(env.get(NC_SPINNING_ENV) or WHILE_BUSY)
    except ValueError as exc:
        raise ConfigError(f"${NC_SPINNING_ENV}: {exc}") from None
    threads = env.get(HOST_THREADS_ENV, "")
    sim = replace(
        config.sim,
        root=env.get(SIM_ROOT_ENV) or config.sim.root,
        faults=env.get(FAULTS_ENV, ""),
    )
    return replace(
        config,
        visible_devices=visible,
        nc_engine=engine,
        nc_spinning=spinning,
        host_threads=int(threads) if threads.isdigit() else 0,
        sim=sim,
    )


def load_config(
    *,
    path: str | None = None,
    instance: str | None = None,
    overrides: dict[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> DaemonConfig:
    """File (if any), then `NEURON_RTD_ADDRESS` and `AWS_NEURON_VISIBLE_DEVICES` of
    `environ` (default: this process's), then `overrides` (the flags) over the defaults:
    the daemon listens where its clients look, unless its command line says otherwise."""
    file = config_path(path, instance)
    config = config_from_dict(read_config_file(file), str(file)) if file else DaemonConfig()
    env = os.environ if environ is None else environ
    config = environment(config, env)
    if env.get(ADDRESS_ENV) and not (overrides or {}).get("server_address"):
        config = validate(replace(config, server_address=env[ADDRESS_ENV]), f"${ADDRESS_ENV}")
    known = {f.name for f in fields(DaemonConfig)}
    changes = {k: v for k, v in (overrides or {}).items() if v is not None and k in known}
    return validate(replace(config, **changes, instance=instance), "flags")
