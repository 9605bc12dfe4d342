"""`neuron-ls`: the Neuron devices of this machine and the runtime that owns each.

Reads the driver's state tree (no daemon needed; `NEURON_SIM_ROOT` picks the tree).
With `-a ADDRESS` (or `NEURON_RTD_ADDRESS`) it asks that daemon which machine it serves;
with neither, and no tree at the default root, it asks the daemon at the default address
(whose tree may be closed to this user: it then says why, and what to do).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import driver_sim
from neuron_rtd.client.address import (
    ADDRESS_ENV,
    DEFAULT_ADDRESS,
    AddressError,
    default_address,
    grpc_target,
)
from neuron_rtd.command_line import EXIT_FAILED, EXIT_USAGE, add_json_output, add_version, entry
from neuron_rtd.help_format import PlainHelp

HEADERS = (
    ("NEURON", "DEVICE"),
    ("NEURON", "CORES"),
    ("NEURON", "MEMORY"),
    ("CONNECTED", "DEVICES"),
    ("PCI", "BDF"),
    ("RUNTIME", "ADDRESS"),
    ("RUNTIME", "PID"),
    ("RUNTIME", "VERSION"),
)
NA = "NA"
DESCRIBE_TIMEOUT_S = 5.0


def _memory(nbytes: int) -> str:
    return f"{nbytes / 2**30:g} GB"


def device_rows(devices: Sequence[driver_sim.DeviceListing]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for d in devices:
        owner = d.owner
        rows.append(
            (
                str(d.index),
                str(d.core_count),
                _memory(d.memory_bytes),
                ", ".join(map(str, d.connected)),
                d.bdf,
                owner.address if owner else NA,
                str(owner.pid) if owner else NA,
                owner.version if owner else NA,
            )
        )
    return rows


def render_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h[0]), len(h[1]), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str], center: bool) -> str:
        fmt = [c.center(w) if center else c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        return "| " + " | ".join(fmt) + " |"

    out = [rule, line([h[0] for h in HEADERS], True), line([h[1] for h in HEADERS], True), rule]
    out += [line(r, False) for r in rows]
    out.append(rule)
    return "\n".join(out)


def render_json(devices: Sequence[driver_sim.DeviceListing]) -> str:
    doc = [
        {
            "neuron_device": d.index,
            "bdf": d.bdf,
            "connected_to": list(d.connected),
            "nc_count": d.core_count,
            "memory_size": d.memory_bytes,
            "memory_used": list(d.dram_used),
            "hw_counters": dataclasses.asdict(d.hw),
            "runtime": (
                {"address": d.owner.address, "pid": d.owner.pid, "version": d.owner.version}
                if d.owner
                else None
            ),
        }
        for d in devices
    ]
    return json.dumps(doc, indent=2)


def render_topology(
    machine: driver_sim.Machine, devices: Sequence[driver_sim.DeviceListing]
) -> str:
    out = [f"{machine.instance_type}: {len(devices)} Neuron device(s) in a chain"]
    for i, d in enumerate(devices):
        owner = f"  (runtime pid {d.owner.pid}, {d.owner.address})" if d.owner else ""
        out.append(f"  [{d.index}] {d.bdf}  {d.core_count} NCs{owner}")
        if i + 1 < len(devices) and devices[i + 1].index in d.connected:
            out.append("   |")
    return "\n".join(out)


def ask_daemon(address: str) -> Any:
    import grpc  # gRPC and the wire only when a daemon is asked: the tree needs neither

    from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc

    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = ext_pb_grpc.nmgr_extStub(channel)
        return stub.describe(ext_pb.describe_request(), timeout=DESCRIBE_TIMEOUT_S)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="neuron-ls",
        description="The Neuron devices of this machine and the runtime that owns each, read "
        f"from the simulated machine's tree (${driver_sim.SIM_ROOT_ENV}; never made here), "
        "or from the daemon at ADDRESS.",
        formatter_class=PlainHelp,
    )
    add_json_output(parser, "print JSON")
    parser.add_argument("-t", "--topology", action="store_true", help="draw the device chain")
    parser.add_argument(
        "-a",
        "--address",
        help="ask the daemon at this address (default: $NEURON_RTD_ADDRESS when set)",
    )
    parser.add_argument(
        "--instance-type",
        default=None,
        help="the instance type the machine must be (an error if it is another)",
    )
    add_version(parser)
    return parser.parse_args(argv)


def _root_source(address: str | None) -> str:
    if address:
        return f"the root that {address} serves"
    if driver_sim.SIM_ROOT_ENV in os.environ:
        return f"from {driver_sim.SIM_ROOT_ENV}"
    return f"the default root; {driver_sim.SIM_ROOT_ENV} names another"


class Failed(Exception):
    """neuron-ls cannot list the devices: exit 1 with this message."""


def _described(address: str) -> Any:
    """The daemon's describe; Failed in the words every tool says it in."""
    from neuron_rtd.client.errors import NrtConnectionError, transport_errors

    try:
        with transport_errors("describe", address, DESCRIBE_TIMEOUT_S):
            return ask_daemon(address)
    except NrtConnectionError as exc:
        raise Failed(exc.details) from None


