"""CPU nodes: the parts of a NEFF that run on the host, not on a NeuronCore.

A CPU node compiled from ONNX holds one `OnnxRuntime` instruction whose last input is the
weight `onnx_model`: the serialized ONNX sub-model of the ops the NC library lacks. The
host runs it with onnxruntime, the way the original runtime left unsupported ops to the
framework. A hand-built CPU node (instructions of NC ops) runs with the NC kernels on the
host instead. Either runs in the inference's own thread and counts nothing on a device.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import driver_sim
from neuron_rtd.errors import InferError, NeffInvalid
from neuron_rtd.neff import Stage
from neuron_rtd.runtime.driver import driver_errors

HostFn = Callable[[Mapping[str, Any], Mapping[str, Any]], None]

ORT_OP = "OnnxRuntime"
ORT_MODEL = "onnx_model"  # the weight holding the serialized ONNX sub-model


def host_threads() -> int:
    """Threads onnxruntime may use for one CPU node (NEURON_RTD_HOST_THREADS, default:
    the CPUs of this machine)."""
    value = os.environ.get("NEURON_RTD_HOST_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else (os.cpu_count() or 1)


def is_ort_stage(stage: Stage) -> bool:
    return len(stage.instructions) == 1 and stage.instructions[0].op == ORT_OP


def compile_host_stage(node: str, stage: Stage) -> HostFn:
    """Prepare the CPU node's stage once; return what runs it."""
    if is_ort_stage(stage):
        return _ort_stage(node, stage)
    return _kernel_stage(node, stage)


def _ort_stage(node: str, stage: Stage) -> HostFn:
    import onnxruntime as ort

    (instr,) = stage.instructions
    model = stage.weights.get(ORT_MODEL)
    if model is None or instr.inputs[-1:] != (ORT_MODEL,):
        raise NeffInvalid(f"CPU node '{node}': its {ORT_OP} instruction names no '{ORT_MODEL}'")
    options = ort.SessionOptions()
    options.intra_op_num_threads = host_threads()
    options.inter_op_num_threads = 1
    # Its pool must not spin after a run: the NC kernels that follow need those cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 4  # its errors come back as InferError, not on stderr
    try:
        session = ort.InferenceSession(
            model.tobytes(), sess_options=options, providers=["CPUExecutionProvider"]
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
    if isinstance(target, driver_sim.DynamicBuffer):
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
    program = driver_sim.NcProgram(
        instructions=[
            driver_sim.Instr(i.op, tuple(i.inputs), tuple(i.outputs), i.attrs)
            for i in stage.instructions
        ],
        weights=dict(stage.weights),
        inputs=list(stage.inputs),
        outputs=list(stage.outputs),
    )
    owner = f"host (CPU node '{node}')"
    with driver_errors(f"CPU node '{node}'"):
        loaded = driver_sim.load_program(owner, program)

    def run(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        driver_sim.execute_program(loaded, inputs, outputs)

    return run
