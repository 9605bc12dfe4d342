"""Reading a NEFF: check the container, open the archive without copying it, and build
the validated `Neff`. Checks run in a fixed order: header, sizes, hash, archive, graph,
stages, and last the header's NC counts against the graph."""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
from collections.abc import Callable

import psutil

from neuron_rtd.errors import NeffInvalid
from neuron_rtd.neff.archive import gunzip, unpack_members
from neuron_rtd.neff.graph import GRAPH_FILE, parse_graph
from neuron_rtd.neff.header import HEADER_SIZE, NeffHeader, parse_header
from neuron_rtd.neff.jsonfields import load_json
from neuron_rtd.neff.model import Bucket, Neff
from neuron_rtd.neff.nodes import build_nodes, member


def read_neff(data: bytes | bytearray | memoryview, *, max_unpacked: int | None = None) -> Neff:
    """Parse and validate a NEFF held in memory. Weights are read-only views into `data`
    (into its decompressed copy when the archive is gzip-compressed, which may take at
    most `max_unpacked` bytes: by default half the host's available memory)."""
    view = memoryview(data).cast("B")
    header = parse_header(view)
    payload = _payload(view, header)
    _check_hash(header, payload)
    if header.gzip:
        limit = psutil.virtual_memory().available // 2 if max_unpacked is None else max_unpacked
        archive = memoryview(gunzip(payload, limit))
    else:
        archive = payload
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


def read_neff_file(
    path: str | os.PathLike[str],
    *,
    into: Callable[[int], memoryview] | None = None,
    max_unpacked: int | None = None,
) -> Neff:
    """Read a NEFF file through a read-only mmap, which the returned Neff keeps alive; or,
    with `into` (which gives a buffer of the file's size, or raises), read into that
    buffer: then nothing done to the file later (shrinking it, say) reaches the Neff.

    Only a regular file is read: a device, FIFO or folder is refused without being read
    (nor, for a device, opened). What a file that is not a NEFF holds is never told."""
    name = os.fspath(path)
    if not stat.S_ISREG(os.stat(name).st_mode):
        raise NeffInvalid(f"'{name}' is not a regular file")
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the check above
            raise NeffInvalid(f"'{name}' is not a regular file")
        if size < HEADER_SIZE:
            raise NeffInvalid(f"'{name}' is not a NEFF: it is shorter than a NEFF header")
        _check_file_header(os.pread(fd, HEADER_SIZE, 0), size, name)
        if into is None:
            data = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
        else:
            data = into(size)
            _read_exactly(fd, data, name)
    finally:
        os.close(fd)
    return read_neff(data, max_unpacked=max_unpacked)


def _check_file_header(head: bytes, size: int, name: str) -> None:
    """A file's header, checked before any of its body is read or memory taken for it:
    a file whose size is not the one its header declares is refused from these bytes."""
    if len(head) < HEADER_SIZE:
        raise NeffInvalid(f"'{name}' shrank while it was being read")
    _check_size(parse_header(head), size - HEADER_SIZE)


def _read_exactly(fd: int, target: memoryview, name: str) -> None:
    done = 0
    while done < len(target):
        got = os.readv(fd, [target[done:]])
        if got == 0:
            raise NeffInvalid(f"'{name}' shrank while it was being read")
        done += got


def _payload(view: memoryview, header: NeffHeader) -> memoryview:
    _check_size(header, len(view) - HEADER_SIZE)
    return view[HEADER_SIZE:]


def _check_size(header: NeffHeader, present: int) -> None:
    """NeffInvalid unless `present` data bytes are what the header declares."""
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