def _machine(
    address: str | None, instance_type: str | None, *, from_env: bool = False
) -> tuple[Any, set[int] | None]:
    """The machine to list (the one the daemon at `address` serves, if one is named), and
    the devices of it to list (None: all). An address `from_env` ($NEURON_RTD_ADDRESS,
    maybe stale) where no daemon answers: the machine's tree is listed if it is there,
    saying so on stderr."""
    root: str | None = None
    only: set[int] | None = None
    if address:
        try:
            described = _described(address)
        except Failed as unanswered:
            if not from_env:
                raise
            return _tree_instead(address, unanswered, instance_type), None
        root = described.sim_root
        only = {d.index for d in described.devices}
    try:
        return driver_sim.Machine.open(root, instance_type=instance_type, create=False), only
    except driver_sim.NoMachine as exc:
        if address or driver_sim.SIM_ROOT_ENV in os.environ:
            raise Failed(
                f"{exc} ({_root_source(address)}): start neuron-rtd, which makes the machine, "
                f"or set {driver_sim.SIM_ROOT_ENV} to the root it serves"
            ) from None
        # the default root, and none there: the service's may be one this user cannot
        # read, or a daemon of their own serves another; its daemon knows (or says why not)
        try:
            return _machine(DEFAULT_ADDRESS, instance_type)
        except Failed as why_not:
            raise Failed(f"{exc} ({_root_source(None)}), and {why_not}") from None
    except (driver_sim.DriverError, ValueError, OSError) as exc:
        raise Failed(f"{exc} ({_root_source(address)})") from None


def _tree_instead(address: str, unanswered: Failed, instance_type: str | None) -> Any:
    """The machine's tree at its root ($NEURON_SIM_ROOT, else the default), as no daemon
    answers at `address` (from $NEURON_RTD_ADDRESS); Failed saying both when it is not
    there either."""
    try:
        machine = driver_sim.Machine.open(None, instance_type=instance_type, create=False)
    except (driver_sim.DriverError, ValueError, OSError) as exc:
        raise Failed(f"{unanswered}, and {exc} ({_root_source(None)})") from None
    print(
        f"neuron-ls: {unanswered}; listing the simulated machine's tree at {machine.root} "
        f"instead ({_root_source(None)}; unset ${ADDRESS_ENV} or fix it to ask the daemon)",
        file=sys.stderr,
    )
    return machine


@entry("neuron-ls")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from_env = False
    try:  # read as every tool reads an address (client/address.py)
        address = grpc_target(args.address) if args.address else None
        if address is None and os.environ.get(ADDRESS_ENV):
            address, from_env = default_address(), True
    except AddressError as exc:
        print(f"neuron-ls: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        machine, only = _machine(address, args.instance_type, from_env=from_env)
    except Failed as exc:
        print(f"neuron-ls: {exc}", file=sys.stderr)
        return EXIT_FAILED
    devices = [d for d in machine.devices() if only is None or d.index in only]
    if args.json:
        print(render_json(devices))
    elif args.topology:
        print(render_topology(machine, devices))
    else:
        print(render_table(device_rows(devices)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
