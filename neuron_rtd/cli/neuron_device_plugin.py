"""`neuron-device-plugin`: this node's NeuronCores and Neuron devices offered to the
kubelet as `aws.amazon.com/neuroncore` and `aws.amazon.com/neuron` (the device plugin
API v1beta1; neuron_rtd/tools/device_plugin/, docs/scale-out.md).

    neuron-device-plugin                         the machine of $NEURON_SIM_ROOT (else the
                                                 default root), the kubelet's default folder
    neuron-device-plugin --device-plugin-path DIR --runtime-socket /run/neuron/neuron.sock

It runs until SIGTERM or SIGINT (exit 0, its sockets removed); it waits for the machine
and the kubelet when they are not there yet, saying so in one line. Exit codes: 0 when
stopped, 1 when it cannot run (the kubelet refused it, the machine is not the one named),
2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import driver_sim
from neuron_rtd.client.address import AddressError, parse_address
from neuron_rtd.command_line import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_version, entry
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.tools.device_plugin.kubelet import (
    DEFAULT_PLUGIN_DIR,
    PluginConfig,
    PluginError,
    run,
)
from neuron_rtd.tools.device_plugin.resources import NEURON_RESOURCE, NEURONCORE_RESOURCE

PROG = "neuron-device-plugin"
DEFAULT_RUNTIME_SOCKET = Path("/run/neuron/neuron.sock")
# Folders whose mount would give every pod the host's other sockets (its container runtime's)
SHARED_FOLDERS = frozenset({Path("/"), Path("/run"), Path("/var/run"), Path("/var"), Path("/tmp")})
SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path, its NUL left out)


class FlagError(ValueError):
    """A flag the plugin cannot run with: exit 2 with this message."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            f"Offer this node's NeuronCores ({NEURONCORE_RESOURCE}) and Neuron devices "
            f"({NEURON_RESOURCE}) to the kubelet, through its device plugin API v1beta1. "
            f"The machine is the simulated one at ${driver_sim.SIM_ROOT_ENV} (else the "
            "default root, /run/neuron-sim for root), made by neuron-rtd. Runs until SIGTERM "
            "or SIGINT."
        ),
        formatter_class=PlainHelp,
    )
    parser.add_argument(
        "--device-plugin-path",
        metavar="DIR",
        type=Path,
        default=DEFAULT_PLUGIN_DIR,
        help="the kubelet's device plugin folder, holding its kubelet.sock; the plugin's "
        f"sockets neuron-core.sock and neuron.sock go there too (default: {DEFAULT_PLUGIN_DIR})",
    )
    parser.add_argument(
        "--runtime-socket",
        metavar="PATH",
        default=str(DEFAULT_RUNTIME_SOCKET),
        help="the node's neuron-rtd socket: its folder is mounted read-only into each "
        "container given NeuronCores or devices, and NEURON_RTD_ADDRESS names it there "
        f"(default: {DEFAULT_RUNTIME_SOCKET}; a folder of its own, never /run itself)",
    )
    parser.add_argument(
        "--instance-type",
        default=None,
        help="the instance type the machine must be (an error if it is another)",
    )
    parser.add_argument(
        "--no-device-specs",
        dest="device_specs",
        action="store_false",
        help="give containers no device nodes: the simulated machine's (DIR/dev/neuronN "
        "of its tree) are plain files, which a real container runtime refuses as devices",
    )
    add_version(parser)
    return parser.parse_args(argv)


def _runtime_socket(text: str) -> Path:
    try:
        address = parse_address(text)
    except AddressError as exc:
        raise FlagError(f"--runtime-socket {text!r}: {exc}") from None
    if address.unix_path is None:
        raise FlagError(
            f"--runtime-socket {text!r} is not a socket path: give the daemon's unix socket, "
            f"e.g. {DEFAULT_RUNTIME_SOCKET}"
        )
    if address.unix_path.parent in SHARED_FOLDERS:
        raise FlagError(
            f"--runtime-socket {text!r}: its folder {address.unix_path.parent} would be "
            "mounted into every container, with the host's other sockets in it; put the "
            f"daemon's socket in a folder of its own, e.g. {DEFAULT_RUNTIME_SOCKET}"
        )
    return address.unix_path


def config_of(args: argparse.Namespace) -> PluginConfig:
    """The config the flags say; FlagError for one the plugin cannot run with."""
    folder: Path = args.device_plugin_path.absolute()
    if folder.exists() and not folder.is_dir():
        raise FlagError(f"--device-plugin-path {folder} is not a folder")
    longest = folder / "neuron-core.sock"
    if len(bytes(longest)) > SOCKET_PATH_MAX:
        raise FlagError(
            f"--device-plugin-path {folder} is too long for a socket path "
            f"({longest}: over {SOCKET_PATH_MAX} bytes)"
        )
    return PluginConfig(
        plugin_dir=folder,
        runtime_socket=_runtime_socket(args.runtime_socket),
        device_specs=args.device_specs,
        instance_type=args.instance_type,
    )


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


async def _until_signalled(config: PluginConfig) -> None:
    """`run` until SIGTERM or SIGINT cancels it."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(run(config, _say))
    stops = (signal.SIGTERM, signal.SIGINT)
    for signum in stops:
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        _say("stopped; its sockets are removed")
    finally:
        for signum in stops:
            loop.remove_signal_handler(signum)


@entry(PROG)
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = config_of(args)
    except FlagError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(_until_signalled(config))
    except PluginError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
