"""Places a NEFF on an NCG: choose the load mode, put every stage on an NC, copy the
weights into device DRAM, allocate the I/O slots, and load the programs on the NCs.

Normal mode puts each Neuron node on the NCs the NEFF assigns it (by default its own,
node after node, stage after stage; nodes the compiler gave one NC share it, and the NC
runs their programs one at a time); shared-NC mode, for an NCG smaller than the NEFF's
total but at least its largest node, puts every node on the NCG's first NCs and runs one
request at a time.

Each bucket of a bucketed NEFF is placed the same way on the same NCs; a weight array
that several stages on one NC share (the same bytes of the NEFF) is copied to DRAM once.
Tensors with a dynamic axis get DRAM at their planned bound, or none when unbounded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from neuron_rtd.errors import ResourceNcError
from neuron_rtd.neff import Bucket, Neff, Stage
from neuron_rtd.neff.dtypes import is_string
from neuron_rtd.runtime.driver import (
    DeviceApi,
    DramBufferApi,
    DynamicBuffer,
    driver_errors,
)
from neuron_rtd.runtime.host import compile_host_stage
from neuron_rtd.runtime.model import LoadedModel, LoadMode, ModelParams
from neuron_rtd.runtime.ncg import Ncg, NcgTable
from neuron_rtd.runtime.sessions import NO_SESSION, SessionId
from neuron_rtd.runtime.variant import HostRun, StageRun, Step, Variant

WEIGHT_ALIGN = 64  # each weight in a stage's block of DRAM starts on this boundary
HOST = -1  # placement of a tensor that only CPU nodes touch


def _align(n: int) -> int:
    return (n + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN


def choose_mode(neff: Neff, ncg: Ncg) -> LoadMode:
    if ncg.nc_count >= neff.nc_count:
        return LoadMode.NORMAL
    if ncg.nc_count >= neff.max_node_ncs:
        return LoadMode.SHARED
    raise ResourceNcError(
        f"model '{neff.name}' needs {neff.nc_count} NCs (its largest node "
        f"{neff.max_node_ncs}); NCG {ncg.id} has {ncg.nc_count}"
    )


def stage_vncs(variant: Bucket, ncg: Ncg, mode: LoadMode) -> list[list[int]]:
    """Per node, the vnc of each of its stages (empty for CPU nodes)."""
    placement: list[list[int]] = []
    for node in variant.nodes:
        base = node.nc if mode is LoadMode.NORMAL else 0
        placement.append([ncg.start + base + j for j in range(node.nc_count)])
    return placement


@dataclass
class _Allocator:
    """Allocates DRAM next to a vnc and remembers it, so a failed load frees it all."""

    ncgs: NcgTable
    devices: Sequence[DeviceApi]
    model_name: str

    def __post_init__(self) -> None:
        self.taken: list[tuple[DeviceApi, DramBufferApi]] = []
        self.placed: dict[tuple[int, int, int, str, tuple[int, ...]], np.ndarray] = {}

    def alloc(self, vnc: int, nbytes: int, tag: str) -> np.ndarray:
        loc = self.ncgs.locate(vnc)
        device = self.devices[loc.device_slot]
        channel = device.spec.channel_of(loc.nc)
        with driver_errors(f"loading '{self.model_name}' ({tag})"):
            buf = device.dram_alloc(channel, nbytes, tag=tag)
        self.taken.append((device, buf))
        view: np.ndarray = buf.view(np.uint8, (nbytes,))
        return view

    def free_all(self) -> None:
        for device, buf in reversed(self.taken):
            device.dram_free(buf)
        self.taken.clear()


def _weight_key(vnc: int, w: np.ndarray) -> tuple[int, int, int, str, tuple[int, ...]]:
    return (vnc, w.__array_interface__["data"][0], w.nbytes, w.dtype.str, w.shape)


def _place_weights(alloc: _Allocator, vnc: int, stage: Stage, tag: str) -> dict[str, np.ndarray]:
    """The stage's weights in DRAM next to `vnc`; arrays already there are reused."""
    placed: dict[str, np.ndarray] = {}
    offsets: dict[str, int] = {}
    total = 0
    for name, w in stage.weights.items():
        known = alloc.placed.get(_weight_key(vnc, w))
        if known is not None:
            placed[name] = known
            continue
        offsets[name] = total
        total += _align(w.nbytes)
    if not offsets:
        return placed
    memory = alloc.alloc(vnc, total, f"{tag} weights")
    for name, offset in offsets.items():
        w = stage.weights[name]
        dst = memory[offset : offset + w.nbytes].view(w.dtype).reshape(w.shape)
        np.copyto(dst, w)
        placed[name] = alloc.placed[_weight_key(vnc, w)] = dst
    return placed


