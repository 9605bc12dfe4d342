"""The host's BLAS threads, shared among the simulated NeuronCores that run at once.

Real NeuronCores are engines of their own; here the NCs share the host's cores. numpy's
BLAS spreads one GEMM over every core, which is best while one NC runs. When several run
side by side (a pipelined model), their GEMMs' threads contend and spin-wait for each
other, and one thread each gets more done in total. `run_starts()`/`run_ends()` bracket
an NC run: the BLAS thread count is the host's count divided by the runs in progress (at
least 1).
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_active = 0
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
    divided among them (at least 1) is what this run may use. Pair each call with
    `run_ends()`."""
    global _active
    with _lock:
        _active += 1
        _set(max(1, _most // _active))
        return max(1, cores // _active)


def run_ends() -> None:
    global _active
    with _lock:
        _active -= 1
        if _active:
            _set(max(1, _most // _active))


def threads() -> int:
    """The BLAS thread count now (for tests and tools)."""
    return _current
