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
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from neuron_rtd.client.address import ADDRESS_ENV, DEFAULT_ADDRESS
from neuron_rtd.daemon.listener import ListenError, listen_address
from neuron_rtd.errors import InvalidError
from neuron_rtd.runtime import nc_engine, nc_spinning
from neuron_rtd.typed_json import ConfigError, Expected, check_object
from neuron_rtd.visible import visible_devices

DEFAULT_CONFIG = Path("/etc/neuron-rtd/neuron-rtd.json")
INSTANCE_CONFIG_DIR = Path("/etc/neuron-rtd/instances")
LOG_LEVELS = ("error", "warning", "info", "debug")
MODEL_CONTROL_MODES = ("none", "explicit", "poll")  # as Triton's --model-control-mode


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    instance_type: str = "inf1.6xlarge"
    root: str | None = None  # None: driver_sim's default; NEURON_SIM_ROOT overrides


@dataclass(frozen=True, kw_only=True)
class DaemonConfig:
    server_address: str = DEFAULT_ADDRESS
    allow_remote_clients: bool = False  # a TCP server_address outside loopback
    devices: tuple[str, ...] = ()  # BDFs; empty: every device of the machine
    # device indices from $AWS_NEURON_VISIBLE_DEVICES (None: unset), never from the file
    visible_devices: frozenset[int] | None = None
    default_timeout: int = 2  # seconds one inference may take
    default_ninfer: int = 4  # in-flight inferences per model
    shmem_enabled: bool = True
    model_cache_count: int = 4  # models one NCG may hold (1 running, rest STANDBY); 0: any
    nc_engine: str | None = None  # None: $NEURON_RTD_NC_ENGINE, else fast
    log_level: str = "info"
    log_console: bool = False
    socket_group: str | None = None
    socket_mode: int = 0o660
    server_threads: int = 16
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
    http_address: str | None = None  # the KServe v2 HTTP/REST front end's HOST:PORT; off
    http_token_file: str | None = None  # a bearer token that makes its bearer a member
    http_max_body_mb: int = 64  # the largest HTTP request body taken, inflated or not
    http_header_timeout_secs: int = 15  # a request's headers must be in within this
    http_max_connections_per_user: int = 256  # open HTTP connections of one uid
    instance: str | None = None
    sim: SimConfig = field(default_factory=SimConfig)

    @property
    def sim_root(self) -> str | None:
        return os.environ.get("NEURON_SIM_ROOT") or self.sim.root


_TYPES: dict[str, Expected] = {
    "server_address": str,
    "allow_remote_clients": bool,
    "devices": list,
    "default_timeout": int,
    "default_ninfer": int,
    "shmem_enabled": bool,
    "model_cache_count": int,
    "nc_engine": (str, type(None)),
    "log_level": str,
    "socket_group": (str, type(None)),
    "socket_mode": str,
    "server_threads": int,
    "front_timeout_secs": int,
    "neff_file_dirs": list,
    "max_message_mb": int,
    "session_max_ncs": int,
    "session_max_models": int,
    "session_max_shm_maps": int,
    "session_max_inflight": int,
    "session_max_open": int,
    "session_max_per_peer": int,
    "model_repository": (str, type(None)),
    "model_control_mode": str,
    "load_models": list,
    "repository_poll_secs": int,
    "http_address": (str, type(None)),
    "http_token_file": (str, type(None)),
    "http_max_body_mb": int,
    "http_header_timeout_secs": int,
    "http_max_connections_per_user": int,
    "sim": dict,
}
_SIM_TYPES: dict[str, Expected] = {
    "instance_type": str,
    "root": (str, type(None)),
}


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(info: os.stat_result) -> bool:
    """Whether the file's group is its owner's own: the owner's primary group, of the
    owner's name, with no other member (a user private group)."""
    try:
        owner, group = pwd.getpwuid(info.st_uid), grp.getgrgid(info.st_gid)
    except KeyError:
        return False
    return (
        owner.pw_gid == info.st_gid
        and group.gr_name == owner.pw_name
        and set(group.gr_mem) <= {owner.pw_name}
    )


def check_config_file(path: Path, info: os.stat_result) -> None:
    """ConfigError unless the file is as trusted as the daemon (see the module's doc)."""
    if info.st_uid not in (0, os.geteuid()):
        raise ConfigError(
            f"{path} belongs to {_owner(info.st_uid)}, who is neither root nor the daemon's "
            f"user {_owner(os.geteuid())}: it decides what the daemon serves to whom; "
            f"give it to root (chown root {path}) or use another file"
        )
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable & stat.S_IWOTH or (writable and not _private_group(info)):
        raise ConfigError(
            f"{path} is writable by others than its owner (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): it decides what the daemon serves to "
            f"whom; chmod go-w {path}"
        )


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
    check_object(data, str(path), _TYPES, comments=True)
    check_object(data.get("sim", {}), f"{path}: sim", _SIM_TYPES, comments=True)
    return data