def _tensor_homes(variant: Bucket, placement: list[list[int]]) -> dict[str, int]:
    """The vnc whose DRAM holds each boundary tensor: its producer's, else its first
    Neuron consumer's, else HOST."""
    produced: dict[str, int] = {}
    consumed: dict[str, int] = {}
    for node, vncs in zip(variant.nodes, placement, strict=True):
        for stage, vnc in zip(node.stages, vncs, strict=False):
            for name in stage.outputs:
                produced.setdefault(name, vnc)
            for name in stage.inputs:
                consumed.setdefault(name, vnc)
    return {name: produced.get(name, consumed.get(name, HOST)) for name in variant.tensors}


def _alloc_slots(
    alloc: _Allocator, variant: Bucket, homes: dict[str, int], ninfer: int
) -> list[dict[str, Any]]:
    slots: list[dict[str, Any]] = []
    prefix = f"bucket '{variant.name}' " if variant.name else ""
    for i in range(ninfer):
        slot: dict[str, Any] = {}
        for name, spec in variant.tensors.items():
            home = homes[name]
            tag = f"{prefix}io slot {i} '{name}'"
            if spec.dynamic:
                capacity = (
                    None if home == HOST or spec.unbounded else alloc.alloc(home, spec.nbytes, tag)
                )
                slot[name] = DynamicBuffer(name, spec.dtype, capacity)
            elif is_string(spec.dtype):  # only CPU nodes touch it (`neff/nodes.py`): host
                slot[name] = np.full(spec.shape, "", dtype=spec.dtype)
            elif home == HOST:
                slot[name] = np.empty(spec.shape, dtype=spec.dtype)
            else:
                raw = alloc.alloc(home, spec.nbytes, tag)
                slot[name] = raw.view(spec.dtype).reshape(spec.shape)
        slots.append(slot)
    return slots


def _load_steps(
    variant: Bucket,
    placement: list[list[int]],
    alloc: _Allocator,
    ncgs: NcgTable,
    devices: Sequence[DeviceApi],
    neff_name: str,
    profile: bool = False,
    host_threads: int = 1,
) -> list[Step]:
    steps: list[Step] = []
    for node, vncs in zip(variant.nodes, placement, strict=True):
        if node.kind != "neuron":
            stage = node.stages[0]
            steps.append(
                HostRun(
                    node=node.name,
                    run=compile_host_stage(node.name, stage, host_threads),
                    inputs=tuple(stage.inputs),
                    outputs=tuple(stage.outputs),
                )
            )
            continue
        for j, (stage, vnc) in enumerate(zip(node.stages, vncs, strict=True)):
            tag = f"node '{node.name}' stage {j}"
            weights = _place_weights(alloc, vnc, stage, tag)
            loc = ncgs.locate(vnc)
            core = devices[loc.device_slot].nc(loc.nc)
            with driver_errors(f"loading '{neff_name}' {tag} on NC {vnc}"):
                specs = [variant.tensors[name] for name in stage.inputs]
                placed = dataclasses.replace(stage, weights=weights)
                run = core.load(placed, specs, profile=profile)
            steps.append(
                StageRun(
                    vnc=vnc,
                    run=run,
                    inputs=tuple(stage.inputs),
                    outputs=tuple(stage.outputs),
                    node=node.name,
                    stage=j,
                )
            )
    return steps


def build_model(
    *,
    model_id: int,
    neff: Neff,
    ncg: Ncg,
    ncgs: NcgTable,
    devices: Sequence[DeviceApi],
    params: ModelParams,
    session_id: SessionId = NO_SESSION,
    host_threads: int = 1,
) -> LoadedModel:
    """Place `neff` on `ncg` (its CPU nodes on `host_threads` threads each); on any
    failure everything allocated is freed again."""
    mode = choose_mode(neff, ncg)
    alloc = _Allocator(ncgs, devices, neff.name)
    variants: list[Variant] = []
    used: set[int] = set()
    try:
        for bucket in neff.variants():
            placement = stage_vncs(bucket, ncg, mode)
            steps = _load_steps(
                bucket, placement, alloc, ncgs, devices, neff.name, params.profile, host_threads
            )
            homes = _tensor_homes(bucket, placement)
            slots = _alloc_slots(alloc, bucket, homes, params.ninfer)
            variants.append(Variant(bucket=bucket, steps=steps, slots=slots))
            used.update(v for vncs in placement for v in vncs)
    except BaseException:
        alloc.free_all()
        raise
    return LoadedModel(
        id=model_id,
        name=neff.name,
        neff=neff,
        ncg_id=ncg.id,
        mode=mode,
        params=params,
        variants=variants,
        dram=alloc.taken,
        vncs=tuple(sorted(used)),
        session_id=session_id,
    )
