"""CPU nodes: the parts of a NEFF that run on the host, not on a NeuronCore (the format
is in `neff.cpu_node`).

An ONNX sub-model runs with onnxruntime, the way the original runtime left unsupported ops
to the framework; a CPU node of NC instructions runs with the NC kernels on the host
(through the driver port). Either runs in the inference's own thread and counts nothing on
a device.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from neuron_rtd import onnxrt
from neuron_rtd.errors import InferError, NeffInvalid
from neuron_rtd.neff import Stage
from neuron_rtd.neff.cpu_node import ORT_MODEL, ORT_OP, is_ort_stage
from neuron_rtd.runtime.driver import (
    DynamicBuffer,
    HostFn,
    driver_errors,
    host_program,
    usable_cpus,
)


class HostPool:
    """Where CPU nodes run: one number, `threads`, decides. A CPU node's onnxruntime
    session uses `threads` threads (0: the usable cores), and as many CPU nodes run at
    once as the usable cores hold that many (cores // threads, at least 1), so that CPU
    nodes together never ask for more threads than the cores. (Each took all the cores,
    and as many ran at once as there are cores: N^2 threads on N cores.) The default, one
    CPU node at a time on every core; `threads` 1: one per core, each on one thread.
    Entered around a CPU node's run (it waits for a place)."""

    def __init__(self, threads: int = 0) -> None:
        cores = usable_cpus()
        self.threads = threads if threads > 0 else cores
        self.width = max(1, cores // self.threads)  # CPU nodes at once
        self._places = threading.BoundedSemaphore(self.width)

    def __enter__(self) -> None:
        self._places.acquire()

    def __exit__(self, *exc: object) -> None:
        self._places.release()


def compile_host_stage(node: str, stage: Stage, threads: int) -> HostFn:
    """Prepare the CPU node's stage once (an ONNX sub-model on `threads` threads); return
    what runs it."""
    if is_ort_stage(stage):
        return _ort_stage(node, stage, threads)
    return _kernel_stage(node, stage)


def _ort_stage(node: str, stage: Stage, threads: int) -> HostFn:
    (instr,) = stage.instructions
    model = stage.weights.get(ORT_MODEL)
    if model is None or instr.inputs[-1:] != (ORT_MODEL,):
        raise NeffInvalid(f"CPU node '{node}': its {ORT_OP} instruction names no '{ORT_MODEL}'")
    try:
        # Its pool spins only while busy: the NC kernels that follow need those cores;
        # its errors come back as InferError, not on stderr.
        session = onnxrt.session(
            model.tobytes(),
            threads=threads,
            spinning=onnxrt.WHILE_BUSY,
            log_severity=onnxrt.LOG_SILENT,
        )
    except Exception as exc:  # onnxruntime raises its own exception types
        raise NeffInvalid(f"CPU node '{node}': onnxruntime refuses its sub-model: {exc}") from None
    names = instr.inputs[:-1]
    wanted = list(instr.outputs)

    def run(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        feeds = {name: np.asarray(inputs[name]) for name in names}
        try:
            results = session.run(wanted, feeds)
        except Exception as exc:
            raise InferError(f"CPU node '{node}' (onnxruntime): {exc}") from None
        for name, value in zip(wanted, results, strict=True):
            _store(node, name, value, outputs[name])

    return run


def _store(node: str, name: str, value: np.ndarray, target: Any) -> None:
    if isinstance(target, DynamicBuffer):
        with driver_errors(f"CPU node '{node}'"):
            target.accept(value)
        return
    if target.shape != value.shape or target.dtype != value.dtype:
        raise InferError(
            f"CPU node '{node}': output '{name}' is {value.dtype} {value.shape}, "
            f"planned {target.dtype} {target.shape}"
        )
    np.copyto(target, value)


def _kernel_stage(node: str, stage: Stage) -> HostFn:
    return host_program(f"CPU node '{node}'", stage)
