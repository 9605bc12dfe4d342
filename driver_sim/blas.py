"""The host's BLAS threads, shared among the simulated NeuronCores that run at once.

Real NeuronCores are engines of their own; here the NCs share the host's cores. numpy's
BLAS spreads one GEMM over every core, which is best while one NC runs. When several run
side by side (a pipelined model), their GEMMs' threads contend and spin-wait for each
other, and one thread each gets more done in total. `run_starts()`/`run_ends()` bracket
an NC run: the BLAS thread count is the host's count divided by the runs in progress (at
least 1).

The fast engine's share of cores for a run is divided likewise, by the most runs in
progress at once within the last OVERLAP_MEMORY_S: runs that take turns side by side
(DataParallel's copies, a pipeline's stages, models called at once) seldom all start
together, and the first of each turn, alone for a moment, would take every thread and
oversubscribe the cores the others take a moment later (onnxruntime's threads then
spin-wait on each other). Measured on 2 cores, a small CNN at batch 32 by DataParallel:
over 2 NCGs 2.5-3.0 ms a call, 1.8-1.9 with the memory; over 4, 2.9-3.2 and 2.4-2.7; one
NCG alone unchanged (1.44-1.54).
"""

from __future__ import annotations

import threading
import time
from typing import Any

_lock = threading.Lock()
_active = 0
OVERLAP_MEMORY_S = 0.02  # how long runs in progress at once are remembered
_peak = 1  # the most runs in progress at once lately (until `_peak_until`)
_peak_until = 0.0  # (monotonic)
_blas: Any = None  # threadpoolctl's controller of numpy's BLAS, or None
_most = 1
_current = 0


def _find_blas() -> None:
    global _blas, _most, _current
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # then BLAS keeps its own setting
        return
    found = ThreadpoolController().select(user_api="blas").lib_controllers
    if found:
        _blas = found[0]
        _most = _current = max(1, int(_blas.num_threads))


_find_blas()


def _set(threads: int) -> None:
    global _current
    if _blas is not None and threads != _current:
        _blas.set_num_threads(threads)
        _current = threads


def run_starts(cores: int = 1) -> int:
    """An NC run begins: the BLAS threads are shared by the runs in progress; `cores`
    divided among the most runs in progress at once lately (at least 1) is what this
    run may use. Pair each call with `run_ends()`."""
    global _active, _peak, _peak_until
    with _lock:
        _active += 1
        now = time.monotonic()
        if now >= _peak_until:
            _peak = 1
        if _active > 1:
            _peak = max(_peak, _active)
            _peak_until = now + OVERLAP_MEMORY_S
        _set(max(1, _most // _active))
        return max(1, cores // max(_active, _peak))


def run_ends() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active:
            _set(max(1, _most // _active))


def threads() -> int:
    """The BLAS thread count now (for tests and tools)."""
    return _current
