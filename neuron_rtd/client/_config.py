"""What a client reads from its environment, the way the framework plugins read it.

- `NEURON_RTD_ADDRESS`: the daemon's address (a socket path, `unix:/path` or `host:port`;
  parsed by `address.py`, as every address is).
- `NEURON_RTD_SHM_MAP`: `no` (also `0`, `false`, `off`) sends every tensor inline instead
  of through shared memory.
- `NEURONCORE_GROUP_SIZES`: NeuronCore Groups to create at open, as comma-separated NC
  counts, each `N` or `KxN` for K groups of N, as torch-neuron read it (`2,2`, `1,1,2`,
  `4x2`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

ADDRESS_ENV = "NEURON_RTD_ADDRESS"
LANE_ENV = "NEURON_RTD_FAST_LANE"
SHM_ENV = "NEURON_RTD_SHM_MAP"
NCG_SIZES_ENV = "NEURONCORE_GROUP_SIZES"

CHUNK_BYTES = 1 << 20  # NEFF chunks of a load stream: at most 1 MiB each
DEFAULT_NINFER = 4  # in-flight inferences per model (the daemon's default too)
_OFF = frozenset({"no", "0", "false", "off"})


def address_from_env(environ: Mapping[str, str] | None = None) -> str:
    """What `NEURON_RTD_ADDRESS` says ("" when unset); `address.py` reads it as an address."""
    env = os.environ if environ is None else environ
    return env.get(ADDRESS_ENV, "")


def shm_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """False when `NEURON_RTD_SHM_MAP` turns shared memory off."""
    env = os.environ if environ is None else environ
    return env.get(SHM_ENV, "").strip().lower() not in _OFF


def lanes_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """False when `NEURON_RTD_FAST_LANE` turns the fast lane off (every infer over gRPC)."""
    env = os.environ if environ is None else environ
    return env.get(LANE_ENV, "").strip().lower() not in _OFF


def parse_ncg_sizes(text: str) -> tuple[int, ...]:
    """`"2,2"` -> (2, 2), `"4x2"` -> (2, 2, 2, 2); an empty text means no groups.
    ValueError for anything else."""
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part and "," not in text:
            continue  # no groups at all
        count, times, size = part.partition("x")
        if not times:
            count, size = "1", part
        if not (count.isdigit() and size.isdigit() and int(count) > 0 and int(size) > 0):
            raise ValueError(
                f"{NCG_SIZES_ENV}={text!r}: each entry must be a positive number of "
                f"NeuronCores, or KxN for K groups of N, as in '2,2', '1,1,2' or '4x2'"
            )
        sizes += [int(size)] * int(count)
    return tuple(sizes)


def ncg_sizes_from_env(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    env = os.environ if environ is None else environ
    return parse_ncg_sizes(env.get(NCG_SIZES_ENV, ""))


def check_ncg_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(s) for s in sizes)
    if any(s < 1 for s in out):
        raise ValueError(f"NCG sizes must be positive NC counts, got {list(sizes)}")
    return out
