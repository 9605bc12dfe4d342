"""The devices' init: every device reset and initialized at start. While that fails, every
call that needs the devices answers NERR_HW_ERROR, and the init is tried again, at most
once a second, by the next such call."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from neuron_rtd.errors import HwError, NrtError
from neuron_rtd.runtime.driver import DeviceApi, driver_errors

log = logging.getLogger("nrtd.NMGR")

INIT_RETRY_INTERVAL_S = 1.0


class DeviceInit:
    """The init of `devices`, under `lock` (the runtime's: no load or reset runs beside it)."""

    def __init__(self, devices: Sequence[DeviceApi], lock: threading.RLock) -> None:
        self._devices = devices
        self._lock = lock
        self._error: str | None = None
        self._tried = 0.0

    def run(self) -> None:
        """Reset and initialize every device; a failure is kept, and logged."""
        self._tried = time.monotonic()
        try:
            with driver_errors("device init"):
                for device in self._devices:
                    device.reset()
        except NrtError as exc:
            self._error = str(exc)
            log.error("%s", exc, extra={"fn": "init_devices"})
            return
        self._error = None

    def ensure(self) -> None:
        """HwError while the init keeps failing (tried again at most once a second)."""
        if self._error is None:
            return
        with self._lock:
            if self._error is not None and time.monotonic() - self._tried >= INIT_RETRY_INTERVAL_S:
                self.run()
            if self._error is not None:
                raise HwError(f"devices are not initialized: {self._error}")
