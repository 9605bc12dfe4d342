"""NeuronCore Groups: runs of contiguous NeuronCores over the daemon's chain of devices.

The daemon serves a contiguous run of devices (device i is linked to i-1 and i+1), so
its NeuronCores form one line of virtual NC indices 0..N-1 (vnc = local device * 4 + nc)
and any run of contiguous free vncs lies on connected devices.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from neuron_rtd.errors import InvalidError, InvalidHandle, NrtError, ResourceError, ResourceNcError

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
    session_id: int = 0
    implicit: bool = False
    models: list[int] = field(default_factory=list)

    @property
    def vncs(self) -> range:
        return range(self.start, self.start + self.nc_count)


class NcgBusy(NrtError):
    """An NCG that still holds models cannot be destroyed."""


class NcgTable:
    """Allocates contiguous NC runs; thread-safe."""

    def __init__(self, device_count: int, ncs_per_device: int) -> None:
        self.ncs_per_device = ncs_per_device
        self.total_ncs = device_count * ncs_per_device
        self._owner: list[int | None] = [None] * self.total_ncs
        self._ncgs: dict[int, Ncg] = {}
        self._ids = itertools.count(FIRST_NCG_ID)
        self._lock = threading.Lock()

    def locate(self, vnc: int) -> NcLocation:
        slot, nc = divmod(vnc, self.ncs_per_device)
        return NcLocation(vnc=vnc, device_slot=slot, nc=nc)

    def create(self, nc_count: int, *, session_id: int = 0, implicit: bool = False) -> Ncg:
        """Take the first run of `nc_count` free NCs (0: the largest free run)."""
        if nc_count < 0:
            raise InvalidError(f"an NCG cannot have {nc_count} NCs")
        if nc_count > self.total_ncs:
            raise ResourceNcError(
                f"not enough NeuronCores: {nc_count} contiguous needed, this runtime has "
                f"{self.total_ncs}"
            )
        with self._lock:
            runs = list(self._free_runs())
            if nc_count == 0:
                if not runs:
                    raise ResourceNcError(f"no free NeuronCore: all {self.total_ncs} are in NCGs")
                start, length = max(runs, key=lambda r: (r[1], -r[0]))
                nc_count = length
            else:
                fitting = [r for r in runs if r[1] >= nc_count]
                if not fitting:
                    largest = max((r[1] for r in runs), default=0)
                    raise ResourceNcError(
                        f"not enough free NeuronCores: {nc_count} contiguous needed, the "
                        f"largest free run is {largest} of {self.total_ncs}"
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
        """NCG `ncg_id`, when a model may be loaded into it: one made with create_eg (an
        implicit NCG goes with its model), holding fewer than `models_per_ncg` (0: any)."""
        ncg = self.get(ncg_id)
        if ncg.implicit:  # it goes with its model: another there would lose its NCs
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

    def ncs_held_by(self, session_id: int) -> int:
        """The NCs of the NCGs of a session (implicit ones too)."""
        return sum(g.nc_count for g in self.list() if g.session_id == session_id)

    def list(self) -> list[Ncg]:
        with self._lock:
            return sorted(self._ncgs.values(), key=lambda n: n.id)

    def free_ncs(self) -> int:
        with self._lock:
            return self._owner.count(None)

    def _free_runs(self) -> Iterator[tuple[int, int]]:
        """(start, length) of every maximal run of free NCs, in order."""
        start = None
        for vnc, owner in enumerate([*self._owner, -1]):
            if owner is None and start is None:
                start = vnc
            elif owner is not None and start is not None:
                yield start, vnc - start
                start = None
