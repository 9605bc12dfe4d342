"""Fault injection: the spec syntax, its three sources, and a device's pending faults.

A spec is `name[:nc][=value]`:

    init_fail           the next reset of the device raises InitFailed
    nc_error[:nc]       the next run on that NC (any NC if none named) raises HwFault; once
    nc_hang[:nc]        the next run on that NC never completes: the driver's completion
                        watchdog gives up on it after HANG_DETECT_S and raises HwFault; once
    dma_timeout[:nc]    the next run's input DMA to that NC times out: HwFault; once
    nc_delay_ms[:nc]=ms every following run on that NC (all NCs if none named) first sleeps
                        `ms` milliseconds; 0 clears
    load_delay_ms=ms    every following program load on the device (a model's load puts
                        one on each of its NCs) first sleeps `ms` milliseconds, logged;
                        0 clears (a load held long enough for a test to act during it)
    mem_ecc_corr=n, mem_ecc_uncorr=n, sram_ecc_corr=n, sram_ecc_uncorr=n
                        add n to that ECC counter; an uncorrectable one (n > 0) also
                        spoils the device's next run, on any NC

Sources:
1. env `NEURON_SIM_FAULTS`, read when a device is claimed: comma-separated
   `name@device[:nc][=value]`, e.g. `init_fail@1,nc_error@0:2,mem_ecc_corr@0=3`.
   An `init_fail` there is persistent: every reset of that device fails while the
   variable names it (it is read again at each reset).
2. the device's `inject` file, one spec a line (blank lines and `#` comments skipped),
   consumed (applied, then truncated) at reset, before each NC run and before each
   program load (`InjectFile`).
3. `Device.inject(spec)`.
A malformed spec raises ValueError naming it (from the file: logged and skipped, since
the file is read by whoever runs next, who did not write it).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import pathlib
import select
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from driver_sim.presets import NC_PER_DEVICE
from driver_sim.stats import ECC_FIELDS

FAULTS_ENV = "NEURON_SIM_FAULTS"
INIT_FAIL = "init_fail"
NC_ERROR = "nc_error"
NC_DELAY_MS = "nc_delay_ms"
LOAD_DELAY_MS = "load_delay_ms"
NC_HANG = "nc_hang"
DMA_TIMEOUT = "dma_timeout"
ECC_FAULTS = frozenset(ECC_FIELDS)
ECC_UNCORRECTABLE = ("mem_ecc_uncorr", "sram_ecc_uncorr")
_NC_RUN_FAULTS = (NC_ERROR, NC_HANG, DMA_TIMEOUT)  # injected for an NC (or any)
# Each spoils the next run on its NC (an uncorrectable ECC error: on any NC).
ONE_RUN_FAULTS = (*_NC_RUN_FAULTS, *ECC_UNCORRECTABLE)
FAULT_NAMES = frozenset({INIT_FAIL, NC_DELAY_MS, LOAD_DELAY_MS, *_NC_RUN_FAULTS}) | ECC_FAULTS
# The fault counter (`stats.FAULT_FIELDS`) each run fault adds to; an uncorrectable ECC
# error's spoiled run is counted by its ECC counter, once, when injected.
RUN_FAULT_COUNTERS = {NC_ERROR: "nc_errors", NC_HANG: "nc_hangs", DMA_TIMEOUT: "dma_timeouts"}
HANG_DETECT_S = 1.0  # how long the driver waits for a run to complete before it gives up

_TAKES_NC = frozenset({NC_DELAY_MS, *_NC_RUN_FAULTS})
_TAKES_VALUE = frozenset({NC_DELAY_MS, LOAD_DELAY_MS}) | ECC_FAULTS


@dataclass(frozen=True)
class FaultSpec:
    """One parsed fault: its name, the NC it targets (None: device/any) and its value."""

    name: str
    nc: int | None = None
    value: int | None = None


def _parse_int(text: str, what: str, spec: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"bad fault spec {spec!r}: {what} {text!r} is not an integer") from None
    if number < 0:
        raise ValueError(f"bad fault spec {spec!r}: {what} must not be negative")
    return number


def _check_spec(fault: FaultSpec, spec: str) -> FaultSpec:
    if fault.name not in FAULT_NAMES:
        known = ", ".join(sorted(FAULT_NAMES))
        raise ValueError(f"bad fault spec {spec!r}: unknown fault {fault.name!r} ({known})")
    if fault.nc is not None and fault.name not in _TAKES_NC:
        raise ValueError(f"bad fault spec {spec!r}: {fault.name} takes no NC")
    if fault.nc is not None and fault.nc >= NC_PER_DEVICE:
        raise ValueError(f"bad fault spec {spec!r}: NC {fault.nc} is not in 0..3")
    if (fault.value is None) == (fault.name in _TAKES_VALUE):
        needs = "needs" if fault.value is None else "takes no"
        raise ValueError(f"bad fault spec {spec!r}: {fault.name} {needs} a =value")
    return fault


def _split_value(text: str, spec: str) -> tuple[str, int | None]:
    head, sep, value = text.partition("=")
    return head.strip(), (_parse_int(value.strip(), "value", spec) if sep else None)


def _split_nc(text: str, spec: str) -> tuple[str, int | None]:
    head, sep, nc = text.partition(":")
    return head.strip(), (_parse_int(nc.strip(), "NC", spec) if sep else None)


def parse_fault_spec(spec: str) -> FaultSpec:
    """Parse `name[:nc][=value]`."""
    head, value = _split_value(spec, spec)
    name, nc = _split_nc(head, spec)
    return _check_spec(FaultSpec(name, nc, value), spec)


def parse_env_faults(text: str) -> list[tuple[int, FaultSpec]]:
    """Parse the env syntax into (device index, spec) pairs."""
    parsed: list[tuple[int, FaultSpec]] = []
    for spec in (part.strip() for part in text.split(",")):
        if not spec:
            continue
        head, value = _split_value(spec, spec)
        name, at, target = head.partition("@")
        if not at:
            raise ValueError(f"bad fault spec {spec!r}: expected name@device[:nc][=value]")
        device_text, nc = _split_nc(target, spec)
        device = _parse_int(device_text, "device", spec)
        parsed.append((device, _check_spec(FaultSpec(name.strip(), nc, value), spec)))
    return parsed


def faults_from_env(environ: Mapping[str, str] | None = None) -> str:
    """What `NEURON_SIM_FAULTS` says: the faults a process that names none injects (the
    daemon reads it in its config and names them)."""
    return (os.environ if environ is None else environ).get(FAULTS_ENV, "")


def env_faults_for(device_index: int, text: str | None = None) -> list[FaultSpec]:
    """The faults `text` (None: `NEURON_SIM_FAULTS`, now) names for `device_index`."""
    text = faults_from_env() if text is None else text
    return [spec for device, spec in parse_env_faults(text) if device == device_index]


def env_init_fail(device_index: int, text: str | None = None) -> bool:
    """Whether `text` (None: the environment, as it is now) makes every reset of
    `device_index` fail."""
    return any(spec.name == INIT_FAIL for spec in env_faults_for(device_index, text))


def take_inject_lines(path: str | pathlib.Path) -> list[str]:
    """Consume the inject file: its spec lines, after which it is empty.

    Cheap when there is nothing to do: one stat, no open, while the file is empty.
    """
    try:
        if os.stat(path).st_size == 0:
            return []
        with open(path, "r+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            text = file.read()
            file.seek(0)
            file.truncate()
    except FileNotFoundError:
        return []
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# inotify (inotify(7)): what is watched in the inject file's directory, what tells that the
# watch no longer sees it, and the events' fixed part (wd, mask, cookie, len; then a name).
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_CREATE = 0x2, 0x8, 0x80, 0x100
_IN_DELETE_SELF, _IN_MOVE_SELF, _IN_UNMOUNT, _IN_IGNORED = 0x400, 0x800, 0x2000, 0x8000
_WATCH_LOST = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_WATCHED = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _WATCH_LOST
_EVENT = struct.Struct("iIII")


class InjectFile:
    """A device's inject file, consumed before every run (`take`).

    A stat of the path before each run would cost more than all the other fault checks
    of a run together. Instead an inotify watch on the file's directory tells whether
    anything was written, created or renamed there since the last look, for the price of
    a poll of one descriptor (an epoll: the runs of a device's NCs poll it at once,
    which `select.poll` refuses); only then is the file read. The kernel queues the
    event before the write (or the rename) returns, so a fault written before a run is
    seen by that run, as with the stat. Where inotify is not to be had, or once the
    watch is lost (the directory removed or moved), every take stats the path instead."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = os.fspath(path)
        self._fd = _inotify_watch(os.path.dirname(self.path))
        self._poller: select.epoll | None = None
        if self._fd is not None:
            self._poller = select.epoll()
            self._poller.register(self._fd, select.EPOLLIN)
        self._watching = self._fd is not None
        self._unread = True  # what was written before the watch began: read at the first take

    def take(self) -> list[str]:
        """Consume the file: its spec lines, after which it is empty."""
        if self._watching:
            assert self._poller is not None
            if not self._unread and not self._poller.poll(0):
                return []  # nothing written since the last take
            self._unread = False
            self._drain()  # before the read: a write after it is told by an event of its own
        return take_inject_lines(self.path)

    def _drain(self) -> None:
        """Read the queued events (another run's take may have read them already); a lost
        watch ends the watching."""
        fd = self._fd
        assert fd is not None
        while True:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return
            at = 0
            while at < len(data):
                _, mask, _, name_len = _EVENT.unpack_from(data, at)
                if mask & _WATCH_LOST:
                    self._watching = False
                at += _EVENT.size + name_len

    def close(self) -> None:
        """Stop watching (the device is released: no run is in progress)."""
        fd, self._fd, self._watching = self._fd, None, False
        if self._poller is not None:
            self._poller.close()
        if fd is not None:
            os.close(fd)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _inotify_watch(directory: str) -> int | None:
    """A non-blocking inotify descriptor watching `directory` (`_WATCHED`); None where
    there is no inotify (not Linux) or no more of it (its per-user limits)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "inotify_init1"):
        return None
    fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _WATCHED) < 0:
        os.close(fd)
        return None
    return fd


@dataclass
class FaultState:
    """A device's pending execution and init faults (ECC faults go straight to stats)."""

    init_fail_once: bool = False
    # per one-run fault (ONE_RUN_FAULTS), the NCs it waits for (None: any NC)
    pending: dict[str, set[int | None]] = field(
        default_factory=lambda: {name: set() for name in ONE_RUN_FAULTS}
    )
    delays_s: list[float] = field(default_factory=lambda: [0.0] * NC_PER_DEVICE)
    load_delay_s: float = 0.0  # before each program load
    # No one-run fault pending and no NC delayed: what a run meets almost always, told by
    # one attribute (kept by `apply` and `take`) instead of a look through the above.
    quiet: bool = True

    def apply(self, fault: FaultSpec) -> None:
        """Record a one-shot init fault or an NC fault."""
        if fault.name == INIT_FAIL:
            self.init_fail_once = True
        elif fault.name in self.pending:
            self.pending[fault.name].add(fault.nc)
        elif fault.name == NC_DELAY_MS:
            targets = range(NC_PER_DEVICE) if fault.nc is None else (fault.nc,)
            for nc in targets:
                self.delays_s[nc] = (fault.value or 0) / 1000.0
        elif fault.name == LOAD_DELAY_MS:
            self.load_delay_s = (fault.value or 0) / 1000.0
        self._settle()

    def take_init_fail(self) -> bool:
        """Whether a one-shot init failure is pending; it is used up."""
        failing = self.init_fail_once
        self.init_fail_once = False
        return failing

    def any_pending(self) -> bool:
        return any(self.pending.values())

    def take(self, nc: int) -> str | None:
        """The one-run fault this run on `nc` meets (used up), if any."""
        for name, targets in self.pending.items():
            for target in (nc, None):
                if target in targets:
                    targets.discard(target)
                    self._settle()
                    return name
        return None

    def _settle(self) -> None:
        self.quiet = not self.any_pending() and not any(self.delays_s)
