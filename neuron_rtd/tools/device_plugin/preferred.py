"""Which units to prefer for a container (GetPreferredAllocation): contiguous ones, on as
few devices as possible, next to each other in the device chain.

Among the available units, the answer holds every unit that must be included and
`size` units in all. It is chosen in this order:
1. the fewest devices: the shortest stretch of the chain (devices next to each other)
   holding `size` available units with the must-include ones;
2. the most contiguous: `size` units next to each other in the chain order of the
   available ones there, spanning the fewest positions;
3. the tightest fit: the stretch with the fewest available units left over, so whole free
   devices stay whole for the next container;
4. the lowest position.
When no stretch's run holds all the must-include units (they lie far apart), the answer
is those units and the available ones nearest to them.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_rtd.tools.device_plugin.resources import RequestError, Unit


def _check(available: Sequence[Unit], must: Sequence[Unit], size: int, resource: str) -> None:
    if not set(must) <= set(available):
        missing = ", ".join(u.id for u in must if u not in set(available))
        raise RequestError(
            f"{resource}: must-include device id(s) {missing} are not among the available ones"
        )
    if not len(set(must)) <= size <= len(set(available)):
        raise RequestError(
            f"{resource}: an allocation of {size} cannot hold the {len(set(must))} must-include "
            f"device id(s) out of {len(set(available))} available"
        )


def preferred(
    units: Sequence[Unit],
    *,
    available: Sequence[Unit],
    must: Sequence[Unit],
    size: int,
    resource: str,
) -> list[Unit]:
    """The units to prefer (in chain order) out of `available` (a part of `units`, all
    of a resource), holding `must`, `size` of them; RequestError when that cannot be."""
    _check(available, must, size, resource)
    pool = sorted(set(available), key=lambda u: u.position)
    needed = set(must)
    chain: list[int] = []  # the devices, in chain order
    for unit in sorted(units, key=lambda u: u.position):
        if unit.device not in chain:
            chain.append(unit.device)
    for length in range(1, len(chain) + 1):
        best: tuple[tuple[int, int, int], list[Unit]] | None = None
        for start in range(len(chain) - length + 1):
            stretch = set(chain[start : start + length])
            here = [u for u in pool if u.device in stretch]
            for i in range(len(here) - size + 1):
                run = here[i : i + size]
                if not needed <= set(run):
                    continue
                key = (run[-1].position - run[0].position, len(here) - size, run[0].position)
                if best is None or key < best[0]:
                    best = (key, run)
        if best is not None:
            return best[1]
    return _nearest(pool, needed, size)


def _nearest(pool: list[Unit], needed: set[Unit], size: int) -> list[Unit]:
    """`needed` and the units of `pool` nearest to them, `size` in all, in chain order."""
    others = sorted(
        (u for u in pool if u not in needed),
        key=lambda u: (min(abs(u.position - n.position) for n in needed), u.position),
    )
    chosen = [*needed, *others[: size - len(needed)]]
    return sorted(chosen, key=lambda u: u.position)
