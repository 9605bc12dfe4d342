"""`neuron-rtd`'s command line: its flags, each a key of the daemon's config (`config.py`)
or naming its file (`-c`, `-i`); `docs/operations.md` lists them."""

from __future__ import annotations

import argparse

from neuron_rtd.command_line import add_version
from neuron_rtd.daemon.config import (
    DEFAULT_ADDRESS,
    DEFAULT_CONFIG,
    INSTANCE_CONFIG_DIR,
    LOG_LEVELS,
    MODEL_CONTROL_MODES,
    DaemonConfig,
)
from neuron_rtd.help_format import PlainHelp


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="neuron-rtd",
        description="Neuron runtime daemon: serves the nrt gRPC API for its Neuron devices.",
        epilog="Environment: NEURON_SIM_ROOT, the folder of the simulated machine it serves "
        "(made there if absent; default /run/neuron-sim for root and for whoever can read "
        "the service's machine there, else /tmp/neuron-sim-UID; it overrides the config's "
        "sim root); NEURON_RTD_ADDRESS, the address it listens on (as -a); "
        "AWS_NEURON_VISIBLE_DEVICES, the devices it serves (as -t).",
        formatter_class=PlainHelp,
    )
    parser.add_argument(
        "-t",
        dest="devices",
        action="append",
        metavar="BDF",
        help="serve only this device (repeatable; the set must be contiguous; default: the "
        "devices $AWS_NEURON_VISIBLE_DEVICES names by index, as 1 or 0-1, else all)",
    )
    parser.add_argument(
        "-g",
        "-a",
        "--address",
        dest="server_address",
        metavar="ADDRESS",
        help="listen on this socket path (/run/neuron.sock, ./neuron.sock, unix:/path) or "
        "host:port (default: $NEURON_RTD_ADDRESS, as the clients read it, else the config's "
        f"server_address, else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "-c",
        dest="config",
        metavar="CONFIG",
        help=f"JSON config file (default {DEFAULT_CONFIG} when it exists; else built-in defaults)",
    )
    parser.add_argument(
        "-l",
        dest="log_level",
        choices=LOG_LEVELS,
        help=f"log level (default {DaemonConfig.log_level}, or the config's log_level)",
    )
    parser.add_argument(
        "-x",
        dest="log_console",
        action="store_const",
        const=True,
        help="also log to the console (stderr)",
    )
    parser.add_argument(
        "-i",
        dest="instance",
        metavar="INSTANCE",
        help=f"instance name: reads {INSTANCE_CONFIG_DIR}/INSTANCE.json",
    )
    serving = parser.add_argument_group(
        "KServe v2 / Triton protocol",
        "Served on the same address as the nrt API (tritonclient.grpc works on it as it "
        "is), and over HTTP/REST with --http-address.",
    )
    serving.add_argument(
        "--model-repository",
        dest="model_repository",
        metavar="DIR",
        help="serve the models of this folder, in Triton's layout: DIR/NAME/VERSION/model.neff "
        "and an optional DIR/NAME/config.pbtxt (default: the config's model_repository, "
        "else none)",
    )
    serving.add_argument(
        "--model-control-mode",
        dest="model_control_mode",
        choices=MODEL_CONTROL_MODES,
        help="none: load every model of the repository at start; explicit: only those "
        "--load-model names, then what clients load and unload; poll: follow the "
        f"repository's changes (default {DaemonConfig.model_control_mode})",
    )
    serving.add_argument(
        "--load-model",
        dest="load_models",
        action="append",
        metavar="NAME",
        help="in explicit mode, load this model of the repository at start (repeatable; "
        "* for all of them)",
    )
    serving.add_argument(
        "--repository-poll-secs",
        dest="repository_poll_secs",
        type=int,
        metavar="N",
        help="in poll mode, read the repository again every N seconds (default "
        f"{DaemonConfig.repository_poll_secs})",
    )
    serving.add_argument(
        "--compile-cache",
        dest="compile_cache_dir",
        metavar="DIR",
        help="keep the NEFFs compiled from the repository's ONNX models here (default: the "
        "config's compile_cache_dir, else $STATE_DIRECTORY, else "
        "/var/lib/neuron-rtd/compile-cache for root, ~/.cache/neuron-rtd/compile-cache "
        "for others)",
    )
    serving.add_argument(
        "--http-address",
        dest="http_address",
        metavar="HOST:PORT",
        help="also serve the protocol over HTTP/REST here, e.g. 127.0.0.1:8000 (default: "
        "off; a host beyond loopback needs --allow-remote-clients)",
    )
    serving.add_argument(
        "--grpc-address",
        dest="grpc_address",
        metavar="HOST:PORT",
        help="also serve gRPC here, every service of -a's address as on a TCP one (Triton's "
        "clients' localhost:8001), e.g. 127.0.0.1:8001 (default: off; a host beyond loopback "
        "needs --allow-remote-clients)",
    )
    serving.add_argument(
        "--metrics-address",
        dest="metrics_address",
        metavar="HOST:PORT",
        help="serve GET /metrics here, Prometheus's text with Triton's metric names, e.g. "
        "127.0.0.1:8002 (default: off; a host beyond loopback needs --allow-remote-clients)",
    )
    parser.add_argument(
        "--allow-remote-clients",
        dest="allow_remote_clients",
        action="store_const",
        const=True,
        help="let -a HOST:PORT, --http-address, --grpc-address and --metrics-address listen "
        "beyond loopback, in plaintext: anyone "
        "who reaches the address can use the daemon (default: the config's "
        "allow_remote_clients, else off)",
    )
    add_version(parser, "-v")
    return parser.parse_args(argv)