def config_from_dict(data: dict[str, Any], where: str = "config") -> DaemonConfig:
    values = {k: v for k, v in data.items() if not k.startswith("_") and k != "sim"}
    for key in ("devices", "neff_file_dirs", "load_models"):
        if key in values:
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
        nc_engine(config.nc_engine)
    except ValueError as exc:
        raise ConfigError(f"{where}: nc_engine: {exc}") from None
    try:
        nc_spinning()
    except ValueError as exc:
        raise ConfigError(f"$NEURON_RTD_NC_SPINNING: {exc}") from None
    if config.server_threads < 2:
        raise ConfigError(f"{where}: server_threads must be at least 2")
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
    if config.http_address is not None:
        host = http_host(config.http_address, where)
        if not loopback(host) and not config.allow_remote_clients:
            raise ConfigError(
                f"{where}: http_address {config.http_address} is not a loopback address: "
                "anyone who reaches it could use the models, over unencrypted HTTP; set "
                '"allow_remote_clients": true in the config (or --allow-remote-clients) to mean '
                "it, or listen on "
                "127.0.0.1:PORT"
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


def socket_gid(config: DaemonConfig) -> int:
    """The group the daemon's socket is given: `socket_group`, else the daemon's own."""
    if not config.socket_group:
        return os.getegid()
    try:
        return grp.getgrnam(config.socket_group).gr_gid
    except KeyError:
        raise ConfigError(f"socket_group '{config.socket_group}' does not exist") from None


TOKEN_CHARACTERS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/="
)  # RFC 6750's token68
MIN_TOKEN_CHARACTERS = 16


def read_http_token(path: str, gid: int) -> str:
    """The bearer token in file `path` (one line); ConfigError unless the file is as
    trusted as the config file and no one but its owner (and, read only, the socket's
    group `gid` or the owner's private group) may read it, and the token is RFC 6750's
    token68 of at least MIN_TOKEN_CHARACTERS characters."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"http_token_file {path}: cannot read it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"http_token_file {path}: not a regular file")
        check_config_file(Path(path), info)
        mode = stat.S_IMODE(info.st_mode)
        group_may_read = info.st_gid == gid or _private_group(info)
        if mode & stat.S_IRWXO or (mode & stat.S_IRGRP and not group_may_read):
            raise ConfigError(
                f"http_token_file {path} may be read by others than its owner (mode "
                f"{mode:04o}, group {info.st_gid}): whoever reads it may load models and "
                f"read and write tensors; chmod 0600 {path} (or 0640 with the socket's group)"
            )
        data = file.read(4097)
    token = data.decode("ascii", "replace").strip()
    if len(data) > 4096 or not token or not set(token) <= TOKEN_CHARACTERS:
        raise ConfigError(
            f"http_token_file {path}: must hold one token of letters, digits and -._~+/= "
            "(at most 4096 bytes): make one with `openssl rand -base64 32`"
        )
    if len(token) < MIN_TOKEN_CHARACTERS:
        raise ConfigError(
            f"http_token_file {path}: the token has {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARACTERS}: make one with `openssl rand -base64 32`"
        )
    return token


def http_options(config: DaemonConfig) -> Any:
    """The HTTP front end's `HttpOptions` from `config` (its token read); ConfigError when
    the token file or the socket's group is not right."""
    # imported here: the HTTP front end (and waitress) load only when one is asked for
    from neuron_rtd.server.kserve_http import HttpOptions

    gid = socket_gid(config)
    token = read_http_token(config.http_token_file, gid) if config.http_token_file else None
    return HttpOptions(
        group=gid,
        token=token,
        max_body_bytes=config.http_max_body_mb << 20,
        header_timeout_s=float(config.http_header_timeout_secs),
        max_connections_per_user=config.http_max_connections_per_user,
    )


def http_host(address: str, where: str = "config") -> str:
    """The host of the HTTP front end's `HOST:PORT` (brackets stripped); ConfigError
    when `address` is not one (port 0: any free port)."""
    # imported here: the HTTP front end (and waitress) load only when one is asked for
    from neuron_rtd.server.http_server import split_http_address

    split = split_http_address(address)
    if split is None:
        raise ConfigError(
            f"{where}: http_address must be HOST:PORT (127.0.0.1:8000, [::1]:8000), got {address!r}"
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


def remote_http_warning(config: DaemonConfig) -> str | None:
    """What the daemon logs as a warning at start when its HTTP front end serves beyond
    this machine (`validate` lets such an http_address through only with
    allow_remote_clients); None otherwise."""
    if config.http_address is None or loopback(http_host(config.http_address)):
        return None
    return (
        f"serving the KServe v2 HTTP API on {config.http_address} to the network "
        "(allow_remote_clients), in plaintext: anyone who reaches this address can run, "
        "load and unload models and read and write tensors, unauthenticated and unencrypted"
    )


def config_path(explicit: str | None, instance: str | None) -> Path | None:
    """The file to read: -c, else the instance's, else the default if it exists."""
    if explicit:
        return Path(explicit)
    if instance:
        return INSTANCE_CONFIG_DIR / f"{instance}.json"
    return DEFAULT_CONFIG if DEFAULT_CONFIG.exists() else None


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
    try:
        config = replace(config, visible_devices=visible_devices(env))
    except InvalidError as exc:
        raise ConfigError(str(exc)) from None
    if env.get(ADDRESS_ENV) and not (overrides or {}).get("server_address"):
        config = validate(replace(config, server_address=env[ADDRESS_ENV]), f"${ADDRESS_ENV}")
    known = {f.name for f in fields(DaemonConfig)}
    changes = {k: v for k, v in (overrides or {}).items() if v is not None and k in known}
    return validate(replace(config, **changes, instance=instance), "flags")
