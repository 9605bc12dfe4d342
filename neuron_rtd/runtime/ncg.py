"""NeuronCore Groups: runs of contiguous NeuronCores over the daemon's chain of devices.

The daemon serves a contiguous run of devices (device i is linked to i-1 and i+1), so
its NeuronCores form one line of virtual NC indices 0..N-1 (vnc = local device * 4 + nc)
and any run of contiguous free vncs lies on connected devices. Across the machine an NC
is also known by its machine-wide index (its device's index * 4 + nc), as
`NEURON_RT_VISIBLE_CORES` names it: an NCG may be asked to lie within such a set.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from neuron_rtd.errors import InvalidError, InvalidHandle, NrtError, ResourceError, ResourceNcError
from neuron_rtd.runtime.sessions import NO_SESSION, SessionId
from neuron_rtd.visible import show_indices

FIRST_NCG_ID = 1


@dataclass(frozen=True)
class NcLocation:
    """Where a virtual NC lives: the daemon's local device slot and the NC on it."""

    vnc: int
    device_slot: int
    nc: int


@dataclass
class Ncg:
    id: int
    start: int
    nc_count: int
    session_id: SessionId = NO_SESSION
    implicit: bool = False
    models: list[int] = field(default_factory=list)

    @property
    def vncs(self) -> range:
        return range(self.start, self.start + self.nc_count)


class NcgBusy(NrtError):
    """An NCG that still holds models cannot be destroyed."""


class NcgTable:
    """Allocates contiguous NC runs; thread-safe."""

    def __init__(self, device_count: int, ncs_per_device: int, *, first_device: int = 0) -> None:
        """`first_device`: the machine's index of the first device (vnc 0 is its NC 0)."""
        self.ncs_per_device = ncs_per_device
        self.total_ncs = device_count * ncs_per_device
        self.first_nc = first_device * ncs_per_device  # vnc 0's machine-wide index
        self._owner: list[int | None] = [None] * self.total_ncs
        self._ncgs: dict[int, Ncg] = {}
        self._ids = itertools.count(FIRST_NCG_ID)
        self._lock = threading.Lock()

    def locate(self, vnc: int) -> NcLocation:
        slot, nc = divmod(vnc, self.ncs_per_device)
        return NcLocation(vnc=vnc, device_slot=slot, nc=nc)

    def machine_nc(self, vnc: int) -> int:
        """The machine-wide index of virtual NC `vnc`."""
        return self.first_nc + vnc

    def create(
        self,
        nc_count: int,
        *,
        session_id: SessionId = NO_SESSION,
        implicit: bool = False,
        visible: frozenset[int] | None = None,
    ) -> Ncg:
        """Take the first run of `nc_count` free NCs (0: the largest free run); with
        `visible` (machine-wide NC indices), a run of those only."""
        if nc_count < 0:
            raise InvalidError(f"an NCG cannot have {nc_count} NCs")
        if nc_count > self.total_ncs:
            raise ResourceNcError(
                f"not enough NeuronCores: {nc_count} contiguous needed, this runtime has "
                f"{self.total_ncs}"
            )
        usable = self._usable(visible)
        among = "" if visible is None else f" among NCs {show_indices(visible)}"
        with self._lock:
            runs = list(self._free_runs(usable))
            if nc_count == 0:
                if not runs:
                    raise ResourceNcError(
                        f"no free NeuronCore{among}: all {len(usable)} are in NCGs"
                    )
                start, length = max(runs, key=lambda r: (r[1], -r[0]))
                nc_count = length
            else:
                fitting = [r for r in runs if r[1] >= nc_count]
                if not fitting:
                    largest = max((r[1] for r in runs), default=0)
                    raise ResourceNcError(
                        f"not enough free NeuronCores{among}: {nc_count} contiguous needed, "
                        f"the largest free run is {largest} of {len(usable)}"
                    )
                start = fitting[0][0]
            ncg = Ncg(
                id=next(self._ids),
                start=start,
                nc_count=nc_count,
                session_id=session_id,
                implicit=implicit,
            )
            for vnc in ncg.vncs:
                self._owner[vnc] = ncg.id
            self._ncgs[ncg.id] = ncg
            return ncg

    def get(self, ncg_id: int) -> Ncg:
        try:
            return self._ncgs[ncg_id]
        except KeyError:
            raise InvalidHandle(f"NCG {ncg_id} does not exist") from None

    def destroy(self, ncg_id: int) -> Ncg:
        with self._lock:
            ncg = self.get(ncg_id)
            if ncg.models:
                raise NcgBusy(
                    f"NCG {ncg_id} still holds model(s) "
                    f"{', '.join(map(str, ncg.models))}: unload them first"
                )
            for vnc in ncg.vncs:
                self._owner[vnc] = None
            del self._ncgs[ncg_id]
            return ncg

    def to_load_into(self, ncg_id: int, models_per_ncg: int) -> Ncg:
        """NCG `ncg_id`, when a model may be loaded into it: one made with create_eg, or an
        implicit one made for a model and holding none yet (an implicit NCG goes with its
        model), holding fewer than `models_per_ncg` (0: any)."""
        ncg = self.get(ncg_id)
        if ncg.implicit and ncg.models:  # it goes with its model: another would lose its NCs
            owner = ", ".join(map(str, ncg.models))
            raise InvalidError(
                f"NCG {ncg.id} was made for model {owner} and goes with it: load into "
                "an NCG made with create_eg, or with no NCG"
            )
        if models_per_ncg and len(ncg.models) >= models_per_ncg:
            raise ResourceError(
                f"NCG {ncg.id} already holds {len(ncg.models)} models, the most an NCG "
                f"may hold (model_cache_count {models_per_ncg}): unload one first"
            )
        return ncg

    def ncs_held_by(self, session_id: SessionId) -> int:
        """The NCs of the NCGs of a session (implicit ones too)."""
        return sum(g.nc_count for g in self.list() if g.session_id == session_id)

    def list(self) -> list[Ncg]:
        with self._lock:
            return sorted(self._ncgs.values(), key=lambda n: n.id)

    def free_ncs(self) -> int:
        with self._lock:
            return self._owner.count(None)

    def _usable(self, visible: frozenset[int] | None) -> frozenset[int]:
        """The vncs an NCG may take: all, or those of the machine-wide indices `visible`
        (ResourceNcError when none of them is this runtime's)."""
        every = frozenset(range(self.total_ncs))
        if visible is None:
            return every
        usable = frozenset(nc - self.first_nc for nc in visible) & every
        if not usable:
            mine = f"{self.first_nc}-{self.first_nc + self.total_ncs - 1}"
            raise ResourceNcError(
                f"none of NeuronCores {show_indices(visible)} is this runtime's: it has "
                f"NeuronCores {mine}"
            )
        return usable

    def _free_runs(self, usable: frozenset[int]) -> Iterator[tuple[int, int]]:
        """(start, length) of every maximal run of free NCs among `usable`, in order."""
        start = None
        owners = [owner if vnc in usable else -1 for vnc, owner in enumerate(self._owner)]
        for vnc, owner in enumerate([*owners, -1]):
            if owner is None and start is None:
                start = vnc
            elif owner is not None and start is not None:
                yield start, vnc - start
                start = None
