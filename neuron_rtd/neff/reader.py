"""Reading a NEFF: check the container, open the archive without copying it, and build
the validated `Neff`. Checks run in a fixed order: header, sizes, hash, archive, graph,
stages, and last the header's NC counts against the graph."""

from __future__ import annotations

import hashlib
import mmap
import os

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff.archive import gunzip, unpack_members
from neuron_rtd.neff.graph import GRAPH_FILE, parse_graph
from neuron_rtd.neff.header import HEADER_SIZE, NeffHeader, parse_header
from neuron_rtd.neff.jsonfields import load_json
from neuron_rtd.neff.model import Bucket, Neff
from neuron_rtd.neff.nodes import build_nodes, member


def read_neff(data: bytes | bytearray | memoryview) -> Neff:
    """Parse and validate a NEFF held in memory. Weights are read-only views into `data`
    (into its decompressed copy when the archive is gzip-compressed)."""
    view = memoryview(data).cast("B")
    header = parse_header(view)
    payload = _payload(view, header)
    _check_hash(header, payload)
    archive = memoryview(gunzip(payload)) if header.gzip else payload
    members = unpack_members(archive)
    graph = parse_graph(load_json(member(members, GRAPH_FILE, "the graph"), GRAPH_FILE))
    nodes = build_nodes(graph, members)
    buckets = tuple(
        Bucket(
            name=b.name,
            symbols=b.symbols,
            inputs=b.inputs,
            outputs=b.outputs,
            tensors=b.tensors,
            nodes=build_nodes(b, members),
        )
        for b in graph.buckets
    )
    neff = Neff(
        header=header,
        name=graph.name,
        inputs=graph.inputs,
        outputs=graph.outputs,
        tensors=graph.tensors,
        nodes=nodes,
        buffer=view,
        buckets=buckets,
    )
    _check_header_counts(header, neff)
    return neff


def read_neff_file(path: str | os.PathLike[str]) -> Neff:
    """Read a NEFF file through a read-only mmap, which the returned Neff keeps alive."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < HEADER_SIZE:
            return read_neff(file.read())  # raises: too short to hold a header
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    return read_neff(memoryview(mapped))


def _payload(view: memoryview, header: NeffHeader) -> memoryview:
    present = len(view) - HEADER_SIZE
    declared = header.data_size
    if present < declared:
        raise NeffInvalid(
            f"NEFF is truncated: header declares {declared} data bytes, {present} present"
        )
    if present > declared:
        raise NeffInvalid(
            f"NEFF has {present - declared} trailing bytes: header declares {declared} "
            f"data bytes, {present} present"
        )
    return view[HEADER_SIZE:]


def _check_hash(header: NeffHeader, payload: memoryview) -> None:
    actual = hashlib.sha256(payload).digest()
    if actual != header.sha256:
        raise NeffInvalid(
            f"NEFF data hash mismatch: header says {header.sha256.hex()}, "
            f"data hashes to {actual.hex()}"
        )


def _check_header_counts(header: NeffHeader, neff: Neff) -> None:
    if header.name != neff.name:
        raise NeffInvalid(
            f"NEFF header name {header.name!r} disagrees with {GRAPH_FILE} name {neff.name!r}"
        )
    needed = neff.nc_count
    if header.nc_count != needed:
        raise NeffInvalid(
            f"NEFF header nc_count is {header.nc_count} but the graph's Neuron nodes "
            f"need {needed} NCs"
        )
    largest = neff.max_node_ncs
    if header.ncs_per_node != largest:
        raise NeffInvalid(
            f"NEFF header ncs_per_node is {header.ncs_per_node} but the largest Neuron "
            f"node has {largest} NCs"
        )
