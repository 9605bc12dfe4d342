"""Places a NEFF on an NCG: choose the load mode, put every stage on an NC, copy the
weights into device DRAM, allocate the I/O slots, and load the programs on the NCs.

Normal mode gives each Neuron node its own NCs (node after node, stage after stage);
shared-NC mode, for an NCG smaller than the NEFF's total but at least its largest node,
puts every node on the NCG's first NCs and runs one request at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import driver_sim
from neuron_rtd.errors import ResourceNcError
from neuron_rtd.neff import Neff, Stage
from neuron_rtd.runtime.driver import DeviceApi, driver_errors
from neuron_rtd.runtime.host import compile_host_stage
from neuron_rtd.runtime.model import HostRun, LoadMode, Model, ModelParams, StageRun, Step
from neuron_rtd.runtime.ncg import Ncg, NcgTable

ALIGN = 64
HOST = -1  # placement of a tensor that only CPU nodes touch


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def choose_mode(neff: Neff, ncg: Ncg) -> LoadMode:
    if ncg.nc_count >= neff.nc_count:
        return LoadMode.NORMAL
    if ncg.nc_count >= neff.max_node_ncs:
        return LoadMode.SHARED
    raise ResourceNcError(
        f"model '{neff.name}' needs {neff.nc_count} NCs (its largest node "
        f"{neff.max_node_ncs}); NCG {ncg.id} has {ncg.nc_count}"
    )


def stage_vncs(neff: Neff, ncg: Ncg, mode: LoadMode) -> list[list[int]]:
    """Per node, the vnc of each of its stages (empty for CPU nodes)."""
    placement: list[list[int]] = []
    offset = 0
    for node in neff.nodes:
        if node.kind != "neuron":
            placement.append([])
            continue
        base = offset if mode is LoadMode.NORMAL else 0
        placement.append([ncg.start + base + j for j in range(node.nc_count)])
        offset += node.nc_count
    return placement


@dataclass
class _Allocator:
    """Allocates DRAM next to a vnc and remembers it, so a failed load frees it all."""

    ncgs: NcgTable
    devices: Sequence[DeviceApi]
    model_name: str

    def __post_init__(self) -> None:
        self.taken: list[tuple[Any, Any]] = []

    def alloc(self, vnc: int, nbytes: int, tag: str) -> np.ndarray:
        loc = self.ncgs.locate(vnc)
        device = self.devices[loc.device_slot]
        channel = loc.nc * driver_sim.DRAM_CHANNELS // driver_sim.NC_PER_DEVICE
        with driver_errors(f"loading '{self.model_name}' ({tag})"):
            buf = device.dram_alloc(channel, nbytes, tag=tag)
        self.taken.append((device, buf))
        view: np.ndarray = buf.view(np.uint8, (nbytes,))
        return view

    def free_all(self) -> None:
        for device, buf in reversed(self.taken):
            device.dram_free(buf)
        self.taken.clear()


def _place_weights(alloc: _Allocator, vnc: int, stage: Stage, tag: str) -> dict[str, np.ndarray]:
    offsets: dict[str, int] = {}
    total = 0
    for name, w in stage.weights.items():
        offsets[name] = total
        total += _align(w.nbytes)
    memory = alloc.alloc(vnc, total, f"{tag} weights")
    placed: dict[str, np.ndarray] = {}
    for name, w in stage.weights.items():
        dst = memory[offsets[name] : offsets[name] + w.nbytes].view(w.dtype).reshape(w.shape)
        np.copyto(dst, w)
        placed[name] = dst
    return placed


def _tensor_homes(neff: Neff, placement: list[list[int]]) -> dict[str, int]:
    """The vnc whose DRAM holds each boundary tensor: its producer's, else its first
    Neuron consumer's, else HOST."""
    produced: dict[str, int] = {}
    consumed: dict[str, int] = {}
    for node, vncs in zip(neff.nodes, placement, strict=True):
        for stage, vnc in zip(node.stages, vncs, strict=False):
            for name in stage.outputs:
                produced.setdefault(name, vnc)
            for name in stage.inputs:
                consumed.setdefault(name, vnc)
    return {name: produced.get(name, consumed.get(name, HOST)) for name in neff.tensors}


def _alloc_slots(
    alloc: _Allocator, neff: Neff, homes: dict[str, int], ninfer: int
) -> list[dict[str, np.ndarray]]:
    slots: list[dict[str, np.ndarray]] = []
    for i in range(ninfer):
        slot: dict[str, np.ndarray] = {}
        for name, spec in neff.tensors.items():
            home = homes[name]
            if home == HOST:
                slot[name] = np.empty(spec.shape, dtype=spec.dtype)
            else:
                raw = alloc.alloc(home, spec.nbytes, f"io slot {i} '{name}'")
                slot[name] = raw.view(spec.dtype).reshape(spec.shape)
        slots.append(slot)
    return slots


def build_model(
    *,
    model_id: int,
    neff: Neff,
    ncg: Ncg,
    ncgs: NcgTable,
    devices: Sequence[DeviceApi],
    params: ModelParams,
    session_id: int = 0,
) -> Model:
    """Place `neff` on `ncg`; on any failure everything allocated is freed again."""
    mode = choose_mode(neff, ncg)
    placement = stage_vncs(neff, ncg, mode)
    alloc = _Allocator(ncgs, devices, neff.name)
    try:
        steps: list[Step] = []
        for node, vncs in zip(neff.nodes, placement, strict=True):
            if node.kind != "neuron":
                stage = node.stages[0]
                steps.append(
                    HostRun(
                        node=node.name,
                        run=compile_host_stage(node.name, stage),
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
                program = driver_sim.NcProgram(
                    instructions=[
                        driver_sim.Instr(i.op, tuple(i.inputs), tuple(i.outputs), i.attrs)
                        for i in stage.instructions
                    ],
                    weights=weights,
                    inputs=list(stage.inputs),
                    outputs=list(stage.outputs),
                )
                with driver_errors(f"loading '{neff.name}' {tag} on NC {vnc}"):
                    loaded = core.load(program)
                steps.append(
                    StageRun(
                        vnc=vnc,
                        core=core,
                        program=loaded,
                        inputs=tuple(stage.inputs),
                        outputs=tuple(stage.outputs),
                    )
                )
        slots = _alloc_slots(alloc, neff, _tensor_homes(neff, placement), params.ninfer)
    except BaseException:
        alloc.free_all()
        raise
    used = sorted({v for vncs in placement for v in vncs})
    return Model(
        id=model_id,
        name=neff.name,
        neff=neff,
        ncg_id=ncg.id,
        mode=mode,
        params=params,
        steps=steps,
        slots=slots,
        dram=alloc.taken,
        vncs=tuple(used),
        session_id=session_id,
    )
