"""`neuron-ls`: the Neuron devices of this machine and the runtime that owns each.

Reads the driver's state tree (no daemon needed; `NEURON_SIM_ROOT` picks the tree).
With `-a ADDRESS` (or `NEURON_RTD_ADDRESS`) it asks that daemon which machine it serves.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import grpc

import driver_sim
from neuron_rtd.client.errors import NrtConnectionError, transport_errors
from neuron_rtd.help_format import PlainHelp
from neuron_rtd.proto import CHANNEL_OPTIONS, ext_pb, ext_pb_grpc

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
    parser.add_argument("-j", "--json-output", action="store_true", help="print JSON")
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
    return parser.parse_args(argv)


def _root_source(address: str | None) -> str:
    if address:
        return f"the root that {address} serves"
    if driver_sim.SIM_ROOT_ENV in os.environ:
        return f"from {driver_sim.SIM_ROOT_ENV}"
    return f"the default root; {driver_sim.SIM_ROOT_ENV} names another"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    address = args.address or os.environ.get("NEURON_RTD_ADDRESS")
    root: str | None = None
    only: set[int] | None = None
    if address:
        try:
            with transport_errors("describe", address, DESCRIBE_TIMEOUT_S):
                described = ask_daemon(address)
        except NrtConnectionError as exc:  # said as every tool says it
            print(f"neuron-ls: {exc.details}", file=sys.stderr)
            return 1
        root = described.sim_root
        only = {d.index for d in described.devices}
    try:
        machine = driver_sim.Machine.open(root, instance_type=args.instance_type, create=False)
    except driver_sim.NoMachine as exc:
        print(
            f"neuron-ls: {exc} ({_root_source(address)}): start neuron-rtd, which makes the "
            f"machine, or set {driver_sim.SIM_ROOT_ENV} to the root it serves",
            file=sys.stderr,
        )
        return 1
    except (driver_sim.DriverError, ValueError, OSError) as exc:
        print(f"neuron-ls: {exc} ({_root_source(address)})", file=sys.stderr)
        return 1
    devices = [d for d in machine.devices() if only is None or d.index in only]
    if args.json_output:
        print(render_json(devices))
    elif args.topology:
        print(render_topology(machine, devices))
    else:
        print(render_table(device_rows(devices)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
