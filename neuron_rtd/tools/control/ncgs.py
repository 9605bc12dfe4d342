"""`neuron-cli list-ncg`, `create-ncg N` and `destroy-ncg ID`: the NeuronCore Groups."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from neuron_rtd.client.errors import NrtClientError, check
from neuron_rtd.errors import Nerr
from neuron_rtd.proto import pb
from neuron_rtd.tools.control.command import (
    Answer,
    Command,
    Failure,
    Listing,
    explain,
    int_at_least,
)

if TYPE_CHECKING:
    from neuron_rtd.client import Client
    from neuron_rtd.client.observe import Watch

NCG_HEADERS = ("NCG ID", "NC COUNT", "DEVICE START INDEX", "NC START INDEX")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A boxed table, numbers right-aligned under centred headers."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    head = "| " + " | ".join(h.center(w) for h, w in zip(headers, widths, strict=True)) + " |"
    body = [
        "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    return "\n".join([rule, head, rule, *body, rule])


def list_egs(client: Client) -> Any:
    """The daemon's NCGs, and its device and NC counts (the wire's list_egs)."""
    response = client.connection.unary("list_egs", pb.empty())
    check("list_egs", response.status)
    return response


class ListNcg(Listing):
    """`neuron-cli list-ncg [-j]`: the NeuronCore Groups on the daemon.

    The first line counts the runtime's devices and NeuronCores; then one row per NCG: its
    id, its NC count, the device of its first NC and that NC's index on the device. NCGs
    made by a framework, by neuron-cli create-ncg or by the runtime for a model loaded
    without one are all listed; neuron-cli list-model shows which models each holds."""

    def read(self, args: argparse.Namespace, watch: Watch) -> Answer:
        response = watch.ncgs()
        ncgs = sorted(response.eg_info, key=lambda e: e.eg.id)
        rows = [(e.eg.id, e.nc_count, e.mla_start_index, e.nc_start_index) for e in ncgs]
        text = f"Device {response.mla_count} NC count {response.nc_count}\n"
        data = {
            "device_count": response.mla_count,
            "nc_count": response.nc_count,
            "ncgs": [
                {
                    "ncg_id": e.eg.id,
                    "nc_count": e.nc_count,
                    "device_start_index": e.mla_start_index,
                    "nc_start_index": e.nc_start_index,
                    "vnc_start_index": e.vnc_start_index,
                }
                for e in ncgs
            ],
        }
        return Answer(text + render_table(NCG_HEADERS, rows), data)


nc_count = int_at_least(0, "an NC count is 0 or more, got {value}", "nc_count")
ncg_id = int_at_least(1, "NCG ids start at 1, got {value}", "ncg_id")


class CreateNcg(Command):
    """`neuron-cli create-ncg N`: a NeuronCore Group of N contiguous NCs.

    N = 0 takes the largest run of contiguous free NCs. The NCG outlives the command (it
    belongs to no session) until neuron-cli destroy-ncg or reset. Models loaded into it
    with neuron-cli load --ncg-id ID start stopped (STANDBY): neuron-cli start runs one."""

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "nc_count", metavar="N", type=nc_count, help="its NCs (0: the largest free run)"
        )

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        try:
            new_id, count = client.create_ncg(args.nc_count)
        except NrtClientError as exc:
            if exc.code != Nerr.RESOURCE_NC:
                raise
            total = list_egs(client).nc_count
            if args.nc_count <= total:
                raise  # NCs are taken: free NeuronCores first (HINTS)
            hint = f"ask for at most {total}, all it has (0 takes the largest free run)"
            raise Failure(explain(exc, {Nerr.RESOURCE_NC: hint})) from None
        text = f"Created NCG {new_id} with {count} NC{'s' if count != 1 else ''}"
        return Answer(text, {"ncg_id": new_id, "nc_count": count})


class DestroyNcg(Command):
    """`neuron-cli destroy-ncg ID`: give a NeuronCore Group's NCs back.

    The NCG must hold no model (neuron-cli unload them first, or neuron-cli reset to clear
    everything). Also frees NCGs a crashed framework left behind."""

    hints = {Nerr.INVALID: ""}  # the daemon says what to do

    def arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("ncg_id", metavar="ID", type=ncg_id, help="the NCG's id (list-ncg)")

    def execute(self, args: argparse.Namespace, client: Client) -> Answer:
        client.destroy_ncg(args.ncg_id)
        return Answer(f"Destroyed NCG {args.ncg_id}", {"ncg_id": args.ncg_id})
