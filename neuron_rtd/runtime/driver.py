"""The narrow interface through which the runtime reaches the driver.

The runtime is handed a list of owned devices that satisfy `DeviceApi` (driver_sim's
`Device` does; a test or another backend plugs in here). Driver exceptions become runtime
exceptions in one place, `driver_errors()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import driver_sim
from neuron_rtd.errors import HwError, InvalidError, NrtError, ResourceError


class DeviceApi(Protocol):
    index: int
    bdf: str

    def reset(self) -> None: ...

    def dram_alloc(self, channel: int, nbytes: int, *, tag: str = "") -> Any: ...

    def dram_free(self, buf: Any) -> None: ...

    def dram_used(self) -> tuple[int, int]: ...

    def nc(self, i: int) -> Any: ...

    def hw_counters(self) -> Any: ...

    def release(self) -> None: ...


@contextmanager
def driver_errors(context: str) -> Iterator[None]:
    """Translate driver exceptions raised inside the block, prefixing `context`."""
    try:
        yield
    except NrtError:
        raise
    except driver_sim.DramExhausted as exc:
        raise ResourceError(f"{context}: {exc}") from exc
    except driver_sim.KernelError as exc:
        raise InvalidError(f"{context}: {exc}") from exc
    except (driver_sim.HwFault, driver_sim.InitFailed) as exc:
        raise HwError(f"{context}: {exc}") from exc
    except driver_sim.DriverError as exc:
        raise NrtError(f"{context}: {exc}") from exc
