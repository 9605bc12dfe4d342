"""The driver's exception tree: every error it raises is a `DriverError`."""

from __future__ import annotations


def format_bytes(n: int) -> str:
    """A human size with one decimal: 5.0 GiB, 12.5 MiB, 3.0 KiB, 17 B."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class DriverError(Exception):
    """Base of every error the simulated driver raises."""


class DeviceNotFound(DriverError):
    """No device with that index or BDF on this machine."""


class DeviceBusy(DriverError):
    """The device is owned by another claim (another process, or this one)."""

    def __init__(
        self, device_index: int, bdf: str, owner_pid: int | None, owner_address: str | None
    ) -> None:
        self.device_index = device_index
        self.bdf = bdf
        self.owner_pid = owner_pid
        self.owner_address = owner_address
        if owner_pid is None:
            owner = "another process (owner unknown)"
        else:
            owner = f"pid {owner_pid} (address {owner_address or '?'})"
        super().__init__(f"device {device_index} ({bdf}) is busy: owned by {owner}")


class DramExhausted(DriverError):
    """A DRAM channel cannot fit an allocation; the numbers say why."""

    def __init__(
        self,
        *,
        device_index: int,
        bdf: str,
        channel: int,
        requested: int,
        free: int,
        total: int,
        largest_free: int,
    ) -> None:
        self.device_index = device_index
        self.bdf = bdf
        self.channel = channel
        self.requested = requested
        self.free = free
        self.total = total
        self.largest_free = largest_free
        super().__init__(
            f"device {device_index} ({bdf}) DRAM channel {channel}: cannot allocate "
            f"{requested} bytes ({format_bytes(requested)}): {free} bytes free of {total} "
            f"(largest free block {largest_free})"
        )


class HwFault(DriverError):
    """A hardware error during execution (for example an injected one)."""


class InitFailed(DriverError):
    """Resetting or initializing a device failed."""


class KernelError(DriverError):
    """A bad instruction: unknown op, wrong arity, bad attribute, shape mismatch."""

    def __init__(self, reason: str, *, op: str | None = None, index: int | None = None) -> None:
        self.op = op
        self.index = index
        self.reason = reason
        if index is None:
            super().__init__(reason)
        else:
            super().__init__(f"instruction {index} ({op}): {reason}")


class MachineMismatch(DriverError):
    """The state tree on disk is a different instance type than the one asked for."""


class NoMachine(DriverError):
    """No simulated machine at a root that must already hold one (inspection tools never
    create one), or the root cannot hold one."""
